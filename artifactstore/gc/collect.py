"""The phases of `collect` over one namespace, in order, under the namespace's gc lease."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta

from artifactstore import interrupts
from artifactstore.errors import ConfigError, StoreUnavailable, one_line
from artifactstore.gc import reconcile
from artifactstore.gc.journals import fold_or_say_why
from artifactstore.gc.leases import drop_stale_leases
from artifactstore.gc.policy import Policy, effective_limit, old_jaxlib_versions
from artifactstore.gc.publish import Publish, publish_missing
from artifactstore.gc.quick import drop_stored_quick_keys
from artifactstore.gc.rebuild import require_sound_index
from artifactstore.gc.report import GcReport, OnRemove, PhaseProgress, Removal
from artifactstore.gc.run import GcRun
from artifactstore.index.accesses import fold_accesses
from artifactstore.index.eviction import VictimRow, Victims
from artifactstore.index.leases import Lease
from artifactstore.store import Store

READ_BATCH = 5000  # rows read per query (dry-run listings)

Reason = Callable[[datetime], str]  # why an entry goes, from its last access


def collect(
    store: Store,
    policy: Policy,
    *,
    on_remove: OnRemove | None = None,
    progress: PhaseProgress | None = None,
    wait: bool = False,
) -> GcReport:
    """Run gc on the store's namespace; see `artifactstore.gc` for what and in which order."""
    if store.parts.read_only:
        raise ConfigError("gc deletes entries and objects: unset ARTSTORE_READ_ONLY to run it")
    started = time.monotonic()
    try:
        require_sound_index(store.parts)
    except StoreUnavailable:
        if not policy.dry_run:
            raise
        # A dry run deletes nothing: it may look at the index with the object store down.
    run = GcRun(store.parts, store.parts.writes.withdraw, policy, on_remove, progress)
    try:
        report = _run(run, store.parts.writes.publish_checked, wait=wait)
    finally:  # also when interrupted part way
        if run.report.entries_removed and not policy.dry_run:
            store.parts.entries_removed()  # this host's tier must not serve evicted entries
    report.seconds = round(time.monotonic() - started, 3)
    return report


def _run(run: GcRun, publish: Publish, *, wait: bool) -> GcReport:
    max_hold = run.parts.settings.lease_max_hold_secs
    run.lease = Lease(run.parts.engine, f"gc:{run.parts.namespace}", max_hold_secs=max_hold)
    try:
        run.lease.acquire(wait=wait)
    except (KeyboardInterrupt, interrupts.Terminated):
        run.lease.release()  # the signal may have landed just after the row was taken
        raise
    try:
        store_down = False  # a dry run goes on from the index alone (never more waits)
        try:
            reconcile.check_missing(run)
        except StoreUnavailable as exc:
            if not run.policy.dry_run:
                raise
            store_down, run.report.reconcile_skipped = True, one_line(exc)
        # Also in dry runs: folding loses nothing, and without it the dry
        # run would choose by other access times than the real run.
        fold, why = fold_or_say_why(run.parts)
        if why is not None and not run.policy.dry_run:
            raise StoreUnavailable(f"hit journals not folded: {why}")
        run.report.journals_folded, run.report.journals_refused = fold.journals, fold.refused
        run.report.journals_set_aside, run.report.journals_left = fold.set_aside, fold.left
        run.report.accesses_folded = fold_accesses(run.parts.engine, run.parts.namespace)
        if not store_down:
            try:
                drop_stored_quick_keys(run)
                drop_stale_leases(run)
            except StoreUnavailable as exc:
                if not run.policy.dry_run:
                    raise
                store_down, run.report.reconcile_skipped = True, one_line(exc)
        limit = effective_limit(run.parts, run.policy.max_bytes)
        run.report.limit_bytes = limit
        run.report.bytes_before = run.ix.referenced_bytes()
        drop_old_jaxlib(run)
        drop_lru(run, limit)
        delete_unreferenced_objects(run)
        note_waiting_objects(run)
        if run.policy.reconcile and not store_down:
            try:
                reconcile.remove_orphans(run)
                publish_missing(run, publish)
            except StoreUnavailable as exc:
                if not run.policy.dry_run:
                    raise
                run.report.reconcile_skipped = one_line(exc)
        run.report.bytes_after = run.ix.referenced_bytes(run.gone_if_dry())
    finally:
        run.lease.release()
    return run.report


