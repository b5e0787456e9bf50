"""The process's one background executor: every thread the store starts is one of its.

Why one: uploads, lease heartbeats, bounded store calls, loading ahead, named set-ups
and timers each started threads of their own (a new one per bounded store call). Here
a few daemon threads, started as work needs them and reused, run every `Task`, at most
MAX_THREADS at once (more wait their turn), and one timer thread runs what is due later
(`later`, `every`). Daemon threads: a hung network call never keeps the program from
exiting. Ordered queues of work on these threads are `process.lanes`.

Python 3.12+ refuses new threads once the interpreter shuts down: `submit` then raises
RuntimeError (unless an idle thread takes the task), and callers run the work on their
own thread instead (`lanes.Lane.drain`). Tasks submitted with `joined=True` (those that
must not outlive the interpreter: deserializing, tracing) are waited for at exit, where
concurrent.futures joins its pools, at most EXIT_WAIT_SECS. After the process's own exit
hooks (the store's flush among them) the executor goes quiet: no timer fires again and
the work still running gets EXIT_QUIET_SECS to end, so that no periodic flush opens a
connection while the interpreter runs `weakref.finalize`'s exit hook (whose registry,
changed from another thread, printed "dictionary changed size during iteration").
"""

from __future__ import annotations

import atexit
import heapq
import itertools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

log = logging.getLogger("artifactstore")

T = TypeVar("T")

MAX_THREADS = 128  # `artstore pull --jobs` takes up to 64; a program uses a handful
IDLE_SECS = 60.0  # a thread with nothing to do this long ends
EXIT_WAIT_SECS = 30.0  # joined tasks still running at exit are waited for this long
EXIT_QUIET_SECS = 2.0  # other running work, after the exit hooks, at most this long
# (nothing, where the exit flush ran out of its bound already: `spend_exit_wait`)


