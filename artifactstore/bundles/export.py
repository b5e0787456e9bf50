"""`artstore export`: chosen entries of a namespace into one bundle file.

Entries are chosen from the index (in SQL where it can say it), each object is read
from the object store and verified as a load verifies it (`ReadPath.verify`: digest,
envelope, fingerprint, entry key, sizes, signature where trusted keys are set), and
written to the bundle as stored: never re-encoded, so a signature stays its
writer's. One object that fails verification refuses the whole bundle: the file is
written under a temporary name and only renamed into place once complete.
"""

from __future__ import annotations

import fnmatch
import io
import os
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import zstandard

from artifactstore.errors import OverLimit, one_line
from artifactstore.formats import codec
from artifactstore.formats.bundle import (
    MANIFEST,
    BundleError,
    BundleManifest,
    Record,
    object_member,
)
from artifactstore.formats.fingerprint import Fingerprint
from artifactstore.index.repo import EntryInfo, Filters
from artifactstore.named import keys as named_keys
from artifactstore.store import Store, StoreParts
from artifactstore.store.verify import Refusal

ZSTD_LEVEL = 3  # objects are compressed already: the tar headers are what shrinks


@dataclass(frozen=True)
class Selection:
    """Which entries to export. Each kind of selector given must match (`--name` and
    `--module` may be repeated: any one of them); `everything` takes all."""

    names: tuple[str, ...] = ()  # globs over named executables' names (NAME or NAME@VERSION)
    modules: tuple[str, ...] = ()  # globs over module names
    fingerprint: str | None = None  # a fingerprint digest or a prefix of one
    everything: bool = False

    @property
    def empty(self) -> bool:
        return not (self.names or self.modules or self.fingerprint or self.everything)

    def filters(self) -> Filters:
        """What the index can select in SQL; `accepts` says the rest."""
        prefix = named_keys.MODULE_PREFIX if self.names and not self.modules else None
        glob = self.modules[0] if len(self.modules) == 1 and not self.names else None
        return Filters(
            module_prefix=prefix, module_glob=glob, fingerprint_prefix=self.fingerprint or None
        )

    def accepts(self, entry: EntryInfo) -> bool:
        if self.names and not any(
            named_keys.matches(entry.module_name, *named_keys.parse_ref(ref)) for ref in self.names
        ):
            return False
        return not self.modules or any(
            fnmatch.fnmatchcase(entry.module_name, glob) for glob in self.modules
        )


@dataclass
class ExportReport:
    """What one export wrote; `to_json` for `--json`."""

    path: str
    namespace: str
    entries: int = 0
    objects: int = 0
    bytes: int = 0  # the objects' bytes
    file_bytes: int = 0  # the bundle's
    keys: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def select(parts: StoreParts, selection: Selection) -> Iterator[EntryInfo]:
    """The namespace's entries `selection` chooses, from the index only."""
    for entry in parts.index.iter_entries(selection.filters()):
        if selection.accepts(entry):
            yield entry


def export_bundle(
    store: Store,
    path: Path,
    selection: Selection,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> ExportReport:
    """Write the entries `selection` chooses to the bundle `path` (replaced only once the
    new one is complete). `progress(done, total)` after each entry. BundleError (one
    line, naming the entry) if an object is missing or fails verification, or if
    nothing matches."""
    if selection.empty:
        raise BundleError("say what to export: --name, --module, --fingerprint or --all")
    entries = list(select(store.parts, selection))  # rows only: a few hundred bytes each
    if not entries:
        raise BundleError(f"no entry of namespace {store.parts.namespace!r} matches the selection")
    path = Path(path)
    report = ExportReport(path=str(path), namespace=store.parts.namespace)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as raw:
            compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
            with (
                compressor.stream_writer(raw, closefd=False) as zfile,
                tarfile.open(fileobj=zfile, mode="w|", format=tarfile.PAX_FORMAT) as tar,
            ):
                records = _write_objects(store, tar, entries, report, progress)
                manifest = BundleManifest(
                    created=datetime.now(UTC).isoformat(timespec="seconds"),
                    artifactstore=_version(),
                    namespace=store.parts.namespace,
                    records=records,
                ).encode()
                tar.addfile(_member(MANIFEST, len(manifest)), io.BytesIO(manifest))
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    report.file_bytes = path.stat().st_size
    return report


def _write_objects(
    store: Store,
    tar: tarfile.TarFile,
    entries: list[EntryInfo],
    report: ExportReport,
    progress: Callable[[int, int], None] | None,
) -> list[Record]:
    """Each entry's object, read and verified, into `tar` (once per digest); the
    records of the manifest, from the verified objects themselves."""
    records: list[Record] = []
    written: set[str] = set()
    for done, entry in enumerate(entries, 1):
        short = entry.key[:12]
        try:
            data = store.parts.reads.fetch_object(entry)
        except OverLimit as exc:
            raise BundleError(f"entry {short} not exported: {one_line(exc)}") from None
        if data is None:
            raise BundleError(f"entry {short}: its object {entry.digest[:12]} is missing")
        checked = store.parts.reads.verify(entry, data, entry.fingerprint)
        if isinstance(checked, Refusal):
            raise BundleError(f"entry {short} not exported: {one_line(checked.error)}")
        meta = codec.read_meta(data)
        if meta is None:
            raise BundleError(
                f"entry {short} not exported: its object predates entry metadata "
                "(stored by artifactstore 0.1); compile it again to store it anew"
            )
        try:
            facts = Fingerprint.from_dict(meta.fingerprint).digest
        except (TypeError, ValueError):
            facts = None
        if facts != entry.fingerprint:
            raise BundleError(
                f"entry {short} not exported: its object's fingerprint facts do not "
                f"have its fingerprint digest {entry.fingerprint[:12]}"
            )
        signature = codec.read_signature(data)
        records.append(
            Record(
                key=entry.key,
                namespace=store.parts.namespace,
                module_name=entry.module_name,
                fingerprint=meta.fingerprint,
                fingerprint_digest=entry.fingerprint,
                digest=entry.digest,
                size=len(data),
                raw_size=entry.raw_size,
                compile_secs=float(entry.compile_secs),
                callbacks=meta.callbacks,
                producer_host=entry.producer_host,
                signer=signature.signer if signature is not None else None,
                signature=signature.b64 if signature is not None else None,
            )
        )
        report.entries += 1
        report.keys.append(entry.key)
        if entry.digest not in written:
            tar.addfile(_member(object_member(entry.digest), len(data)), io.BytesIO(data))
            written.add(entry.digest)
            report.objects += 1
            report.bytes += len(data)
        if progress is not None:
            progress(done, len(entries))
    return records


def _version() -> str:
    try:
        return metadata.version("artifactstore")
    except metadata.PackageNotFoundError:
        return "unknown"


def _member(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = 0o644
    info.mtime = int(time.time())
    info.type = tarfile.REGTYPE
    return info
