"""One circuit breaker per backend (the index, the object store), asked by every part.

Why: a backend that fails must cost the program one timeout, not one per lookup, per
upload and per compile lease. Each part asks the breaker of the backend it is about to
call (`allow`) and reports how the call went (`success`, `failure`): lookups through
the session, compile leases (store.flight), uploads (store.uploads). Nobody keeps a
cool-down of their own (tests/test_layers.py).

A backend that answers reads but fails writes (an upload hangs; credentials that may
read but not write) is open for writes only: uploads pause, lookups go on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from artifactstore.config import Settings
from artifactstore.errors import ArtstoreError, one_line

log = logging.getLogger("artifactstore")

BACKENDS = ("index", "object store")  # the order a lookup uses them in


class Breaker:
    """A circuit breaker: after `failures` consecutive failures, refuse calls for
    `cooldown_secs` (they cost nothing), then let exactly one probe through; its
    success closes the breaker, its failure opens it for another cool-down.

    Callers ask `allow()` before a call and report `success()` or `failure()`
    after it (a probe that never reports just waits for the next cool-down).
    One warning when it first opens and one when it closes again, so a long
    outage is one line, not one per call or per cool-down. A failure of a write
    (`write=True`) opens it for writes only (`allow(write=True)`).
    """

    def __init__(
        self,
        name: str,
        *,
        failures: int = 1,
        cooldown_secs: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.failures = max(1, failures)
        self.cooldown_secs = cooldown_secs
        self._clock = clock
        self._lock = threading.Lock()
        self._consecutive = 0
        self._open_until: float | None = None  # for every call
        self._writes_until: float | None = None  # for writes only
        self._probing = False
        self._opened_at: float | None = None
        self.opened = 0  # times it opened
        self.on_open: Callable[[], None] | None = None  # told each time it opens (metrics)
        self.refused = 0  # calls refused while open

    @property
    def closed(self) -> bool:
        """Whether it lets reads through (it may be open for writes)."""
        with self._lock:
            return self._open_until is None

    def allow(self, *, write: bool = False) -> bool:
        return self.admit(write=write) is not None

    def admit(self, *, write: bool = False) -> bool | None:
        """None: refused; True: let through as the probe; False: let through, closed."""
        with self._lock:
            until = self._open_until
            if until is None and write:
                until = self._writes_until
            if until is None:
                return False
            now = self._clock()
            if now < until:
                self.refused += 1
                return None
            # This caller is the probe; others wait another cool-down (also if the
            # probe never reports back).
            if self._open_until is not None:
                self._open_until = now + self.cooldown_secs
            else:
                self._writes_until = now + self.cooldown_secs
            self._probing = True
            return True

    def refuses(self, *, write: bool = False) -> bool:
        """Whether it is open (in its cool-down) for such a call; asks for no probe."""
        with self._lock:
            until = self._open_until
            if until is None and write:
                until = self._writes_until
            return until is not None and self._clock() < until

    def release_probe(self) -> None:
        """The probe call did not reach this backend (a miss never fetches an object): let
        the next call probe at once instead of waiting another cool-down for a verdict."""
        with self._lock:
            if self._probing:
                self._probing = False
                if self._open_until is not None:
                    self._open_until = self._clock()
                elif self._writes_until is not None:
                    self._writes_until = self._clock()

    def success(self, *, write: bool = False) -> None:
        """A call went through: closed for reads, and for writes too if it wrote."""
        with self._lock:
            was_open = self._open_until is not None or (write and self._writes_until is not None)
            self._consecutive, self._open_until, self._probing = 0, None, False
            if write:
                self._writes_until = None
            down = self._clock() - self._opened_at if self._opened_at is not None else 0.0
            if self._writes_until is None:
                self._opened_at = None
        if was_open:
            log.warning("artifactstore: %s answers again after %.0f s; using it", self.name, down)

    def failure(self, cause: str, *, write: bool = False, said: bool = False) -> bool:
        """A call failed (`write`: a write, which opens it for writes only). Whether it
        opened; `said`: the caller said the failure in its own line (no second one)."""
        prefix = f"{self.name} unavailable ("  # said once: "index unavailable (...)"
        if cause.startswith(prefix) and cause.endswith(")"):
            cause = cause[len(prefix) : -1]
        with self._lock:
            self._consecutive += 1
            probe_failed = self._probing
            self._probing = False
            if not probe_failed and self._consecutive < self.failures:
                return False
            first = self._opened_at is None
            if first:
                self._opened_at = self._clock()
            until = self._clock() + self.cooldown_secs
            if write:
                self._writes_until = until
            else:
                self._open_until = until
            self.opened += 1
        if self.on_open is not None:
            self.on_open()
        if first and not said:
            line = "artifactstore: %s unavailable (%s); %s, trying again every %g s"
            then = "not storing in it" if write else "compiling without it"
            log.warning(line, self.name, cause, then, self.cooldown_secs)
        else:
            log.debug("artifactstore: %s still unavailable (%s)", self.name, cause)
        return True


def describe(exc: BaseException, timeout_secs: float) -> str:
    """A failed call's cause, for a breaker's line (no secrets: errors carry none)."""
    if isinstance(exc, TimeoutError):
        return f"no answer within the {timeout_secs:g} s bound"
    if isinstance(exc, ArtstoreError):
        return str(exc)
    return one_line(exc)


def per_backend(settings: Settings) -> dict[str, Breaker]:
    """A breaker for each backend, as ARTSTORE_BREAKER_FAILURES and _COOLDOWN say."""
    return {
        name: Breaker(
            name, failures=settings.breaker_failures, cooldown_secs=settings.breaker_cooldown_secs
        )
        for name in BACKENDS
    }


def allow_all(breakers: Iterable[Breaker], *, write: bool = False) -> bool:
    """Whether every one of `breakers` lets a call through; a probe one of them granted
    is given back when another refuses (the call is not made: no verdict)."""
    probes: list[Breaker] = []
    for breaker in breakers:
        admitted = breaker.admit(write=write)
        if admitted is None:
            for probe in probes:
                probe.release_probe()
            return False
        if admitted:
            probes.append(breaker)
    return True