class Task(Generic[T]):
    """One callable on the executor: queued, running, then done (or cancelled)."""

    def __init__(self, fn: Callable[[], T], label: str = "", *, joined: bool = False) -> None:
        self.fn = fn
        self.label = label  # a failure is a debug line naming it; none: the caller reads it
        self.joined = joined  # waited for at exit
        self.state = "queued"  # -> running -> done; or cancelled while queued
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._value: T | None = None
        self._error: BaseException | None = None

    def run(self) -> None:
        with self._lock:
            if self.state != "queued":
                return
            self.state = "running"
        try:
            self._value = self.fn()
        except BaseException as exc:  # kept for `result`; never raised on a pool thread
            self._error = exc
            if self.label:
                log.debug("artifactstore: background task %s failed: %s", self.label, exc)
        finally:
            self.state = "done"
            self._done.set()

    def cancel(self) -> bool:
        """Drop the task if it has not started; whether it was dropped."""
        with self._lock:
            if self.state != "queued":
                return False
            self.state = "cancelled"
        self._done.set()
        return True

    def wait(self, timeout: float | None = None) -> bool:
        """Whether it ended (ran, failed or was cancelled) within `timeout`."""
        return self._done.wait(timeout)

    def result(self, timeout: float | None = None) -> T:
        """What it returned; what it raised is raised; TimeoutError if not done in time."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"no answer within {timeout:g} s")
        if self._error is not None:
            raise self._error
        if self.state == "cancelled":
            raise TimeoutError("not started")
        return self._value  # type: ignore[return-value]


class Timer:
    """A call due later (`Executor.later`), or every `period` seconds (`every`)."""

    def __init__(self, fn: Callable[[], object], period: float | None) -> None:
        self.fn = fn
        self.period = period
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Executor:
    def __init__(self, max_threads: int = MAX_THREADS, idle_secs: float = IDLE_SECS) -> None:
        self.max_threads = max_threads
        self.idle_secs = idle_secs
        self.started = 0  # threads started, ever (thread counts: tests, measurements)
        self._exit_hook = False
        self._reset()

    def _reset(self) -> None:
        """Empty, with new locks: at start, and in a forked child (which has none of the
        parent's threads, and maybe a lock one of them held)."""
        self.generation = getattr(self, "generation", -1) + 1  # lanes compare it (forks)
        self._lock = threading.Lock()
        self._timers = threading.Condition(self._lock)  # the timer thread waits on it
        self._work: deque[Task[Any]] = deque()
        self._threads = 0  # alive
        # Threads waiting for work, each on its own condition: the newest is woken first,
        # so that a trickle of work keeps one thread busy and lets the others end.
        self._idle: list[threading.Condition] = []
        self._joined: set[Task[Any]] = set()
        self._due: list[tuple[float, int, Timer]] = []  # a heap, for the timer thread
        self._order = itertools.count()
        self._timer_thread = False
        self._running = 0  # tasks running now
        self._firing = False  # the timer thread is submitting a due timer's work
        self._quiet = False  # exiting: timers fire no more
        self._exit_wait = True  # `quiesce` may still wait (the exit flush kept its bound)

    def submit(self, fn: Callable[[], T], label: str = "", *, joined: bool = False) -> Task[T]:
        """Run `fn` on a pool thread. RuntimeError where none can take it (shutdown)."""
        task: Task[T] = Task(fn, label, joined=joined)
        if joined and not self._exit_hook:
            self._exit_hook = True
            _before_exit(self.wait_for_joined)
        with self._lock:
            if joined:
                self._joined.add(task)
            self._work.append(task)
            if self._idle:
                self._idle.pop().notify()
                return task
            if self._threads >= self.max_threads:
                return task  # the next thread that is free takes it
            self._threads += 1
        try:
            self._start(self._serve, "artifactstore-background")
        except RuntimeError:
            with self._lock:
                self._threads -= 1
                if task in self._work:
                    self._work.remove(task)
                self._joined.discard(task)
            raise
        return task

    def call(self, fn: Callable[[], T], timeout: float) -> T:
        """`fn()` on a pool thread; TimeoutError if it has not returned within `timeout`
        (a call still queued then never runs; one running is left to finish on its own)."""
        task = self.submit(fn)
        if not task.wait(timeout):
            task.cancel()
            raise TimeoutError(f"no answer within {timeout:g} s")
        return task.result()

    def later(self, secs: float, fn: Callable[[], object]) -> Timer:
        """Submit `fn` once, `secs` from now, unless the returned timer is cancelled."""
        return self._schedule(Timer(fn, None), secs)

    def every(self, secs: float, fn: Callable[[], object]) -> Timer:
        """Submit `fn` every `secs`, the first time `secs` from now, until cancelled (or
        until `fn` returns False)."""
        return self._schedule(Timer(fn, secs), secs)

    def wait_for_joined(self, timeout: float = EXIT_WAIT_SECS) -> None:
        """At exit: let joined tasks (deserializing, tracing) end before the interpreter."""
        deadline = time.monotonic() + timeout
        with self._lock:
            tasks = list(self._joined)
        for task in tasks:
            task.wait(max(0.0, deadline - time.monotonic()))

    def spend_exit_wait(self) -> None:
        """The exit flush used its whole bound (ARTSTORE_FLUSH_TIMEOUT): `quiesce` waits for
        nothing more, so that a hung upload delays the exit by that bound alone."""
        self._exit_wait = False

    def quiesce(self, timeout: float = EXIT_QUIET_SECS) -> None:
        """At exit, after the exit hooks that flush: timers fire no more, and the work
        queued or running (a tick, a call whose caller gave up) gets `timeout` to end."""
        deadline = time.monotonic() + (timeout if self._exit_wait else 0.0)
        with self._lock:
            self._quiet = True
            self._due.clear()
            self._timers.notify_all()
            while self._running or self._work or self._firing:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._timers.wait(left)

    # -- the threads --------------------------------------------------------------
    def _start(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self.started += 1

    def _serve(self) -> None:
        me = threading.Condition(self._lock)
        while True:
            with self._lock:
                while not self._work:
                    self._idle.append(me)
                    me.wait(self.idle_secs)
                    if me in self._idle:  # not woken for work: idle for IDLE_SECS
                        self._idle.remove(me)
                        if not self._work:
                            self._threads -= 1
                            return
                task = self._work.popleft()
                self._running += 1
            try:
                task.run()
            finally:
                with self._lock:
                    self._running -= 1
                    self._timers.notify_all()
            if task.joined:
                with self._lock:
                    self._joined.discard(task)

    def _schedule(self, timer: Timer, secs: float) -> Timer:
        with self._lock:
            if self._quiet:
                timer.cancel()
                return timer
            heapq.heappush(self._due, (time.monotonic() + secs, next(self._order), timer))
            start, self._timer_thread = not self._timer_thread, True
            self._timers.notify()  # the timer thread may now have an earlier one
        if start:
            try:
                self._start(self._tick, "artifactstore-timers")
            except RuntimeError:  # shutdown: nothing is due any more
                with self._lock:
                    self._timer_thread = False
        return timer

    def _tick(self) -> None:
        """The timer thread: submit each timer when it is due."""
        while True:
            with self._lock:
                while not self._due or self._due[0][0] > time.monotonic():
                    if self._quiet:
                        self._timer_thread = False
                        return
                    left = self._due[0][0] - time.monotonic() if self._due else None
                    self._timers.wait(left)
                _, _, timer = heapq.heappop(self._due)
                if timer.cancelled:
                    continue
                self._firing = True  # `quiesce` waits until its work is queued
            try:
                self._fire(timer)
            except RuntimeError:
                return  # the interpreter is exiting
            finally:
                with self._lock:
                    self._firing = False
                    self._timers.notify_all()

    def _fire(self, timer: Timer) -> None:
        """Submit a due timer's work (and, for a periodic one, its next time after it)."""
        if timer.period is not None:

            def again(timer: Timer = timer) -> None:
                if not timer.cancelled and timer.fn() is not False:
                    self._schedule(timer, timer.period or 0.0)

            job: Callable[[], object] = again
        else:
            job = timer.fn
        self.submit(job, "timer")


def _before_exit(hook: Callable[[], None]) -> None:
    """Run `hook` at exit where concurrent.futures joins its pools: before atexit's hooks
    (JAX's among them tear down the backend a deserialization may still be using)."""
    try:
        threading._register_atexit(hook)  # type: ignore[attr-defined]
    except (AttributeError, RuntimeError):  # older, or exiting already
        atexit.register(hook)


_executor = Executor()
os.register_at_fork(after_in_child=_executor._reset)
# Registered first, so run last of threading's exit hooks (newest first): after the
# store's flush and the joined tasks.
_before_exit(_executor.quiesce)


def executor() -> Executor:
    """The process's executor."""
    return _executor


def call_with_timeout(fn: Callable[[], T], timeout: float) -> T:
    """`fn()` on the executor, within `timeout` seconds (`Executor.call`)."""
    return _executor.call(fn, timeout)
