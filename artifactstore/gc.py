"""Eviction: `artstore gc` as a small function over the index and the blob store.

Order of work, under a lease (`gc:NAMESPACE`) so that two gc runs never overlap:

1. fold read-only readers' accesses into entries, so LRU reflects the cluster;
2. drop entries built by jaxlib versions older than `jaxlib_older_than`;
3. find, in one query, the shortest least-recently-used prefix of entries (by
   (last_access, id)) whose removal takes every entry unused for `older_than`
   and brings the namespace within its limit (`max_bytes`, or the namespace
   quota if smaller), then delete that prefix by id ranges;
4. delete objects no entry references, once older than the grace period;
5. reconcile (one listing of the blob store): blobs with no row and no entry,
   older than the grace period, are deleted; entries whose object is gone
   are dropped.

Victims are predicates, not lists (`Victims`): gc never holds the entries in
memory, the database sorts and deletes them set-wise, and an entry hit while gc
runs moves past the cutoff and is kept.

The size of a namespace is the bytes of the distinct objects its entries
reference (entries sharing an object count it once, and it is freed with the
last of them). Index rows go first, objects after, so a reader racing gc finds
either a row and its object, or a row and no object (a miss: Store.get returns
None), or no row (a miss).

Why objects in flight survive: a writer PUTs the object before it commits the
entry. An uploaded blob is younger than the grace period (its mtime), and its
object row is created (or touched, which makes it young again) only in the
entry's own transaction, so neither path deletes it while the put is in
flight. The dangerous writer is the one that found the object present and
skipped the upload while gc deletes it: see `EvictionIndex._sweep` for why its
entry is either seen by gc or followed by a re-upload (an entry points at a
missing object for at most that one operation). `grace_secs=0` keeps that
guarantee but lets gc delete a blob whose writer has not committed yet; the
writer's re-check then restores it.

Dry runs take the same decisions without deleting, counting what they would
have removed as gone: they report exactly the set a real run would remove,
unless the store changes in between.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from artifactstore import reconcile
from artifactstore.errors import ConfigError
from artifactstore.index.eviction import EvictionIndex, VictimRow, Victims, get_quota
from artifactstore.index.lease import Lease
from artifactstore.store import Store

DEFAULT_GRACE_SECS = 3600.0
READ_BATCH = 5000  # rows read per query (dry-run listings, object scans)
# Entries are deleted by id range, one transaction per range, sized so that a
# transaction takes about ENTRY_TX_SECS: long enough that each table page is
# rewritten about once overall, short enough that writers waiting on SQLite's
# write lock are not held for long.
ENTRY_RANGE_MIN, ENTRY_TX_SECS = 20_000, 2.0
# Objects locked per transaction while their blobs are deleted: adapted so that
# one transaction takes about OBJECT_TX_SECS whatever the blob store's latency.
OBJECT_BATCH_MIN, OBJECT_BATCH_MAX, OBJECT_TX_SECS = 100, 200_000, 1.0

T = TypeVar("T")


@dataclass
class _Batch:
    """A batch size (ids or rows per transaction) adapted so that one transaction
    takes about `target_secs`: doubled when one took under half, halved over twice."""

    low: int  # also the first size
    target_secs: float
    high: int = 2**62
    size: int = field(init=False)

    def __post_init__(self) -> None:
        self.size = self.low

    def run(self, transaction: Callable[..., T], *args: Any) -> T:
        started = time.monotonic()
        result = transaction(*args)
        secs = time.monotonic() - started
        if secs < self.target_secs / 2:
            self.size = min(self.high, self.size * 2)
        elif secs > self.target_secs * 2:
            self.size = max(self.low, self.size // 2)
        return result


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
        self.older = (
            self.now - timedelta(seconds=policy.older_than_secs)
            if policy.older_than_secs is not None
            else None
        )
        self.report = GcReport(store.namespace, policy.dry_run, None)
        # What this run has removed so far, as a predicate: a dry run deletes
        # nothing, so later phases must see the index as if these were gone.
        self.gone = Victims()
        self.entry_range = _Batch(ENTRY_RANGE_MIN, ENTRY_TX_SECS)
        self.object_batch = _Batch(OBJECT_BATCH_MIN, OBJECT_TX_SECS, OBJECT_BATCH_MAX)

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
    def _reason(self, last_access: datetime) -> str:
        return "older-than" if self.older is not None and last_access < self.older else "size"

    def _entry_removed(self, row: VictimRow, reason: Callable[[datetime], str]) -> None:
        self._removed(Removal("entry", row.key, row.size, reason(row.last_access), row.module_name))

    def _remove_entries(
        self, victims: Victims, phase: str, reason: Callable[[datetime], str]
    ) -> None:
        """Remove (or, dry, list) the entries `victims` selects, less those already gone."""
        total = self.ix.count_victims(victims, self.gone)
        if total and self.policy.dry_run:
            after: tuple[datetime, int] | None = None
            while page := self.ix.victims_page(victims, self.gone, after, READ_BATCH):
                after = (page[-1].last_access, page[-1].id)
                for row in page:
                    self._entry_removed(row, reason)
                self.progress(phase, len(page), total)
        elif total:
            self._delete_entries(victims, phase, total, reason)
        self.gone = Victims(
            self.gone.jaxlib_versions + victims.jaxlib_versions,
            victims.through or self.gone.through,
        )

    def _delete_entries(
        self, victims: Victims, phase: str, total: int, reason: Callable[[datetime], str]
    ) -> None:
        bounds = self.ix.id_bounds()
        if bounds is None:
            return
        low, top = bounds
        while low <= top:
            high = low + self.entry_range.size
            deleted = self.entry_range.run(
                self.ix.delete_victims,
                victims,
                low,
                high,
                lambda row: self._entry_removed(row, reason),
            )
            low = high
            self.progress(phase, deleted, total)
            self._keep_lease()

    def drop_old_jaxlib(self) -> None:
        if not self.policy.jaxlib_older_than:
            return
        versions = old_jaxlib_versions(self.ix.jaxlib_versions(), self.policy.jaxlib_older_than)
        if versions:
            self._remove_entries(
                Victims(jaxlib_versions=tuple(versions)), "jaxlib", lambda _t: "jaxlib"
            )

    def drop_lru(self, limit: int | None) -> None:
        if self.older is None and limit is None:
            return
        remaining = self.report.bytes_before
        if self.gone.jaxlib_versions:  # the jaxlib pass chose some: count without them
            remaining = self.ix.referenced_bytes(self.gone)
        excess = remaining - limit if limit is not None else 0
        through = self.ix.lru_cutoff(excess, self.older, self.gone)
        if through is not None:
            self._remove_entries(Victims(through=through), "lru", self._reason)

    # -- objects ------------------------------------------------------------
    def _gone_if_dry(self) -> Victims:
        """What to read the index without: a real run has deleted its victims (and
        must count entries used or added meanwhile), a dry run only listed them."""
        return self.gone if self.policy.dry_run else Victims()

    def delete_unreferenced_objects(self) -> None:
        """Sweep the object rows in digest ranges of `object_batch` rows each."""
        delete_blobs = None if self.policy.dry_run else self.store.blobs.delete_many
        total = self.ix.count_objects()
        after: str | None = ""
        while after is not None:
            start, rows = after, self.object_batch.size
            after = self.ix.object_range_end(start, rows)
            gone = self.object_batch.run(
                self.ix.sweep_objects,
                start,
                after,
                self.grace_cutoff,
                delete_blobs,
                self._gone_if_dry(),
            )
            for digest, size in gone:
                self._removed(Removal("object", digest, size, "unreferenced"))
            self.progress("objects", rows, total)
            self._keep_lease()

    def reconcile(self) -> None:
        cutoff = self.grace_cutoff.timestamp()
        for chunk in reconcile.chunks(self.store.blobs, self.ix):
            orphans = [b for b in chunk.unreferenced() if b.mtime < cutoff]
            rows = self.ix.object_rows([b.digest for b in orphans])
            # Blobs with an object row were handled (or protected) by the pass above.
            rowless = [b for b in orphans if b.digest not in rows]
            while rowless:
                n = self.object_batch.size
                part, rowless = rowless[:n], rowless[n:]
                if self.policy.dry_run:
                    gone = [(b.digest, b.size) for b in part]
                else:
                    self.ix.adopt_objects(
                        [(b.digest, b.size, datetime.fromtimestamp(b.mtime, UTC)) for b in part]
                    )
                    gone = self.object_batch.run(
                        self.ix.delete_objects,
                        [b.digest for b in part],
                        self.grace_cutoff,
                        self.store.blobs.delete_many,
                    )
                for digest, size in gone:
                    self._removed(Removal("object", digest, size, "orphan"))
            missing = [d for d in chunk.unlisted() if not self.store.blobs.exists(d)]
            if missing:
                if self.policy.dry_run:
                    dropped = self.ix.keys_for_digests(missing, self.gone)
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
            self.report.bytes_before = self.ix.referenced_bytes()
            self.drop_old_jaxlib()
            self.drop_lru(limit)
            self.delete_unreferenced_objects()
            if self.policy.reconcile:
                self.reconcile()
            self.report.bytes_after = self.ix.referenced_bytes(self._gone_if_dry())
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
