"""Cross-check the blob store against the index, one digest prefix at a time.

Both `artstore verify` (reports) and `artstore gc` (fixes, in `remove_orphans`)
walk the object listing in chunks of one two-hex-digit prefix (the blob stores'
own layout: `objects/ab/ab...`) and compare each chunk with the digests the
index references in the same range, so memory holds one chunk (about 1/256 of
the store), never the whole listing or index.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Engine

from artifactstore.blobstores.base import BlobInfo, BlobStore
from artifactstore.errors import ArtstoreError, CorruptObject
from artifactstore.gc import rebuild
from artifactstore.gc.report import Removal
from artifactstore.gc.run import GcRun
from artifactstore.index.eviction import EvictionIndex
from artifactstore.index.identity import entry_count, newest_digests

_HEX = set("0123456789abcdef")
PREFIXES = [f"{i:02x}" for i in range(256)]
# Without --allow-missing, gc drops at most this share of a namespace's entries (and
# always up to MISSING_FEW) as "lost their object"; more refuses, nothing dropped.
MISSING_SHARE, MISSING_FEW = 0.10, 3
SAMPLE = 64  # newest entries checked before gc changes anything


def missing_limit(entries: int) -> int:
    """The most entries whose object is gone that gc drops without --allow-missing."""
    return max(MISSING_FEW, int(entries * MISSING_SHARE))


def _too_many(run: GcRun, what: str) -> ArtstoreError:
    return ArtstoreError(
        f"gc refused: {what} of namespace {run.parts.namespace} have no object in "
        f"{run.parts.blobs.describe()} (more than {MISSING_SHARE:.0%}), so nothing was "
        "dropped: check ARTSTORE_URL and the namespace (`artstore doctor`), or pass "
        "--allow-missing to drop the entries whose objects are gone"
    )


def check_missing(run: GcRun) -> None:
    """Before gc changes anything: refuse if the newest entries' objects are gone in a
    share that reconciling would refuse anyway (the walk counts exactly, later)."""
    if run.policy.allow_missing or not run.policy.reconcile:
        return
    digests = newest_digests(run.parts.engine, run.parts.namespace, SAMPLE)
    missing = sum(1 for d in digests if not run.parts.blobs.exists(d))
    if missing > missing_limit(len(digests)):
        raise _too_many(run, f"{missing} of the {len(digests)} newest entries")


@dataclass(frozen=True)
class Chunk:
    prefix: str
    blobs: list[BlobInfo]  # what the blob store holds under this prefix
    referenced: set[str]  # digests under this prefix that entries point at

    def unreferenced(self) -> list[BlobInfo]:
        return [b for b in self.blobs if b.digest not in self.referenced]

    def unlisted(self) -> list[str]:
        """Referenced digests the listing did not show (re-check before acting: a put
        may have finished after the listing passed)."""
        listed = {b.digest for b in self.blobs}
        return sorted(d for d in self.referenced if d not in listed)


def chunks(blobs: BlobStore, index: EvictionIndex) -> Iterator[Chunk]:
    """One Chunk per prefix 00..ff; the listing must come grouped by prefix in order."""
    listing = (b for b in blobs.iter_blobs() if len(b.digest) == 64 and set(b.digest) <= _HEX)
    pending = next(listing, None)
    for i, prefix in enumerate(PREFIXES):
        found: list[BlobInfo] = []
        while pending is not None and pending.digest[:2] <= prefix:
            if pending.digest[:2] < prefix:
                raise ArtstoreError(
                    f"object listing of {blobs.describe()} is not ordered by digest prefix "
                    f"({pending.digest[:12]} after prefix {prefix}): cannot cross-check safely"
                )
            found.append(pending)
            pending = next(listing, None)
        high = PREFIXES[i + 1] if i + 1 < len(PREFIXES) else None
        yield Chunk(prefix, found, index.referenced_between(prefix, high))


def orphaned(blobs: BlobStore, engine: Engine, namespace: str) -> tuple[int, int]:
    """(entries of the index's `namespace` whose object `blobs` lacks, objects in `blobs`
    no entry of it references): what binding the two as one store leaves to gc to delete
    (`artstore db bind`)."""
    lost = unreferenced = 0
    for chunk in chunks(blobs, EvictionIndex(engine, namespace)):
        lost += len(chunk.unlisted())
        unreferenced += len(chunk.unreferenced())
    return lost, unreferenced


def _restored(run: GcRun, blob: BlobInfo) -> bool:
    """An orphan that carries an entry the index lacks (a lost row, an index restored
    from an older backup) becomes that entry again instead of being deleted."""
    try:
        found = rebuild.recover(run.parts.blobs, blob.digest)
    except CorruptObject:
        return False  # deleted as an orphan like any other unreadable blob
    if found is None or run.parts.index.lookup(found.entry.key) is not None:
        return False
    if not run.policy.dry_run:
        run.parts.index.add_entry(found.entry, found.fingerprint_json)
    run.report.entries_restored += 1
    return True


def remove_orphans(run: GcRun) -> None:
    """gc's last phase: delete blobs that neither an entry nor an object row knows,
    once older than the grace period, and drop entries whose object is gone."""
    ix, blobs, dry_run = run.ix, run.parts.blobs, run.policy.dry_run
    cutoff = run.grace_cutoff.timestamp()
    # Entries whose object is gone are held back until the walk has counted them, so
    # that too many of them refuse with none dropped (see MISSING_SHARE).
    limit, total = None, 0
    if not run.policy.allow_missing:
        total = entry_count(run.parts.engine, run.parts.namespace)
        limit = missing_limit(total)
    held: list[str] = []
    for chunk in chunks(blobs, ix):
        orphans = [b for b in chunk.unreferenced() if b.mtime < cutoff]
        rows = ix.object_rows([b.digest for b in orphans])
        # Blobs with an object row were handled (or protected) by the object sweep.
        rowless = [b for b in orphans if b.digest not in rows and not _restored(run, b)]
        while rowless:
            n = run.object_batch.size
            part, rowless = rowless[:n], rowless[n:]
            if dry_run:
                gone = [(b.digest, b.size) for b in part]
            else:
                ix.adopt_objects(
                    [(b.digest, b.size, datetime.fromtimestamp(b.mtime, UTC)) for b in part]
                )
                gone = run.object_batch.run(
                    ix.delete_objects,
                    [b.digest for b in part],
                    run.grace_cutoff,
                    blobs.delete_many,
                )
            for digest, size in gone:
                run.removed(Removal("object", digest, size, "orphan"))
        missing = [d for d in chunk.unlisted() if not blobs.exists(d)]
        if missing and limit is not None:
            held += missing
            if len(held) > limit:
                raise _too_many(run, f"at least {len(held)} of the {total} entries")
        elif missing:
            _drop_missing(run, missing)
        run.progress("reconcile", 1, len(PREFIXES))
        run.keep_lease()
    if held:
        _drop_missing(run, held)


def _drop_missing(run: GcRun, missing: list[str]) -> None:
    """Drop (or, dry, list) the entries of the objects `missing` (gone from the store)."""
    ix = run.ix
    if run.policy.dry_run:
        dropped = ix.keys_for_digests(missing, run.gone)
    else:
        dropped = ix.drop_dangling(missing)
    for key, size in dropped:
        run.removed(Removal("entry", key, size, "missing-object"))
    if not run.policy.dry_run:
        run.withdraw([key for key, _ in dropped])
