"""Eviction: `artstore gc` as a small function over the index and the blob store.

Order of work, under a lease (`gc:NAMESPACE`) so that two gc runs never overlap:

1. fold read-only readers' accesses into entries, so LRU reflects the cluster;
2. drop entries built by jaxlib versions older than `jaxlib_older_than`;
3. walk entries least recently used first (keyset pages on (last_access, id)),
   dropping those unused for `older_than` and then as many as it takes for the
   namespace to fit its limit (`max_bytes`, or the namespace quota if smaller);
4. delete objects no entry references, once older than the grace period;
5. reconcile (one listing of the blob store): blobs with no row and no entry,
   older than the grace period, are deleted; entries whose object is gone
   are dropped.

The size of a namespace is the bytes of the distinct objects its entries
reference (entries sharing an object count it once). Index rows go first,
objects after, so a reader racing gc finds either a row and its object, or a
row and no object (a miss: Store.get returns None), or no row (a miss).

Why objects in flight survive: a writer PUTs the object before it commits the
entry. An uploaded blob is younger than the grace period (its mtime), and its
object row is created (or touched) only in the entry's own transaction, so
neither path deletes it while the put is in flight. The dangerous writer is the
one that found the object present and skipped the upload while gc deletes it:
`EvictionIndex.delete_objects` locks the object rows, re-checks references in a
later statement, then deletes; the writer's commit touches the same row, so it
is ordered before (gc sees the entry and keeps the object) or after (the writer
re-checks after commit, finds the blob gone and uploads it again: an entry
points at a missing object for at most that one operation). `grace_secs=0`
keeps that guarantee but lets gc delete a blob whose writer has not committed
yet; the writer's re-check then restores it.

Dry runs take the same decisions without deleting: they report exactly the
set a real run would remove, unless the store changes in between.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from artifactstore import reconcile
from artifactstore.errors import ConfigError
from artifactstore.index.eviction import Candidate, Deleted, EvictionIndex, get_quota
from artifactstore.index.lease import Lease
from artifactstore.store import Store

DEFAULT_GRACE_SECS = 3600.0
READ_BATCH = 5000  # entries read per query
# Entries deleted per transaction: an eighth of the namespace, within these
# bounds. Victims are scattered over the tables (by last access), so every
# transaction rewrites most index pages on SQLite: a few large transactions
# cost far less than many small ones. The queue holds ids only (8 bytes each).
DELETE_BATCH_MIN, DELETE_BATCH_MAX = 20_000, 250_000
# Objects locked per transaction while their blobs are deleted: adapted so that
# one transaction takes about OBJECT_TX_SECS whatever the blob store's latency.
OBJECT_BATCH_MIN, OBJECT_BATCH_MAX, OBJECT_TX_SECS = 50, 25_000, 1.0  # max < MAX_PARAMS


@dataclass(frozen=True)
class Policy:
    max_bytes: int | None = None
    older_than_secs: float | None = None
    jaxlib_older_than: str | None = None
    grace_secs: float = DEFAULT_GRACE_SECS
    reconcile: bool = True
    dry_run: bool = False


@dataclass(frozen=True)
class Removal:
    """One thing gc removes (or, in a dry run, would remove)."""

    kind: str  # "entry" | "object"
    name: str  # key or digest
    size: int
    reason: str  # jaxlib | older-than | size | unreferenced | orphan | missing-object
    module: str = ""

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"kind": self.kind, self._id_field(): self.name, "size": self.size}
        data["reason"] = self.reason
        if self.module:
            data["module"] = self.module
        return data

    def _id_field(self) -> str:
        return "key" if self.kind == "entry" else "digest"


@dataclass
class GcReport:
    namespace: str
    dry_run: bool
    limit_bytes: int | None
    bytes_before: int = 0
    bytes_after: int = 0
    accesses_folded: int = 0
    entries_removed: int = 0
    entry_bytes_removed: int = 0
    objects_removed: int = 0
    object_bytes_freed: int = 0
    dangling_entries: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


OnRemove = Callable[[Removal], None]
Progress = Callable[[str, int, int | None], None]  # phase, advance, total (None: unknown)


def effective_limit(store: Store, max_bytes: int | None) -> int | None:
    """The smaller of `max_bytes` and the namespace's quota (None: no size limit)."""
    quota = get_quota(store.engine, store.namespace)
    limits = [v for v in (max_bytes, quota) if v is not None]
    return min(limits) if limits else None