# -- entries ----------------------------------------------------------------
def drop_old_jaxlib(run: GcRun) -> None:
    if not run.policy.jaxlib_older_than:
        return
    versions = old_jaxlib_versions(run.ix.jaxlib_versions(), run.policy.jaxlib_older_than)
    if versions:
        _remove_entries(
            run, Victims(jaxlib_versions=tuple(versions)), "jaxlib", lambda _t: "jaxlib"
        )


def drop_lru(run: GcRun, limit: int | None) -> None:
    if run.older is None and limit is None:
        return
    remaining = run.report.bytes_before
    if run.gone.jaxlib_versions:  # the jaxlib pass chose some: count without them
        remaining = run.ix.referenced_bytes(run.gone)
    excess = remaining - limit if limit is not None else 0
    through = run.ix.lru_cutoff(excess, run.older, run.gone)
    if through is not None:

        def reason(last_access: datetime) -> str:
            older = run.older is not None and last_access < run.older
            return "older-than" if older else "size"

        _remove_entries(run, Victims(through=through), "lru", reason)


def _entry_removed(run: GcRun, row: VictimRow, reason: Reason) -> None:
    run.removed(Removal("entry", row.key, row.size, reason(row.last_access), row.module_name))


def _remove_entries(run: GcRun, victims: Victims, phase: str, reason: Reason) -> None:
    """Remove (or, dry, list) the entries `victims` selects, less those already gone."""
    total = run.ix.count_victims(victims, run.gone)
    if total and run.policy.dry_run:
        after: tuple[datetime, int] | None = None
        while page := run.ix.victims_page(victims, run.gone, after, READ_BATCH):
            after = (page[-1].last_access, page[-1].id)
            for row in page:
                _entry_removed(run, row, reason)
            run.progress(phase, len(page), total)
    elif total:
        _delete_entries(run, victims, phase, total, reason)
    run.gone = Victims(
        run.gone.jaxlib_versions + victims.jaxlib_versions,
        victims.through or run.gone.through,
    )


def _noting(keys: list[str], then: Callable[[VictimRow], None]) -> Callable[[VictimRow], None]:
    """`then`, after appending each deleted row's key to `keys`."""

    def removed(row: VictimRow) -> None:
        keys.append(row.key)
        then(row)

    return removed


def _delete_entries(run: GcRun, victims: Victims, phase: str, total: int, reason: Reason) -> None:
    bounds = run.ix.id_bounds()
    if bounds is None:
        return
    low, top = bounds
    while low <= top:
        high = low + run.entry_range.size
        keys: list[str] = []
        # Rows are chosen and deleted in one statement, so their manifests follow at once
        # (an interrupt waits for both): a reader that follows one meanwhile loads a
        # valid executable (objects outlive their entries by the grace period) or misses.
        with interrupts.held():
            deleted = run.entry_range.run(
                run.ix.delete_victims,
                victims,
                low,
                high,
                _noting(keys, lambda row: _entry_removed(run, row, reason)),
            )
            run.withdraw(keys)
        low = high
        run.progress(phase, deleted, total)
        run.keep_lease()


# -- objects ----------------------------------------------------------------
def delete_unreferenced_objects(run: GcRun) -> None:
    """Sweep the object rows in digest ranges of `object_batch` rows each."""
    delete_blobs = None if run.policy.dry_run else run.parts.blobs.delete_many
    total = run.ix.count_objects()
    swept = 0
    after: str | None = ""
    while after is not None:
        start, rows = after, run.object_batch.size
        after = run.ix.object_range_end(start, rows)
        gone = run.object_batch.run(
            run.ix.sweep_objects,
            start,
            after,
            run.grace_cutoff,
            delete_blobs,
            run.gone_if_dry(),
        )
        for digest, size in gone:
            run.removed(Removal("object", digest, size, "unreferenced"))
        run.progress("objects", min(rows, total - swept), total)  # the last range: fewer
        swept = min(swept + rows, total)
        run.keep_lease()


def note_waiting_objects(run: GcRun) -> None:
    """What the grace period keeps for a later run (the objects of entries removed just
    now, most often), and from when a run deletes them: else "0 objects freed" after
    removing entries reads as if their bytes were never coming back."""
    waiting = run.ix.waiting_objects(run.grace_cutoff, run.gone_if_dry())
    grace = timedelta(seconds=run.policy.grace_secs)
    report = run.report
    report.grace_secs = run.policy.grace_secs
    report.objects_waiting, report.object_bytes_waiting = waiting.count, waiting.size
    if waiting.oldest is not None and waiting.newest is not None:
        report.objects_waiting_from = (waiting.oldest + grace).isoformat(timespec="seconds")
        report.objects_waiting_until = (waiting.newest + grace).isoformat(timespec="seconds")
