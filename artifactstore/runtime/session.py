"""One process's use of the store: its settings, its tier, its Store, its exit.

JAX-free, so that the JAX adapter above it stays about JAX. A session owns
exactly one local tier, opened at once (a directory: no SQLAlchemy, no boto3),
and one Store, opened lazily, within `timeout_secs`, the first time a lookup
cannot be answered by the tier; the Store is given the session's tier instead of
opening its own. A warm process is answered by the tier alone: its hits and its
below-threshold compiles are journaled there and folded into the index later. What
compiled under the store threshold is kept in a second tier of this host's, never the
store's (`keep_below_threshold`), so warm processes here load it too.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from artifactstore.config import Settings
from artifactstore.errors import ObjectUnreadable, one_line
from artifactstore.process.background import Timer, call_with_timeout, executor
from artifactstore.process.breaker import BACKENDS, describe, per_backend
from artifactstore.process.counters import Counters
from artifactstore.process.lanes import Lane
from artifactstore.process.notices import warn_once
from artifactstore.runtime import hitreport
from artifactstore.runtime.sources import LEVELS
from artifactstore.runtime.workingset import WorkingSets
from artifactstore.store.chain import Chain, Found, Request
from artifactstore.store.tier import LocalTier
from artifactstore.store.tiers import keep_in_tier, open_quick_tier, open_tier

__all__ = ["Session", "warn_once"]  # warn_once: the process's one registry (store.tier)

if TYPE_CHECKING:
    from artifactstore.formats.put import Put
    from artifactstore.gc.quota_pass import QuotaPass
    from artifactstore.metrics import Recorder
    from artifactstore.store import Store

log = logging.getLogger("artifactstore")
T = TypeVar("T")


# A process still running this long after its first tier hit opens the index in
# the background to record its hits (LRU must see them).
FOLD_AFTER_SECS = 30.0


class Session:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._store: Store | None = None
        # The process's one counting object: the session's parts, its tier and its Store
        # count here; process_stats() is its snapshot (process.counters).
        self.counters = Counters()
        self.counters.state("active", lambda: int(self.active))
        # One breaker per backend, so the log and the stats name the one that failed.
        # A call counts against the backend it was talking to when it failed or hung
        # (the store reports each switch through `_using`), and for the backends it
        # used when it succeeded: a miss, which never reaches the object store, closes
        # only the index's breaker. The store's uploads and leases ask the same ones.
        self.breakers = per_backend(settings)
        for name, breaker in self.breakers.items():
            slug = name.replace(" ", "_")
            breaker.on_open = functools.partial(self.counters.add, f"breaker_opened_{slug}")
        self._used: list[str] = []
        self._finished = False
        self._open_lock = threading.Lock()
        self._open_failures = 0
        self.on_change: Callable[[], None] | None = None  # after each load or compile
        # What this program loads, for its next run to load ahead (jaxhook.prefetch).
        self.working_sets = WorkingSets(settings)
        self.on_finish: list[Callable[[], None]] = []  # first thing at exit (the prefetch's end)
        self.tier: LocalTier | None = None
        # Compiles under the store threshold, kept on this host alone (keep_below_threshold).
        self.quick_tier: LocalTier | None = None
        self._keeping: Lane | None = None
        try:
            self.tier = open_tier(settings, self.counters)
            self.quick_tier = open_quick_tier(settings, self.counters)
        except Exception as exc:
            log.debug("artifactstore: no local tier: %s", one_line(exc))
        self._fold_timer: Timer | None = None
        self.quota: QuotaPass | None = None
        self.metrics = _metrics(settings, self)
        # Loaded ahead (added by jaxhook.prefetch), this host's tier, quick keys, the store.
        self.chain = Chain([level(self) for level in LEVELS])

    @property
    def active(self) -> bool:
        """False while a breaker is open: a backend failed and its cool-down runs."""
        return all(b.closed for b in self.breakers.values())

    def store(self) -> Store | None:
        """The Store, opened on first use within the timeout bound; None while a breaker
        is open (a failed backend costs nothing until its cool-down ends, then one probe)."""
        if not all(b.allow() for b in self.breakers.values()):
            self.counters.add("breaker_refused")
            return None
        self._used = []
        if self._store is not None:
            return self._store
        attempt = self._open_failures
        with self._open_lock:
            if self._store is None:
                if self._open_failures != attempt:
                    return None  # another thread (a concurrent compile) just failed to open it
                try:
                    self._store = call_with_timeout(self._open, self.settings.timeout_secs)
                    log.debug("artifactstore: using %s", self._store.parts.describe())
                    _finish_before_thread_shutdown(self)
                except Exception as exc:
                    self._open_failures += 1
                    self.fail(exc)
                    return None
                self.ok()
        return self._store

    def _open(self) -> Store:
        from artifactstore.store import Store

        store = Store.open(
            self.settings,
            tier=self.tier,
            using=self._using,
            lazy_index=True,
            counters=self.counters,
            breakers=self.breakers,
        )
        store.parts.on_stored.append(self._stored)
        if self.settings.enforce_quota and not self.settings.read_only:
            from artifactstore.gc.quota_pass import QuotaPass

            self.quota = QuotaPass.attach(store)
        return store

    def _using(self, backend: str) -> None:
        """Called by the store (on whichever thread runs the call) as it turns to a backend."""
        self._used.append(backend)

    def ok(self) -> None:
        """The store answered (a hit or a miss): close the breakers of what it used."""
        used = set(self._used) or set(BACKENDS)
        for name, breaker in self.breakers.items():
            if name in used:
                breaker.success()
            else:
                breaker.release_probe()

    def fail(self, exc: BaseException) -> None:
        """A call failed or hung (bounded by the timeout): it counts against the backend
        it was using, logged once per outage by that backend's breaker."""
        backend = self._used[-1] if self._used else BACKENDS[0]
        for name, breaker in self.breakers.items():
            if name == backend:
                breaker.failure(describe(exc, self.settings.timeout_secs))
            else:
                breaker.release_probe()

    # -- lookups: the chain (store.chain) the compile hook, named executables and the
    # load ahead all use; its tier and store levels are runtime.sources --------------
    def bounded(self, call: Callable[[], T]) -> T:
        """`call()` (a store call) within the timeout bound, its outcome fed to the
        breakers; a failure or hang is counted against the backend it was using, then raised."""
        try:
            result = call_with_timeout(call, self.settings.timeout_secs)
        except ObjectUnreadable:
            self.ok()  # the store answered, about one object: a miss for it, no outage
            raise
        except Exception as exc:
            self.fail(exc)
            raise
        self.ok()
        return result

    def lookup(
        self, store: Store, key: str, fingerprint_digest: str, *, callbacks: int | None = None
    ) -> Found | None:
        """The store's answer alone, through the chain (counted); `store`: the session's."""
        del store  # the chain's store level asks the session's own
        return self.chain.get(Request(key, fingerprint_digest, callbacks), names=("store",))

    def _stored(self) -> None:
        """A put went through (on the writer thread): both backends answer."""
        for breaker in self.breakers.values():
            breaker.success()

    # -- accounting ---------------------------------------------------------
    def tier_hit(self) -> None:
        """Count a tier hit; a process that lives on opens the index later to record it."""
        self.counters.add("tier_hits")
        if self._fold_timer is None and self._store is None:
            # Short programs leave their hits in a journal at exit; long ones
            # (training, serving) report them while running, off the hot path.
            self._fold_timer = executor().later(FOLD_AFTER_SECS, self._fold)

    def _fold(self) -> None:
        store = self.store()
        if store is not None and self.tier is not None:
            store.parts.accounts.add_accesses(self.tier.take_accesses())

    def observe_load(self, secs: float, compile_secs: float = 0.0) -> None:
        """A stored executable, which took `compile_secs` to compile where it was built,
        loaded in `secs` (fetch and deserialize)."""
        self.counters.add("loads")
        self.counters.add("compile_ms_saved", compile_secs * 1000)
        if self.metrics is not None:
            self.metrics.loaded(secs)
        if self.on_change is not None:
            self.on_change()

    def observe_compile(self, secs: float, *, quick: bool) -> None:
        """XLA compiled a key in `secs`: a miss, or a quick one (never stored; counted as
        `quick_compiles` where the store is told: `compiled_below_threshold`)."""
        self.counters.add("compiles")
        if not quick:
            self.counters.add("misses")
        self.counters.add("compile_ms", secs * 1000)
        if self.metrics is not None:
            self.metrics.compiled(secs)
        if self.on_change is not None:
            self.on_change()

    def compiled_below_threshold(
        self, store: Store | None, key: str, fingerprint: str, compile_secs: float
    ) -> None:
        """A compile took less than ARTSTORE_MIN_COMPILE_SECS (never stored): tell the
        store that looked it up (its miss was not an eligible one; a writer publishes
        the key as quick), or the open store (a key the tier knew to be quick); a process
        that never opened one counts it in process_stats() only."""
        target = store if store is not None else self._store
        if target is not None:
            target.compiled_below_threshold(key, fingerprint, compile_secs)
        else:
            self.counters.add("quick_compiles")

    def can_keep_locally(self) -> bool:
        """Whether a writer's compiles can be kept in this host's tier while the store is down."""
        return self.tier is not None and self.tier.owns_objects and not self.settings.read_only

    def keep_locally(self, put: Put) -> None:
        """The store is down: keep a writer's executable in this host's tier, so later
        processes here load it (`store.keep_in_tier`); counted as `kept_in_tier`."""
        if self.tier is not None and keep_in_tier(self.settings, self.tier, put):
            self.counters.add("kept_in_tier")

    def keep_below_threshold(self, make: Callable[[], Put]) -> None:
        """A compile under ARTSTORE_MIN_COMPILE_SECS: keep its executable (`make()`, called
        off the program's thread) in this host's own tier, never the store, so that later
        processes here load it instead of compiling again (what JAX's own cache does with
        its thresholds at 0); counted as `quick_kept`. Not where this process could not
        load it back: it requires signatures (ARTSTORE_TRUSTED_KEYS) and cannot sign."""
        tier = self.quick_tier
        if tier is None or (
            self.settings.trusted_keys is not None and self.settings.signing_key is None
        ):
            return

        def keep() -> None:
            if keep_in_tier(self.settings, tier, make()):
                self.counters.add("quick_kept")

        if self._keeping is None:
            self._keeping = Lane("keep quick compiles")
        self._keeping.submit("keep a quick compile", keep)

    def stats(self) -> dict[str, int]:
        """process_stats(): the snapshot of the process's counters (formats.counters)."""
        return self.counters.snapshot()

    def flush(self, timeout: float | None = None) -> bool:
        """Finish what this process queued to keep (bounded): quick compiles for this
        host's tier, then the store's uploads and hit records."""
        kept = self._keeping is None or self._keeping.drain(timeout)
        return (self._store.flush(timeout) if self._store is not None else True) and kept

    # -- exit ---------------------------------------------------------------
    def finish(self) -> None:
        """Once, at exit: uploads flushed (bounded), tier hits to the index or a journal."""
        if self._finished:
            return
        self._finished = True
        for callback in self.on_finish:
            try:
                callback()
            except Exception as exc:
                log.debug("artifactstore: at exit: %s", one_line(exc))
        if self._fold_timer is not None:
            self._fold_timer.cancel()
        if self._keeping is not None and not self._keeping.drain(self.settings.flush_secs):
            log.debug("artifactstore: quick compiles not all kept in this host's tier")
        self.working_sets.save(self.tier, self._store)
        if self.tier is not None:
            try:
                self.tier.quick.save()
            except Exception as exc:
                log.debug("artifactstore: could not save below-threshold keys: %s", exc)
        store = self._store
        if store is not None:
            if self.tier is not None:
                store.parts.accounts.add_accesses(self.tier.take_accesses())
            if self.quota is not None:
                store.parts.worker.submit("quota pass", self.quota.finish)
            if not store.flush():  # its bound ran out: the exit waits for nothing more
                executor().spend_exit_wait()
            hitreport.park_unwritten(store)
        elif self.tier is not None:
            try:
                self.tier.write_journal()
                hitreport.report_tier_hits(self.tier, self.settings)
            except Exception as exc:
                log.debug("artifactstore: tier hits not reported: %s", one_line(exc))

    def close(self) -> None:
        self.finish()
        if self._store is not None:
            self._store.close()


