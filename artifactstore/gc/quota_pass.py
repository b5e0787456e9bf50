"""Opt-in quota enforcement after writes (`ARTSTORE_ENFORCE_QUOTA=1`).

A store shared by a busy team can outgrow its quota between two cron runs of
`artstore gc`. With this on, a writing process runs a gc pass on its own
background writer thread (never on a compile) after it creates entries: at
once after its first new entry, then at most every PASS_INTERVAL_SECS, and once
more in the exit flush if it wrote since the last pass, so the namespace is
within its quota when a writer finishes. A pass does nothing unless the
namespace has a quota it exceeds, skips reconciliation (a full listing of the
object store is cron's job), and steps aside if another gc holds the lease.
Any failure is logged once and never reaches the program.
"""

from __future__ import annotations

import logging
import threading
import time

from artifactstore.errors import LeaseHeld, one_line
from artifactstore.formats.sizes import format_size
from artifactstore.gc.collect import collect
from artifactstore.gc.policy import Policy
from artifactstore.gc.report import GcReport
from artifactstore.index.eviction import EvictionIndex
from artifactstore.index.quotas import get_quota
from artifactstore.store import Store, StoreParts

log = logging.getLogger("artifactstore")

PASS_INTERVAL_SECS = 60.0


class QuotaPass:
    def __init__(self, store: Store, interval_secs: float = PASS_INTERVAL_SECS) -> None:
        self.store = store
        self.interval_secs = interval_secs
        self.runs = 0  # passes that evicted something
        self._last = float("-inf")
        self._dirty = False
        self._warned = False
        self._lock = threading.Lock()

    @classmethod
    def attach(cls, store: Store, interval_secs: float = PASS_INTERVAL_SECS) -> QuotaPass:
        """Run passes after the store's writes; the caller queues `finish` at exit."""
        quota = cls(store, interval_secs)
        store.parts.on_stored.append(quota.stored)
        return quota

    def stored(self) -> None:
        """An entry was created (on the writer thread): pass now, or mark it due."""
        self._dirty = True
        if time.monotonic() - self._last >= self.interval_secs:
            self.run()

    def finish(self) -> None:
        """The last pass, queued behind the uploads at exit, if anything was written since."""
        if self._dirty:
            self.run()

    def run(self) -> GcReport | None:
        """One pass; the report when it evicted something, else None."""
        with self._lock:
            self._dirty = False
            self._last = time.monotonic()
            try:
                return self._run()
            except LeaseHeld:
                log.debug("artifactstore: quota pass skipped: another gc is running")
            except Exception as exc:
                if not self._warned:
                    self._warned = True
                    log.warning("artifactstore: quota pass failed: %s", one_line(exc))
            return None

    def _run(self) -> GcReport | None:
        store = self.store
        limit = _over_quota(store.parts)
        if limit is None:
            return None
        report = collect(store, Policy(reconcile=False))
        self.runs += 1
        log.info(
            "artifactstore: quota pass removed %d entries and %d objects; namespace %s "
            "now holds %s of its %s quota",
            report.entries_removed,
            report.objects_removed,
            store.parts.namespace,
            format_size(report.bytes_after),
            format_size(limit),
        )
        return report


def _over_quota(parts: StoreParts) -> int | None:
    """The namespace's quota where its referenced bytes are over it, else None."""
    limit = get_quota(parts.engine, parts.namespace)
    if limit is None or EvictionIndex(parts.engine, parts.namespace).referenced_bytes() <= limit:
        return None
    return limit
