"""`artstore import`: a bundle's entries into this store, all of them or none.

Two passes, so that a bundle with any problem leaves the store as it was:

1. **Verify.** The bundle is streamed (zstd, then tar: never held whole); each member
   must be a plain file with a name the exporter writes (`objects/<sha256>` once, or
   `manifest.json`); objects are spooled to a private temporary directory (0700),
   hashed on the way. Then the manifest is parsed in full, every listed object must
   be there and nothing else, and each object is checked against its record: size,
   and `ReadPath.verify` as a load checks it (digest, envelope, fingerprint, entry key,
   callback count, sizes, and the signature where ARTSTORE_TRUSTED_KEYS is set).
2. **Store.** Entries the store holds already are counted and skipped; the others go
   through `Store.put`, the write path of every put (object, index row,
   manifest, tier), byte for byte as exported.

The first problem refuses the whole bundle with one line naming the member or entry.
What the first pass may unpack (entries, each member, the whole, the manifest) is
bounded from headers before decompressing and again while streaming (`bounds`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any, cast

import zstandard

from artifactstore import interrupts
from artifactstore.bundles.bounds import MAX_WINDOW, OBJECT_HOW, Limits, Unpacked, header_class
from artifactstore.errors import ReadOnlyError, one_line
from artifactstore.formats import codec
from artifactstore.formats.bundle import (
    MANIFEST,
    BundleError,
    BundleManifest,
    Record,
    member_digest,
    parse_manifest,
)
from artifactstore.formats.sizes import format_limit
from artifactstore.store import Store
from artifactstore.store.verify import Refusal

CHUNK = 1024 * 1024
# Progress callbacks: (phase, bytes or entries done since the last call, total or None).
Progress = Callable[[str, int, int | None], None]


@dataclass
class ImportReport:
    """What one import did; `to_json` for `--json`."""

    path: str
    namespace: str  # the store's (the target)
    source_namespace: str = ""
    entries: int = 0  # listed in the bundle
    imported: int = 0
    skipped: int = 0  # present in the store already
    bytes: int = 0  # the imported objects' bytes

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def import_bundle(
    store: Store,
    path: Path,
    *,
    progress: Progress | None = None,
    max_entries: int | None = None,
    max_bytes: int | None = None,
) -> ImportReport:
    """Verify the bundle at `path` in full, then store its entries; BundleError (one
    line) for the first problem, before anything is written. `max_entries` and
    `max_bytes` override the settings' bundle limits (`bounds`)."""
    if store.parts.read_only:
        raise ReadOnlyError(
            "this store is read-only (ARTSTORE_READ_ONLY): import needs a writer's settings"
        )
    store.parts.writes.require_writable_index()
    path = Path(path)
    if not path.is_file():
        raise BundleError(f"no bundle at {path}: not a file")
    report = ImportReport(path=str(path), namespace=store.parts.namespace)
    limits = Limits.of(
        store.parts.settings, path.stat().st_size, max_entries=max_entries, max_bytes=max_bytes
    )
    spool = Path(tempfile.mkdtemp(prefix="artstore-import-"))  # 0700, this user's
    try:
        os.chmod(spool, 0o700)
        manifest = _spool(path, spool, limits, progress)
        report.source_namespace = manifest.namespace
        report.entries = len(manifest.records)
        for record in manifest.records:
            _verify(store, record, spool)
            if progress is not None:
                progress("verifying", 1, len(manifest.records))
        for record in manifest.records:
            with interrupts.held():  # an interrupt lands between entries, never inside one
                _store(store, record, spool, report)
            if progress is not None:
                progress("importing", 1, len(manifest.records))
    finally:
        shutil.rmtree(spool, ignore_errors=True)
    return report


