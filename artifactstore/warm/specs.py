"""`artstore warm MODULE:FUNCTION`: compile the listed specializations in worker processes.

Each worker (`python -m artifactstore.warm.worker`, a fresh interpreter: JAX
does not support fork) imports MODULE, announces the specializations' names
and fingerprint, then compiles the item indices it is sent, one JSON reply per
line. This module is the parent's side: the pool and the report (its progress
display is the CLI's, cli/warm_cmd.py).
"""

from __future__ import annotations

import json
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from artifactstore.errors import one_line
from artifactstore.warm import SUMMARY_FIELDS, TARGET_RE, WarmError
from artifactstore.warm.preflight import check_expected, child_env
from artifactstore.warm.report import Report, check_warmed_target

# Called with each result, how many are done and how many there are.
SpecProgress = Callable[[dict[str, Any], int, int], None]
# How long stopped workers have to end their compile and let go of their leases.
STOP_SECS = 10.0


class _Stopped(Exception):
    """The pool is stopping: no new worker."""


def run_specs(
    target: str,
    jobs: int,
    overrides: dict[str, Any],
    expected: dict[str, Any] | None,
    progress: Callable[[int], SpecProgress],
) -> Report:
    """Compile every specialization FUNCTION lists in `jobs` worker processes."""
    if not TARGET_RE.fullmatch(target):
        raise WarmError(
            f"invalid target {target!r}: use MODULE:FUNCTION "
            "(e.g. mypkg.shapes:specializations) or -- CMD [ARGS...]"
        )
    env = child_env(overrides)
    if jobs > 1:  # compile-only workers need no preallocated device memory
        env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    started = time.monotonic()
    logs = Path(tempfile.mkdtemp(prefix="artstore-warm-"))
    pool = _Pool(target, env, logs, jobs)
    try:
        pool.start()
        ready = pool.first_ready(expected)
        names = pool.names
        report = Report(
            what=f"{len(names)} specializations of {target} "
            f"({jobs} worker{'s' if jobs > 1 else ''})"
        )
        report.duplicates = int(ready.get("duplicates", 0))
        fp = ready["fingerprint"]
        report.fingerprints[fp["digest"]] = {
            "digest": fp["digest"],
            **{k: fp[k] for k in SUMMARY_FIELDS},
        }
        results = pool.results(progress(len(names)))
    except BaseException:
        # Interrupted, or failed: the workers stop (and let go of their compile leases)
        # and their threads end before the log directory goes.
        pool.stop()
        shutil.rmtree(logs, ignore_errors=True)
        raise
    pool.stop()
    for index, name in enumerate(names):
        res = results.get(index) or {
            "name": name,
            "status": "failed",
            "compile_secs": 0.0,
            "bytes": 0,
            "error": "not attempted: no worker left",
        }
        for event in res.pop("events", ()):  # what its worker did, counted as `-- CMD`'s
            report.add_event(event)
        report.items.append(res)
        if res["status"] == "failed":
            report.failed += 1
    if report.failed:  # the workers' own output, for whoever debugs the failures
        report.problems.append(f"worker logs kept in {logs}")
    else:
        shutil.rmtree(logs, ignore_errors=True)
    report.elapsed_secs = time.monotonic() - started
    check_warmed_target(report, expected)
    return report