def _metrics(settings: Settings, session: Session) -> Recorder | None:
    """The process's metrics, when asked for (ARTSTORE_METRICS_PORT, PROMETHEUS_MULTIPROC_DIR),
    fed by `session`'s counters; imported only then (artifactstore.metrics)."""
    if settings.metrics_error is not None:
        log.warning("artifactstore: metrics off: %s", settings.metrics_error)
        return None
    if settings.metrics_port is None and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return None
    try:
        from artifactstore import metrics

        recorder = metrics.enable(settings)
        if recorder is None:
            return None
        session.counters.observe(recorder.counted)
    except Exception as exc:  # metrics never break the program
        log.warning("artifactstore: metrics off: %s", one_line(exc))
        return None
    return recorder


def _finish_before_thread_shutdown(session: Session) -> None:
    """Run the exit flush before concurrent.futures stops taking work.

    boto3's transfer manager uploads on a thread pool, and at interpreter exit
    concurrent.futures refuses new work *before* atexit handlers run: a put
    flushed from atexit fails with "cannot schedule new futures after
    interpreter shutdown". threading's own exit hooks run earlier, newest
    first, so registering once the store (and boto3) is open puts ours ahead.
    `finish` runs once, so the atexit hook that follows costs nothing.
    """
    register = getattr(threading, "_register_atexit", None)
    if register is None:
        return
    try:
        register(session.finish)
    except RuntimeError:  # already shutting down: atexit still flushes
        pass