def _spool(path: Path, spool: Path, limits: Limits, progress: Progress | None) -> BundleManifest:
    """Stream the bundle: objects into `spool` (their sha256 checked against their
    names), the manifest into memory, every header checked against `limits` before
    its data is decompressed; then the manifest parsed and checked against the
    members."""
    seen: set[str] = set()
    manifest: bytes | None = None
    total = path.stat().st_size
    try:
        with path.open("rb") as raw:
            counted = _Counting(raw, lambda n: progress and progress("reading bundle", n, total))
            reader = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW).stream_reader(
                cast(IO[bytes], counted), closefd=False
            )
            unpacked = Unpacked(reader, limits)
            with tarfile.open(
                fileobj=cast(IO[bytes], unpacked), mode="r|", tarinfo=header_class()
            ) as tar:
                for index, member in enumerate(tar, 1):
                    name = member.name
                    shown = repr(name[:80])
                    if member.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):
                        raise BundleError(f"member {shown} is not a plain file: refused")
                    limits.check_member(member, index, unpacked.count)
                    if name in seen:
                        raise BundleError(f"member {shown} appears twice")
                    seen.add(name)
                    source = tar.extractfile(member)
                    assert source is not None  # a plain file
                    if name == MANIFEST:
                        manifest = source.read(member.size)
                        continue
                    digest = member_digest(name)
                    if digest is None:
                        raise BundleError(
                            f"member {shown} is not one an artifactstore bundle has: refused"
                        )
                    actual = _copy(source, spool / digest, limits)
                    if actual != digest:
                        raise BundleError(
                            f"member {shown} has digest {actual[:12]}: damaged or altered"
                        )
    except (tarfile.TarError, zstandard.ZstdError, EOFError) as exc:
        raise BundleError(
            f"{path} is not a readable artifactstore bundle (zstd-compressed tar): {one_line(exc)}"
        ) from None
    if manifest is None:
        raise BundleError(f"{path} has no {MANIFEST}: not an artifactstore bundle")
    limits.check_manifest(manifest)
    parsed = parse_manifest(manifest)
    if len(parsed.records) > limits.max_entries:
        raise limits.too_many()
    listed = {record.digest for record in parsed.records}
    for record in parsed.records:
        if not (spool / record.digest).is_file():
            raise BundleError(f"entry {record.key[:12]}: member objects/{record.digest} is missing")
    for name in sorted(seen - {MANIFEST}):
        if member_digest(name) not in listed:
            raise BundleError(f"member {name[:80]!r} is not listed in {MANIFEST}: refused")
    return parsed


def _copy(source: IO[bytes], target: Path, limits: Limits) -> str:
    """Copy `source` to a new file `target` (this user's only), in chunks and within
    the object size limit whatever its header said; its sha256."""
    digest = hashlib.sha256()
    written = 0
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as out:
        while chunk := source.read(CHUNK):
            written += len(chunk)
            if written > limits.max_object_bytes:
                raise BundleError(
                    f"bundle refused: member {target.name[:12]} is over the object size "
                    f"limit {format_limit(limits.max_object_bytes)} ({OBJECT_HOW})"
                )
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest()


def _verify(store: Store, record: Record, spool: Path) -> None:
    """One entry's object checked against its record as a load checks it."""
    short = record.key[:12]
    data = (spool / record.digest).read_bytes()
    if len(data) != record.size:
        raise BundleError(
            f"entry {short}: its object is {len(data)} bytes, listed as {record.size}"
        )
    manifest = record.manifest()
    checked = store.parts.reads.verify(
        manifest, data, record.fingerprint_digest, callbacks=record.callbacks
    )
    if isinstance(checked, Refusal) and checked.reason == "unsigned":
        raise BundleError(  # trusted keys here: the next step is the exporter's
            f"entry {short} refused: {one_line(checked.error)}, and this store trusts only signed "
            "entries (ARTSTORE_TRUSTED_KEYS): where the bundle was exported, sign its "
            "entries with a key trusted here (`artstore sign --adopt-unsigned`, with "
            "ARTSTORE_SIGNING_KEY and ARTSTORE_TRUSTED_KEYS set), then `artstore export` again"
        )
    if isinstance(checked, Refusal):
        raise BundleError(f"entry {short} refused: {one_line(checked.error)}")
    meta = codec.read_meta(data)
    if meta is None:
        raise BundleError(f"entry {short}: its object carries no entry metadata")
    if meta.module_name != record.module_name[:255] or meta.fingerprint != record.fingerprint:
        raise BundleError(f"entry {short}: its record does not match its object's metadata")
    signature = codec.read_signature(data)
    signer = (signature.signer, signature.b64) if signature is not None else (None, None)
    if signer != (record.signer, record.signature):
        raise BundleError(f"entry {short}: its record names another signature than its object's")


def _store(store: Store, record: Record, spool: Path, report: ImportReport) -> None:
    if store.parts.index.lookup(record.key) is not None:
        report.skipped += 1
        return
    data = (spool / record.digest).read_bytes()
    if store.put(record.put(data)):
        report.imported += 1
        report.bytes += len(data)
    else:  # stored by someone else since the check
        report.skipped += 1


class _Counting:
    """A file read through, telling `seen` how many bytes each read took."""

    def __init__(self, raw: IO[bytes], seen: Callable[[int], object]) -> None:
        self.raw = raw
        self.seen = seen

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        self.seen(len(data))
        return data
