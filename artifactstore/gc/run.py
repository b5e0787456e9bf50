"""One gc run over one namespace: what its phases share (the index, the policy's cutoffs,
the accounting, the lease and the adaptive batch sizes)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from artifactstore.gc.policy import Policy
from artifactstore.gc.report import GcReport, OnRemove, PhaseProgress, Removal
from artifactstore.index.eviction import EvictionIndex, Victims
from artifactstore.index.leases import Lease
from artifactstore.store import StoreParts

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
class AdaptiveBatch:
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


class GcRun:
    def __init__(
        self,
        parts: StoreParts,
        withdraw: Callable[[list[str]], None],
        policy: Policy,
        on_remove: OnRemove | None,
        progress: PhaseProgress | None,
    ) -> None:
        self.parts = parts
        self.withdraw = withdraw  # the manifests of entries being removed (WritePath.withdraw)
        self.policy = policy
        self.ix = EvictionIndex(parts.engine, parts.namespace)
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
        self.report = GcReport(parts.namespace, policy.dry_run, None)
        # What this run has removed so far, as a predicate: a dry run deletes
        # nothing, so later phases must see the index as if these were gone.
        self.gone = Victims()
        self.entry_range = AdaptiveBatch(ENTRY_RANGE_MIN, ENTRY_TX_SECS)
        self.object_batch = AdaptiveBatch(OBJECT_BATCH_MIN, OBJECT_TX_SECS, OBJECT_BATCH_MAX)

    def removed(self, removal: Removal) -> None:
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

    def keep_lease(self) -> None:
        if self.lease is not None:
            self.lease.keep_alive()

    def gone_if_dry(self) -> Victims:
        """What to read the index without: a real run has deleted its victims (and
        must count entries used or added meanwhile), a dry run only listed them."""
        return self.gone if self.policy.dry_run else Victims()