class SpecWorkerProcess:
    """One `python -m artifactstore.warm.worker` process and its protocol pipe."""

    def __init__(self, target: str, env: dict[str, str], log: Path) -> None:
        self.log = log
        self._log_file = log.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "artifactstore.warm.worker", target],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log_file,
            text=True,
            bufsize=1,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._stdin: IO[str] = self.proc.stdin
        self._stdout: IO[str] = self.proc.stdout

    def recv(self) -> dict[str, Any] | None:
        line = self._stdout.readline()
        return json.loads(line) if line else None

    def send(self, index: int) -> bool:
        try:
            self._stdin.write(f"{index}\n")
            self._stdin.flush()
            return True
        except OSError:
            return False

    def close(self, timeout: float = 900) -> None:
        """End the worker's input (it finishes what it has) and wait for it to exit."""
        try:
            self._stdin.close()
        except OSError:
            pass
        self.kill(timeout)

    def terminate(self) -> None:
        """Ask the worker to stop: it ends its compile and lets go of its leases."""
        if self.proc.poll() is None:
            try:
                self.proc.terminate()
            except OSError:  # exited meanwhile
                pass

    def kill(self, timeout: float = 0.0) -> None:
        """Wait up to `timeout` for the worker to exit, then kill it."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log_file.close()

    def death(self) -> str:
        code = self.proc.wait()
        tail = [ln for ln in self.log.read_text(errors="replace").splitlines() if ln.strip()]
        last = f": {tail[-1].strip()[:200]}" if tail else ""
        return f"worker process exited with code {code}{last}"


class _Pool:
    """`jobs` workers; work starts as soon as the first is ready, the others join as they are.

    Item indices go to whichever worker is free. A worker that dies takes down
    only the item it was on: it is reported failed and a fresh worker takes its
    place for the rest.
    """

    def __init__(self, target: str, env: dict[str, str], logs: Path, jobs: int) -> None:
        self.target, self.env, self.logs = target, env, logs
        self.workers: list[SpecWorkerProcess] = []
        self._lock = threading.Lock()
        self._todo: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._events: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._go = threading.Event()
        self._abort = threading.Event()
        self.names: list[str] = []
        self.threads = [
            threading.Thread(target=self._drive, args=(i,), daemon=True) for i in range(jobs)
        ]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def _spawn(self, name: str) -> SpecWorkerProcess:
        with self._lock:
            if self._abort.is_set():
                raise _Stopped
            worker = SpecWorkerProcess(self.target, self.env, self.logs / f"{name}.log")
            self.workers.append(worker)
        return worker

    def stop(self, grace: float = STOP_SECS) -> None:
        """Stop every worker: SIGTERM first, so that each ends its compile and lets go of
        its compile leases, SIGKILL for any still running after `grace` seconds; then
        wait for the threads that drove them (a worker's thread ends with it)."""
        self._abort.set()
        self._go.set()
        with self._lock:
            workers = list(self.workers)
        for w in workers:
            w.terminate()
        deadline = time.monotonic() + grace
        for w in workers:
            w.kill(max(0.0, deadline - time.monotonic()))
        for t in self.threads:
            if t.is_alive():
                t.join(max(0.5, deadline - time.monotonic()))

    def first_ready(self, expected: dict[str, Any] | None) -> dict[str, Any]:
        """The first worker's announcement (names, fingerprint), checked; then work starts."""
        starting, death = len(self.threads), ""
        while True:
            kind, msg = self._events.get()
            if kind == "died":
                starting -= 1
                death = msg
                if starting == 0:
                    raise WarmError(f"could not start a warm worker: {death}")
                continue
            if kind == "fatal":
                raise WarmError(str(msg))
            if "fatal" in msg:
                raise WarmError(str(msg["fatal"]))
            if expected is not None:
                check_expected(msg["fingerprint"], expected)
            self.names = list(msg["ready"])
            for index in range(len(self.names)):
                self._todo.put(index)
            self._go.set()
            announced: dict[str, Any] = msg
            return announced

    def _drive(self, slot: int) -> None:
        """One worker slot's thread. Whatever it fails with ends as an event, never as a
        traceback; after `stop` (the workers and their logs are going away), silently."""
        announced = threading.Event()
        try:
            self._work(slot, announced)
        except Exception as exc:
            if self._abort.is_set():
                return
            why = f"warm worker thread failed: {one_line(exc)}"
            if announced.is_set():
                self._events.put(("fatal", why))
                return
            self._events.put(("died", why))
            self._go.wait()
            self._events.put(("done", None))

    def _work(self, slot: int, announced: threading.Event) -> None:
        worker = self._spawn(f"worker{slot}")
        ready = worker.recv()
        self._events.put(("died", worker.death()) if ready is None else ("ready", ready))
        announced.set()
        self._go.wait()
        if self._abort.is_set() or ready is None or "fatal" in ready:
            self._events.put(("done", None))
            return
        if ready["ready"] != self.names:
            self._events.put(
                (
                    "fatal",
                    "FUNCTION listed different specializations in "
                    "different worker processes: it must return the same list "
                    "every time it is called",
                )
            )
            return
        while not self._abort.is_set():
            try:
                index = self._todo.get_nowait()
            except queue.Empty:
                worker.close()
                break
            reply = worker.recv() if worker.send(index) else None
            if reply is not None:
                self._events.put(("result", (index, reply)))
                continue
            failure = {
                "name": self.names[index],
                "status": "failed",
                "compile_secs": 0.0,
                "bytes": 0,
                "error": worker.death(),
            }
            self._events.put(("result", (index, failure)))
            worker = self._spawn(f"worker{slot}-after-{index}")
            ready = worker.recv()
            if ready is None or "fatal" in ready:
                break
        self._events.put(("done", None))

    def results(self, progress: SpecProgress) -> dict[int, dict[str, Any]]:
        """Collect every result, reporting each as it arrives."""
        results: dict[int, dict[str, Any]] = {}
        running = len(self.threads)
        while running:
            kind, msg = self._events.get()
            if kind == "done":
                running -= 1
            elif kind == "fatal":
                raise WarmError(msg)
            elif kind == "result":
                index, res = msg
                res["name"] = self.names[index]
                results[index] = res
                progress(res, len(results), len(self.names))
        return results
