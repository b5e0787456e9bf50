"""The index recovered from the objects: `artstore db check`, `db rebuild`, and gc's guard.

Objects written since 0.2 carry the entry they were stored for (`codec.ObjectMeta`),
so a lost or corrupt index costs hit statistics, not the store: every such object
can be turned back into its entry. `rebuild` reads the published manifests first:
where several objects carry the same key (a re-signed entry's old object, a writer
that lost a race, both kept for gc's grace period), the manifest says which one the
entry is, so the rebuilt row is the one readers were following, not whichever
object the listing reached first. gc, the one destructive command, refuses to
run on an index that fails the check (a fresh, empty index over a full object
store would make every object look orphaned), and turns orphans that carry an
entry the index lacks back into entries instead of deleting them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from artifactstore.blobstores.base import BlobStore
from artifactstore.config import Settings
from artifactstore.errors import CorruptObject, IndexDamaged
from artifactstore.formats import codec
from artifactstore.formats.fingerprint import Fingerprint
from artifactstore.formats.manifest import Manifest
from artifactstore.formats.put import Put
from artifactstore.gc.report import PhaseProgress
from artifactstore.index import health
from artifactstore.index.diagnosis import sqlite_path
from artifactstore.index.repo import NewEntry
from artifactstore.store import Store, StoreParts, identity
from artifactstore.store.backends import unchecked_index


@dataclass(frozen=True)
class Recovered:
    entry: NewEntry
    fingerprint_json: str


def recover(blobs: BlobStore, digest: str) -> Recovered | None:
    """The entry object `digest` was stored for; None if it predates metadata or is gone.

    Raises `CorruptObject` for bytes that fail their digest, envelope or metadata.
    """
    data = blobs.get(digest)
    return None if data is None else recover_bytes(data, digest)


def recover_bytes(data: bytes, digest: str) -> Recovered | None:
    """`recover` on an object already read (`data`, stored as `digest`)."""
    if codec.digest_of(data) != digest:
        raise CorruptObject(f"object {digest[:12]} does not match its digest")
    fp_digest = codec.envelope_fingerprint(data)
    if fp_digest is None:
        raise CorruptObject(f"object {digest[:12]} has no artifactstore envelope")
    meta = codec.read_meta(data)
    if meta is None:
        return None
    try:
        fp = Fingerprint.from_dict(meta.fingerprint)
    except TypeError as exc:
        raise CorruptObject(
            f"object {digest[:12]} names an unreadable fingerprint: {exc}"
        ) from None
    if fp.digest != fp_digest:
        raise CorruptObject(f"object {digest[:12]}: metadata and envelope name other platforms")
    # Carried over as recorded (readers verify the object's frame, not this column).
    sig = codec.read_signature(data)
    signer, signature = (None, None) if sig is None else (sig.signer, sig.b64)
    encoded = codec.Encoded(data, digest, meta.raw_size, signer, signature)
    # The put the object was stored for; its fingerprint's digest is the envelope's (above).
    put = Put(
        meta.key,
        encoded,
        fp,
        meta.module_name,
        meta.compile_secs,
        meta.callbacks,
        meta.producer_host,
    )
    return Recovered(NewEntry.of(put, encoded), fp.to_json())


@dataclass
class RebuildReport:
    objects: int = 0
    present: int = 0  # already referenced by an entry
    restored: list[str] = field(default_factory=list)  # keys
    from_manifests: int = 0  # of `restored`: the entry its published manifest names
    superseded: int = 0  # carries a key that another object now serves
    without_metadata: int = 0  # written before 0.2: cannot be recovered
    corrupt: list[str] = field(default_factory=list)
    manifests: int = 0
    # Manifests not followed (damaged, naming an object that is gone, damaged or stored
    # for another key): left for `artstore verify --repair`, which withdraws or
    # republishes them once the rows are back.
    manifests_unused: int = 0

    @property
    def from_objects(self) -> int:
        return len(self.restored) - self.from_manifests

    def to_json(self) -> dict[str, object]:
        return {
            "objects": self.objects,
            "present": self.present,
            "restored": len(self.restored),
            "from_manifests": self.from_manifests,
            "from_objects": self.from_objects,
            "superseded": self.superseded,
            "without_metadata": self.without_metadata,
            "corrupt": self.corrupt,
            "manifests": self.manifests,
            "manifests_unused": self.manifests_unused,
        }


def rebuild(store: Store, *, progress: PhaseProgress | None = None) -> RebuildReport:
    """Give every entry the index lacks its row back: first those a published manifest
    names (its object read and checked as `recover` does, and bound to the manifest's
    key), then those of every other object that carries one. `progress`: phases
    "manifests" and "objects", one per item read (how many is not known ahead)."""
    report = RebuildReport()
    try:
        _from_manifests(store.parts, report, progress)
        _from_objects(store.parts, report, progress)
    finally:  # also when interrupted part way
        if report.restored:
            store.parts.entries_removed()  # the tier's key map may predate the rebuild
    return report


def _from_objects(parts: StoreParts, report: RebuildReport, progress: PhaseProgress | None) -> None:
    """Restore the rows of entries that only an object still carries."""
    for info in parts.blobs.iter_blobs():
        report.objects += 1
        if parts.index.keys_for_digest(info.digest):
            report.present += 1
        else:
            try:
                found = recover(parts.blobs, info.digest)
            except CorruptObject:
                report.corrupt.append(info.digest)
                found = None
            if found is None:
                report.without_metadata += info.digest not in report.corrupt
            elif parts.index.add_entry(found.entry, found.fingerprint_json):
                report.restored.append(found.entry.key)
            else:
                report.superseded += 1
        if progress is not None:
            progress("objects", 1, None)


def _from_manifests(
    parts: StoreParts, report: RebuildReport, progress: PhaseProgress | None
) -> None:
    """Restore the rows of entries whose manifest is published and whose object verifies."""
    for key in parts.blobs.iter_manifest_keys():
        report.manifests += 1
        if progress is not None:
            progress("manifests", 1, None)
        if parts.index.lookup(key) is not None:
            continue
        found = _follow(parts, key)
        if found is None:
            report.manifests_unused += 1
        elif parts.index.add_entry(found.entry, found.fingerprint_json):
            report.restored.append(key)
            report.from_manifests += 1


def _follow(parts: StoreParts, key: str) -> Recovered | None:
    """The entry `key`'s manifest names, if its object exists, is intact and is `key`'s."""
    data = parts.blobs.get_manifest(key)
    try:
        manifest = None if data is None else Manifest.decode(data, key)
        found = None if manifest is None else recover(parts.blobs, manifest.digest)
    except CorruptObject:  # the object pass counts a corrupt object once, as corrupt
        return None
    if found is None or manifest is None:
        return None
    if found.entry.key != key or found.entry.fingerprint != manifest.fingerprint:
        return None  # a stale or forged manifest: another entry's object
    return found


def index_problem(parts: StoreParts) -> str | None:
    """Why gc must not trust this index, naming the fix; None when it may.

    Checks the database's own integrity and that an index with no entries is not
    sitting over an object store that has some (a lost or replaced index).
    """
    problem = health.integrity_problem(parts.engine)
    if problem is not None:
        return str(problem)  # its own fix: `db rebuild` only for a corrupt file
    stats = parts.index.stats()
    # Entries evicted by gc leave object rows until their objects go; a lost index has neither.
    if stats.entries == 0 and stats.objects == 0 and _holds_lost_entries(parts):
        return (
            "the index is empty but the object store holds objects that are entries: "
            "the index was lost or replaced; run `artstore db rebuild`"
        )
    return None


# A writer uploads an object, then commits its row: an object this young with no row may be
# a put in flight (gc found it once beside writers on a store it had just emptied), so only
# older ones say that the index was lost.
IN_FLIGHT_SECS = 120.0


def _holds_lost_entries(parts: StoreParts, sample: int = 20) -> bool:
    """Whether any of the first `sample` objects older than a put in flight carries an
    entry the index lacks (objects that predate metadata, or a writer's orphan of an
    existing key, do not)."""
    young = time.time() - IN_FLIGHT_SECS
    old = (info for info in parts.blobs.iter_blobs() if info.mtime < young)
    for n, info in enumerate(old):
        if n >= sample:
            break
        try:
            found = recover(parts.blobs, info.digest)
        except CorruptObject:
            continue
        if found is not None and parts.index.lookup(found.entry.key) is None:
            return True
    return False


def require_sound_index(parts: StoreParts) -> None:
    problem = index_problem(parts)
    if problem is not None:
        raise IndexDamaged(f"refusing to gc: {problem}")


@dataclass
class CheckReport:
    index: str
    problems: list[str] = field(default_factory=list)
    entries: int | None = None
    binding: str | None = None  # the pair's store identity (store.identity): bound, ...

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, object]:
        fields = ("index", "entries", "binding", "problems")
        return {"ok": self.ok, **{name: getattr(self, name) for name in fields}}


def check(settings: Settings) -> CheckReport:
    """Is the index there, readable, at this version's schema, and the one the objects
    were stored with? Never creates or migrates anything."""
    from artifactstore.blobstores import open_blobstore
    from artifactstore.index import db
    from artifactstore.redact import redact

    report = CheckReport(redact(settings.index_url))
    path = sqlite_path(settings.index_url)
    if path is not None and not path.exists():
        if next(iter(open_blobstore(settings).iter_blobs()), None) is not None:
            report.problems.append(
                f"the index file {path} is missing but the object store holds objects: "
                "run `artstore db rebuild`"
            )
        return report
    engine = unchecked_index(settings)
    try:
        damage = health.integrity_problem(engine)
        if damage is not None:
            report.problems.append(str(damage))
            return report
        schema = db.schema_status(engine).problem()
        if schema is not None:
            report.problems.append(schema)
            return report
    finally:
        engine.dispose()
    store = Store.open(settings)
    try:
        _check_opened(store.parts, report, settings.index_url)
    finally:
        store.close()
    return report


def _check_opened(parts: StoreParts, report: CheckReport, index_url: str) -> None:
    """`check`'s part that needs the store open: the index's soundness and binding."""
    report.entries = parts.index.stats().entries
    problem = index_problem(parts)
    if problem is not None:
        report.problems.append(problem)
    # A sound index of another store (a mistyped bucket) is no index for this one.
    binding = identity.check(parts.blobs, parts.engine, parts.namespace, index_url)
    report.binding = binding.state
    if binding.state == identity.MISMATCH:
        report.problems.append(binding.refusal())
