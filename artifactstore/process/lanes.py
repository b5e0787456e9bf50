"""Queues of work on the process's executor: in order, at most `threads` at once.

Why: a store's uploads must run one after another off the program's thread, and be
finished within a bound at exit; its lease bookkeeping too; a load ahead deserializes
a few executables at once, `artstore pull` fetches `--jobs` at a time. Each is a
`Lane` on the one executor (process.background), not a queue and threads of its own.

`drain(timeout)` waits for everything submitted so far, never longer than `timeout`:
at interpreter exit a slow object store delays the program by at most the flush bound,
and what was not stored is reported instead of silently dropped. Where no thread takes
the lane's work (Python 3.12+ refuses new threads once the interpreter shuts down, or
every thread is busy), `drain` runs the queued work on the calling thread, still
checking the bound between items. A tick (`on_tick`, every `tick_secs` once the lane
has had work) runs in the lane like any item, but nobody waits for it.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from artifactstore.process.background import Executor, Task, Timer, executor

log = logging.getLogger("artifactstore")
T = TypeVar("T")

Item = tuple[str, Callable[[], object], bool]  # label, work, counted (a tick is not)


@dataclass(frozen=True)
class Tick:
    """Work a lane queues every `every_secs` while it has been used (a periodic flush)."""

    every_secs: float
    fn: Callable[[], None]


class Lane:
    def __init__(
        self,
        name: str,
        threads: int = 1,
        *,
        tick: Tick | None = None,
        joined: bool = False,
        keep_refused: bool = True,
        pool: Executor | None = None,
    ) -> None:
        """`joined`: its work must not outlive the interpreter (waited for at exit).
        `keep_refused`: work no thread takes (at exit) waits for `drain`; else `submit`
        drops it and says so."""
        self.name = name
        self.threads = threads
        self._ticks = tick
        self._joined = joined
        self._keep_refused = keep_refused
        self._pool = pool or executor()
        self._generation = self._pool.generation
        self._lock = threading.Condition()
        self._items: deque[Item] = deque()
        self._pending = 0  # counted items queued or running
        # Who runs its items now: each a task on the executor (queued or running), or
        # None (a drain's caller, or a task being submitted).
        self._runners: dict[object, Task[None] | None] = {}
        self._ticking: Timer | None = None
        self._tick_queued = False

    def submit(self, label: str, fn: Callable[[], object]) -> bool:
        """Queue `fn`; it runs after everything queued before it (one thread), or beside
        it (more). A failure is a debug line, never raised into the program. False: no
        thread takes it now (the interpreter is exiting)."""
        taken = self._enqueue((label, fn, True))
        if self._ticks is not None and self._ticking is None:
            self._ticking = self._pool.every(self._ticks.every_secs, _weak_tick(self))
        return taken

    def pending(self) -> int:
        with self._lock:
            return self._pending

    def drain(self, timeout: float | None) -> bool:
        """Wait until everything submitted so far ran; False if the bound ran out (None:
        no bound)."""
        deadline = time.monotonic() + (timeout if timeout is not None else 1e9)
        caller = object()
        with self._lock:
            # A runner the executor has not started (no thread free for it): this thread
            # runs in its place.
            for runner, task in list(self._runners.items()):
                if self._items and task is not None and task.cancel():
                    del self._runners[runner]
                    break
            mine = len(self._runners) < self.threads and bool(self._items)
            if mine:
                self._runners[caller] = None
        if mine:
            self._serve(caller, deadline)
        with self._lock:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
        return True

    def close(self) -> None:
        """No more ticks (a store that is closed)."""
        if self._ticking is not None:
            self._ticking.cancel()

    # -- running ------------------------------------------------------------------
    def _enqueue(self, item: Item) -> bool:
        with self._lock:
            if self._generation != self._pool.generation:  # a forked child: no runners
                self._generation, self._runners, self._ticking = self._pool.generation, {}, None
            self._items.append(item)
            self._pending += item[2]
            if len(self._runners) >= self.threads:
                return True
            runner = object()
            self._runners[runner] = None
        try:
            task = self._pool.submit(lambda: self._serve(runner), joined=self._joined)
        except RuntimeError:  # interpreter shutdown: `drain` runs the queue itself
            with self._lock:
                self._runners.pop(runner, None)
                if self._runners:
                    return True  # a runner still at work takes it
                if not self._keep_refused and item in self._items:
                    self._items.remove(item)
                    self._pending -= item[2]
            return False
        with self._lock:
            if runner in self._runners:  # else it ran and ended already
                self._runners[runner] = task
        return True

    def _serve(self, me: object, deadline: float | None = None) -> None:
        """Run queued items until there are none (or `deadline` passed: a drain's)."""
        while True:
            with self._lock:
                if not self._items or (deadline is not None and time.monotonic() >= deadline):
                    self._runners.pop(me, None)
                    return
                label, fn, counted = self._items.popleft()
                if not counted:
                    self._tick_queued = False
            try:
                fn()
            except Exception as exc:  # reported, never raised into the program
                log.debug("artifactstore: background task %s failed: %s", label, exc)
            finally:
                if counted:
                    with self._lock:
                        self._pending -= 1
                        self._lock.notify_all()

    def _tick(self) -> None:
        """Queue the periodic work, unless the last tick is still queued."""
        with self._lock:
            if self._tick_queued or self._ticks is None:
                return
            self._tick_queued = True
        self._enqueue((f"{self.name} tick", self._ticks.fn, False))


def run_all(name: str, calls: Sequence[Callable[[], T]], threads: int) -> list[T]:
    """What each of `calls` returned, in order, run at most `threads` at once (and on
    joined threads: work the caller waits for is not cut off by exit); the first
    failure, in order, is raised once all have ended."""
    done: list[tuple[T | None, BaseException | None]] = [(None, None)] * len(calls)

    def one(i: int) -> None:
        try:
            done[i] = (calls[i](), None)
        except BaseException as exc:
            done[i] = (None, exc)

    lane = Lane(name, threads, joined=True)
    for i in range(len(calls)):
        lane.submit(name, functools.partial(one, i))
    lane.drain(None)
    for _, error in done:
        if error is not None:
            raise error
    return [value for value, _ in done]  # type: ignore[misc]


def _weak_tick(lane: Lane) -> Callable[[], bool]:
    """The lane's tick, for the timer: it stops (False) once the lane is gone."""
    ref = weakref.ref(lane)

    def tick() -> bool:
        alive = ref()
        if alive is None:
            return False
        alive._tick()
        return True

    return tick