def old_jaxlib_versions(present: list[str], older_than: str) -> list[str]:
    """The versions in `present` strictly older than `older_than` (PEP 440 order);
    unparsable versions are kept, never guessed at."""
    from packaging.version import InvalidVersion, Version

    try:
        bound = Version(older_than)
    except InvalidVersion:
        raise ConfigError(
            f"invalid jaxlib version {older_than!r}: use a version such as 0.4.30"
        ) from None
    old = []
    for text in present:
        try:
            if Version(text) < bound:
                old.append(text)
        except InvalidVersion:
            continue
    return sorted(old)


class _Collector:
    """One gc run over one namespace: the phases above, sharing the accounting."""

    def __init__(
        self, store: Store, policy: Policy, on_remove: OnRemove | None, progress: Progress | None
    ) -> None:
        self.store = store
        self.policy = policy
        self.ix = EvictionIndex(store.engine, store.namespace)
        self.on_remove = on_remove or (lambda _r: None)
        self.progress = progress or (lambda _p, _n, _t: None)
        self.lease: Lease | None = None
        self.now = datetime.now(UTC)
        self.grace_cutoff = self.now - timedelta(seconds=policy.grace_secs)
        self.report = GcReport(store.namespace, policy.dry_run, None)
        self.remaining = 0
        # References that chosen but not yet deleted entries (the queue; in dry runs,
        # every victim) take from an object some other entry still shares.
        self.pending_refs: dict[str, int] = {}
        # Chosen, not yet deleted: ids only (8 bytes each), the newest access among them,
        # and how to tell a deleted row's reason (jaxlib pass, or by its last access).
        self.queue = array("q")
        self.queue_newest: datetime | None = None
        self.reason_of: Callable[[Deleted], str] = lambda _row: "size"
        self.delete_batch = DELETE_BATCH_MIN
        self.freed_dry: list[Candidate] = []  # dry runs: objects to report (< READ_BATCH)
        self.object_batch = OBJECT_BATCH_MIN

    def _removed(self, removal: Removal) -> None:
        self.report.reasons[removal.reason] = self.report.reasons.get(removal.reason, 0) + 1
        if removal.kind == "entry":
            self.report.entries_removed += 1
            self.report.entry_bytes_removed += removal.size
            if removal.reason == "missing-object":
                self.report.dangling_entries += 1
        else:
            self.report.objects_removed += 1
            self.report.object_bytes_freed += removal.size
        self.on_remove(removal)

    def _keep_lease(self) -> None:
        if self.lease is not None:
            self.lease.keep_alive()

    # -- entries ------------------------------------------------------------
    def _choose(self, cand: Candidate, reason: str, counts: dict[str, int]) -> None:
        """Queue one entry for deletion; account the object bytes it frees.

        `counts` are the index's reference counts (read before the queue is
        flushed); `pending_refs` holds what the queue has taken from them.
        """
        left = counts.get(cand.digest, 0) - self.pending_refs.get(cand.digest, 0) - 1
        freed = left <= 0
        if freed:
            self.pending_refs.pop(cand.digest, None)
            self.remaining -= cand.size
        else:
            self.pending_refs[cand.digest] = self.pending_refs.get(cand.digest, 0) + 1
        if self.policy.dry_run:
            self._removed(Removal("entry", cand.key, cand.size, reason, cand.module_name))
            if freed:
                self.freed_dry.append(cand)
            if len(self.freed_dry) >= READ_BATCH:
                self._report_freed_objects_dry()
            return
        self.queue.append(cand.id)
        if self.queue_newest is None or cand.last_access > self.queue_newest:
            self.queue_newest = cand.last_access
        if len(self.queue) >= self.delete_batch:
            self._flush()

    def _flush(self) -> None:
        """Delete the queued entries in one transaction, reporting what actually went."""
        if self.policy.dry_run:
            self._report_freed_objects_dry()
            return
        if not self.queue or self.queue_newest is None:
            return
        queue, self.queue = self.queue, array("q")
        newest, self.queue_newest = self.queue_newest, None

        def report(row: Deleted) -> None:
            self._removed(Removal("entry", row.key, row.size, self.reason_of(row), row.module_name))

        deleted = self.ix.delete_entries(queue, not_used_since=newest, on_deleted=report)
        self.pending_refs.clear()  # the index now reflects these deletions
        if deleted != len(queue):  # some were used meanwhile and kept: recount
            self.remaining = self.ix.referenced_bytes()
        self._keep_lease()

    def _report_freed_objects_dry(self) -> None:
        freed, self.freed_dry = self.freed_dry, []
        rows = self.ix.object_rows([c.digest for c in freed])
        for cand in freed:
            created = rows.get(cand.digest)
            if created is None or created < self.grace_cutoff:
                self._removed(Removal("object", cand.digest, cand.size, "unreferenced"))

    def drop_old_jaxlib(self) -> None:
        if not self.policy.jaxlib_older_than:
            return
        versions = old_jaxlib_versions(self.ix.jaxlib_versions(), self.policy.jaxlib_older_than)
        after = 0
        while versions:
            self.reason_of = lambda _row: "jaxlib"
            batch = self.ix.entries_with_jaxlib(versions, after, READ_BATCH)
            if not batch:
                break
            after = batch[-1].id
            counts = self.ix.reference_counts({c.digest for c in batch})
            for cand in batch:
                self._choose(cand, "jaxlib", counts)
            self.progress("jaxlib", len(batch), None)
            self._keep_lease()
        self._flush()

    def drop_lru(self, limit: int | None) -> None:
        older = (
            self.now - timedelta(seconds=self.policy.older_than_secs)
            if self.policy.older_than_secs is not None
            else None
        )
        if older is None and (limit is None or self.remaining <= limit):
            return
        total = self.remaining - limit if limit is not None and self.remaining > limit else None
        after: tuple[datetime, int] | None = None
        self.reason_of = lambda row: (
            "older-than" if older is not None and row.last_access < older else "size"
        )
        done = False
        while not done:
            batch = self.ix.oldest_entries(after, READ_BATCH)
            if not batch:
                break
            after = (batch[-1].last_access, batch[-1].id)
            counts = self.ix.reference_counts({c.digest for c in batch})
            before = self.remaining
            for cand in batch:
                if older is not None and cand.last_access < older:
                    reason = "older-than"
                elif limit is not None and self.remaining > limit:
                    reason = "size"
                else:
                    done = True
                    break
                self._choose(cand, reason, counts)
            self.progress("lru", max(0, before - self.remaining), total)
            self._keep_lease()
        self._flush()

    # -- objects ------------------------------------------------------------
    def _delete_objects(self, digests: list[str]) -> list[tuple[str, int]]:
        """EvictionIndex.delete_objects, sizing the next batch to about OBJECT_TX_SECS."""
        started = time.monotonic()
        gone = self.ix.delete_objects(digests, self.grace_cutoff, self.store.blobs.delete)
        secs = time.monotonic() - started
        if secs < OBJECT_TX_SECS / 2 and len(digests) >= self.object_batch:
            self.object_batch = min(OBJECT_BATCH_MAX, self.object_batch * 2)
        elif secs > OBJECT_TX_SECS * 2:
            self.object_batch = max(OBJECT_BATCH_MIN, self.object_batch // 2)
        return gone

    def delete_unreferenced_objects(self) -> None:
        after: str | None = ""
        found: list[tuple[str, int]] = []  # at most READ_BATCH + object_batch long
        while after is not None or found:
            if after is not None and len(found) < self.object_batch:
                page, after = self.ix.unreferenced_objects(after, self.grace_cutoff, READ_BATCH)
                found += page
                continue
            batch, found = found[: self.object_batch], found[self.object_batch :]
            if self.policy.dry_run:
                gone = batch
            else:
                gone = self._delete_objects([d for d, _ in batch])
            for digest, size in gone:
                self._removed(Removal("object", digest, size, "unreferenced"))
            self.progress("objects", len(batch), None)
            self._keep_lease()

    def reconcile(self) -> None:
        cutoff = self.grace_cutoff.timestamp()
        for chunk in reconcile.chunks(self.store.blobs, self.ix):
            orphans = [b for b in chunk.unreferenced() if b.mtime < cutoff]
            rows = self.ix.object_rows([b.digest for b in orphans])
            # Blobs with an object row were handled (or protected) by the pass above.
            rowless = [b for b in orphans if b.digest not in rows]
            while rowless:
                part, rowless = rowless[: self.object_batch], rowless[self.object_batch :]
                if self.policy.dry_run:
                    gone = [(b.digest, b.size) for b in part]
                else:
                    self.ix.adopt_objects(
                        [(b.digest, b.size, datetime.fromtimestamp(b.mtime, UTC)) for b in part]
                    )
                    gone = self._delete_objects([b.digest for b in part])
                for digest, size in gone:
                    self._removed(Removal("object", digest, size, "orphan"))
            missing = [d for d in chunk.unlisted() if not self.store.blobs.exists(d)]
            if missing:
                if self.policy.dry_run:
                    dropped = self.ix.keys_for_digests(missing)
                else:
                    dropped = self.ix.drop_dangling(missing)
                for key, size in dropped:
                    self._removed(Removal("entry", key, size, "missing-object"))
            self.progress("reconcile", 1, len(reconcile.PREFIXES))
            self._keep_lease()

    # -- the run ------------------------------------------------------------
    def run(self, *, wait: bool) -> GcReport:
        self.lease = Lease(self.store.engine, f"gc:{self.store.namespace}")
        self.lease.acquire(wait=wait)
        try:
            # Also in dry runs: folding deletes nothing, and without it the dry
            # run would choose by other access times than the real run.
            self.report.accesses_folded = self.ix.fold_accesses()
            limit = effective_limit(self.store, self.policy.max_bytes)
            self.report.limit_bytes = limit
            self.remaining = self.report.bytes_before = self.ix.referenced_bytes()
            self.delete_batch = min(
                DELETE_BATCH_MAX, max(DELETE_BATCH_MIN, self.ix.count_entries() // 8)
            )
            self.drop_old_jaxlib()
            self.drop_lru(limit)
            self.delete_unreferenced_objects()
            if self.policy.reconcile:
                self.reconcile()
            self.report.bytes_after = (
                self.remaining if self.policy.dry_run else self.ix.referenced_bytes()
            )
        finally:
            self.lease.release()
        return self.report


def collect(
    store: Store,
    policy: Policy,
    *,
    on_remove: OnRemove | None = None,
    progress: Progress | None = None,
    wait: bool = False,
) -> GcReport:
    """Run gc on the store's namespace; see the module docstring for what and in which order."""
    if store.read_only:
        raise ConfigError("gc deletes entries and objects: unset ARTSTORE_READ_ONLY to run it")
    started = time.monotonic()
    report = _Collector(store, policy, on_remove, progress).run(wait=wait)
    if report.entries_removed and not policy.dry_run:
        store.entries_removed()  # this host's tier must not serve evicted entries
    report.seconds = round(time.monotonic() - started, 3)
    return report
