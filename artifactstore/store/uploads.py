"""Uploads off the program's thread, and the bounded flush at exit.

Why: a compile the program just paid for must not wait for the object store. Puts
queue on the background writer (a process.lanes.Lane); each asks the backends' breakers
(process.breaker) first, and one that fails opens its backend's breaker for writes
(ARTSTORE_BREAKER_*), so the puts queued behind it are skipped for the cool-down while
this host's tier keeps what could not be stored. At exit everything pending is finished within
ARTSTORE_FLUSH_TIMEOUT, and what was not is said in one line.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import Literal

from artifactstore.errors import PrivilegeRefused, StoreUnavailable, one_line
from artifactstore.formats.put import Put
from artifactstore.index.errors import UNAVAILABLE
from artifactstore.process.background import call_with_timeout
from artifactstore.process.breaker import allow_all
from artifactstore.process.lanes import Lane
from artifactstore.store.account import Accounts
from artifactstore.store.backends import Backends, refused_topic
from artifactstore.store.flight import SingleFlight
from artifactstore.store.tiers import keep_in_tier
from artifactstore.store.write import WritePath

log = logging.getLogger("artifactstore")


class Uploads:
    """One store's queued puts, on `worker`, written by `writes`."""

    def __init__(self, backends: Backends, writes: WritePath, worker: Lane) -> None:
        self.backends = backends
        self.writes = writes
        self.counters = writes.counters
        self.worker = worker

    def submit(self, put: Put, then: Callable[[bool], None] | None = None) -> None:
        """Queue a put on the background writer; the program does not wait for it.

        `then`: called on the writer with whether the entry is now published (stored
        by this or another process), however the put ended."""
        backends, settings = self.backends, self.backends.settings
        finished = then or (lambda _published: None)
        if backends.read_only:
            self.counters.add("skipped_read_only")
            finished(False)
            return

        def keep() -> None:
            """A backend is down: this host's tier keeps the executable (see keep_in_tier)."""
            if backends.tier is not None and keep_in_tier(settings, backends.tier, put):
                self.counters.add("kept_in_tier")

        def job() -> None:
            published = False
            try:
                published = upload()
            finally:
                finished(published)

        def upload() -> bool:
            breakers = backends.breakers.values()
            if not allow_all(breakers, write=True):
                # A backend just failed: drop this one (counted) instead of paying the
                # timeout again for every queued compile and the exit flush.
                self.counters.add("put_skipped")
                keep()
                return False
            try:
                self.writes.put(put)
            except Exception as exc:
                self.counters.add("put_errors")
                # Our own one-line refusal is said whole (its fix is a command).
                cause = str(exc) if isinstance(exc, PrivilegeRefused) else one_line(exc)
                if isinstance(exc, UNAVAILABLE):  # the driver's words
                    cause = f"index unavailable ({cause})"
                paused = ""
                if isinstance(exc, (StoreUnavailable, *UNAVAILABLE)):
                    # A backend unavailable: its breaker opens for writes (said here).
                    keep()
                    breaker = backends.breakers[self._failed(exc)]
                    if breaker.failure(cause, write=True, said=True):
                        paused = f"; not uploading for {breaker.cooldown_secs:g} s"
                else:
                    for breaker in breakers:
                        breaker.release_probe()  # no verdict on either backend
                # Once per kind of cause, not once per process: a later, different
                # failure (the bucket now denies writes) must not hide behind the first.
                kind = re.sub(r"[0-9a-f]{12,}", "…", f"{type(exc).__name__}: {cause}")
                topic = refused_topic(exc) if isinstance(exc, PrivilegeRefused) else f"put {kind}"
                backends.warn_once(
                    topic, "could not store %s: %s%s", put.module_name, cause, paused
                )
                raise
            for breaker in breakers:
                breaker.success(write=True)
            return True

        self.worker.submit(f"put {put.module_name}", job)

    def _failed(self, exc: Exception) -> Literal["index", "object store"]:
        """The backend a put's failure came from: the index's driver, or the index not
        opened (a put opens it first), else the object store."""
        if isinstance(exc, UNAVAILABLE) or not self.backends.index_opened:
            return "index"
        return "object store"

    def submit_quick(self, key: str, fingerprint: str, compile_secs: float) -> None:
        """Queue the publication of a key too quick to store (WritePath.publish_quick),
        unless uploads are paused for a failing backend: a lost one costs a pulled node
        one lookup, never a result."""
        breakers = self.backends.breakers.values()
        if self.backends.read_only or any(b.refuses(write=True) for b in breakers):
            return

        def job() -> None:
            self.writes.publish_quick(key, fingerprint, compile_secs)

        self.worker.submit("publish a quick key", job)

    def flush(
        self, accounts: Accounts, flight: SingleFlight | None, timeout: float | None = None
    ) -> bool:
        """Finish queued uploads, then `flight`'s lease releases, then `accounts`' hit
        records, all within `timeout` seconds (ARTSTORE_FLUSH_TIMEOUT by default)."""
        settings = self.backends.settings
        bound = settings.flush_secs if timeout is None else timeout
        deadline = time.monotonic() + bound
        done = self.worker.drain(bound)
        if flight is not None:  # leases released: waiters go on
            flight.drain(min(max(deadline - time.monotonic(), 0), settings.timeout_secs))
        late = [] if done else [f"{self.worker.pending()} upload(s)"]
        # Hit counts too, within what is left of the same bound: a database that stops
        # answering must not hold the program at exit.
        accesses = accounts.has_pending()
        # The hit counts are one store operation: bounded by ARTSTORE_TIMEOUT as any other.
        hits_bound = min(deadline - time.monotonic(), settings.timeout_secs)
        try:
            if accesses and hits_bound <= 0:
                raise TimeoutError(f"no time left of the {bound:g} s flush bound")
            if accesses:
                call_with_timeout(accounts.flush, hits_bound)
        except TimeoutError:
            late.append("hit counts")
        except Exception as exc:
            log.debug("artifactstore: final access flush failed: %s", exc)
        if late:  # one line for both: one flush, one incident
            self.backends.warn_once(
                "flush",
                "%s not finished within %.0f s; they were not stored",
                " and ".join(late),
                bound if not done else max(hits_bound, 0),
            )
        return done
