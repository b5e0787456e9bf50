"""A daemon worker that keeps uploads and access bookkeeping off the user's thread.

Work items are plain callables. `drain(timeout)` waits for everything queued so
far, and never longer than `timeout`: at interpreter exit a slow object store
delays the program by at most the flush bound, and what was not stored is
reported instead of silently dropped. Where no thread can be started (Python
3.12+ refuses new threads once the interpreter shuts down), `drain` runs the
queued work on the calling thread, still checking the bound between items.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import TypeVar

log = logging.getLogger("artifactstore")

T = TypeVar("T")


class Worker:
    def __init__(
        self, name: str, *, tick_secs: float = 5.0, on_tick: Callable[[], None] | None = None
    ) -> None:
        self._queue: queue.Queue[tuple[str, Callable[[], None]] | None] = queue.Queue()
        self._name = name
        self._tick_secs = tick_secs
        self._on_tick = on_tick
        self._pending = 0
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def _ensure_started(self) -> bool:
        with self._start_lock:
            if self._thread is None or not self._thread.is_alive():
                thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                try:
                    thread.start()
                except RuntimeError:  # interpreter shutdown: drain() runs the queue itself
                    return False
                self._thread = thread
        return True

    def submit(self, label: str, fn: Callable[[], None]) -> None:
        with self._cond:
            self._pending += 1
        self._queue.put((label, fn))
        self._ensure_started()

    def pending(self) -> int:
        with self._cond:
            return self._pending

    def _run(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=self._tick_secs)
            except queue.Empty:
                self._tick()
                continue
            if item is None:
                return
            self._execute(*item)

    def _execute(self, label: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as exc:  # reported, never raised into the program
            log.debug("artifactstore: background task %s failed: %s", label, exc)
        finally:
            with self._cond:
                self._pending -= 1
                self._cond.notify_all()

    def _tick(self) -> None:
        if self._on_tick is not None:
            try:
                self._on_tick()
            except Exception as exc:
                log.debug("artifactstore: periodic flush failed: %s", exc)

    def drain(self, timeout: float) -> bool:
        """Wait until everything submitted so far ran; False if the bound ran out."""
        deadline = time.monotonic() + timeout
        if not self._ensure_started():
            while time.monotonic() < deadline:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    self._execute(*item)
        with self._cond:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True


def call_with_timeout(fn: Callable[[], T], timeout: float) -> T:
    """Run fn in a daemon thread; raise TimeoutError if it has not returned in time.

    A daemon thread, unlike a ThreadPoolExecutor's, cannot keep a hung network
    call from letting the interpreter exit.
    """
    box: dict[str, object] = {}
    done = threading.Event()

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=target, name="artifactstore-call", daemon=True).start()
    if not done.wait(timeout):
        raise TimeoutError(f"no answer within {timeout:g} s")
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]


class Breaker:
    """A circuit breaker: after `failures` consecutive failures, refuse calls for
    `cooldown_secs` (they cost nothing), then let exactly one probe through; its
    success closes the breaker, its failure opens it for another cool-down.

    Callers ask `allow()` before a call and report `success()` or `failure()`
    after it (a probe that never reports just waits for the next cool-down).
    One warning when it first opens and one when it closes again, so a long
    outage is one line, not one per call or per cool-down.
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
        self._open_until: float | None = None
        self._probing = False
        self._opened_at: float | None = None
        self.opened = 0  # times it opened
        self.on_open: Callable[[], None] | None = None  # told each time it opens (metrics)
        self.refused = 0  # calls refused while open

    @property
    def closed(self) -> bool:
        with self._lock:
            return self._open_until is None

    def allow(self) -> bool:
        with self._lock:
            if self._open_until is None:
                return True
            now = self._clock()
            if now < self._open_until:
                self.refused += 1
                return False
            # This caller is the probe; others wait another cool-down (also if the
            # probe never reports back).
            self._open_until = now + self.cooldown_secs
            self._probing = True
            return True

    def release_probe(self) -> None:
        """The probe call did not reach this backend (a miss never fetches an object): let
        the next call probe at once instead of waiting another cool-down for a verdict."""
        with self._lock:
            if self._probing:
                self._probing = False
                self._open_until = self._clock()

    def success(self) -> None:
        with self._lock:
            was_open = self._open_until is not None
            self._consecutive, self._open_until, self._probing = 0, None, False
            down = self._clock() - self._opened_at if self._opened_at is not None else 0.0
            self._opened_at = None
        if was_open:
            log.warning("artifactstore: %s answers again after %.0f s; using it", self.name, down)

    def failure(self, cause: str) -> None:
        with self._lock:
            self._consecutive += 1
            probe_failed = self._probing
            self._probing = False
            if not probe_failed and self._consecutive < self.failures:
                return
            first = self._opened_at is None
            if first:
                self._opened_at = self._clock()
            self._open_until = self._clock() + self.cooldown_secs
            self.opened += 1
        if self.on_open is not None:
            self.on_open()
        if first:
            log.warning(
                "artifactstore: %s unavailable (%s); compiling without it, trying again every %g s",
                self.name,
                cause,
                self.cooldown_secs,
            )
        else:
            log.debug("artifactstore: %s still unavailable (%s)", self.name, cause)
