"""gc's pass over compile leases: a dead holder's lease row and bucket record go.

Why: a writer killed while it compiles leaves its index row (taken over by the next
writer after one TTL) and its `leases/KEY` record, which nothing else deletes; a read-only
reader does not wait on one whose holder is dead, but a forged or stale record would
otherwise stay for ever. A record is stale when it is malformed, when its own beat time
says it expired, when it names a process of this host that has exited, or when the
index holds no live lease for its key (a holder takes its row before it writes its
record, and deletes the record before it lets the row go). A live holder whose record
a race deleted writes it again at its next beat.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from artifactstore.blobstores.base import LEASES
from artifactstore.formats.lease import LeaseRecord
from artifactstore.gc.run import GcRun
from artifactstore.index.leases import compile_lease_name, dead_here, live_leases, stale_leases
from artifactstore.store.lease import expired

BATCH = 500  # records per index query and per delete request
MAX_RECORDS = 10_000  # records looked at per run: the rest is the next run's


def drop_stale_leases(run: GcRun) -> None:
    """Delete (dry run: count) stale compile lease rows and records of the namespace."""
    settings = run.parts.settings
    grace = settings.lease_ttl_secs
    rows = stale_leases(
        run.parts.engine,
        run.parts.namespace,
        grace_secs=grace,
        max_hold_secs=settings.lease_max_hold_secs,
        remove=not run.policy.dry_run,
    )
    run.report.lease_rows_removed = len(rows)
    batch: list[str] = []
    for key in _names(run):
        batch.append(key)
        if len(batch) >= BATCH:
            _drop(run, batch)
            batch = []
    _drop(run, batch)


def _names(run: GcRun) -> Iterator[str]:
    for n, key in enumerate(run.parts.blobs.iter_records(LEASES)):
        if n >= MAX_RECORDS:
            return
        yield key


def _drop(run: GcRun, keys: list[str]) -> None:
    if not keys:
        return
    settings, ns = run.parts.settings, run.parts.namespace
    now = time.time()
    stale: list[str] = []
    unexpired: list[str] = []
    for key in keys:
        data = run.parts.blobs.get_record(LEASES, key)
        if data is None:
            continue  # released meanwhile
        try:
            record = LeaseRecord.decode(data)
        except Exception:  # malformed: no lease to anyone
            stale.append(key)
            continue
        gone = expired(record, settings, now) or dead_here(record.holder)
        (stale if gone else unexpired).append(key)
    names = {compile_lease_name(ns, key): key for key in unexpired}
    live = live_leases(run.parts.engine, list(names), grace_secs=settings.lease_ttl_secs)
    stale += [key for name, key in names.items() if name not in live]
    if stale and not run.policy.dry_run:
        run.parts.blobs.delete_records(LEASES, stale)
    run.report.lease_records_removed += len(stale)
