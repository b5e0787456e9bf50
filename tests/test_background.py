"""The process's one executor (process.background) at exit: quiet after the flush."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from conftest import PROGRAMS

from artifactstore.process.background import Executor


def test_no_store_work_races_the_interpreters_exit() -> None:
    """A periodic task still creating finalizers at exit (urllib3 does for each new
    pool) no longer changes weakref's registry while its exit hook reads it."""
    for _ in range(3):  # 3 of 3 runs printed the traceback before
        program = [sys.executable, str(PROGRAMS / "exit_churn.py")]
        proc = subprocess.run(program, capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 0 and '"finalizers"' in proc.stdout, proc.stderr
        assert "Traceback" not in proc.stderr, proc.stderr
        assert "Exception ignored" not in proc.stderr, proc.stderr


def test_quiesce_stops_timers_and_waits_for_running_work() -> None:
    pool = Executor()
    fired: list[str] = []
    started, release = threading.Event(), threading.Event()

    def running() -> None:
        started.set()
        release.wait(10)
        fired.append("running ended")

    pool.every(0.01, lambda: fired.append("tick"))
    pool.submit(running)
    assert started.wait(10)
    threading.Timer(0.2, release.set).start()
    pool.quiesce(timeout=10)
    assert fired[-1] == "running ended"  # waited for it
    seen = len(fired)
    late = pool.later(0.0, lambda: fired.append("later"))
    time.sleep(0.1)
    assert late.cancelled and len(fired) == seen  # no timer fires once quiet


def test_quiesce_waits_no_longer_than_its_bound() -> None:
    """It returns while a hung call still runs (the call ends only when released)."""
    pool = Executor()
    release = threading.Event()
    task = pool.submit(lambda: release.wait(60))
    pool.quiesce(timeout=0.3)
    still_running = not task.wait(0)
    release.set()
    assert still_running


def test_quiesce_waits_for_nothing_once_the_exit_flush_spent_its_bound() -> None:
    """A hung upload the exit flush gave up on delays the exit by the flush bound alone
    (the serial faults test measured F + 2 s before this): with a 60 s allowance, it
    still returns while the call runs."""
    pool = Executor()
    release = threading.Event()
    task = pool.submit(lambda: release.wait(60))
    pool.spend_exit_wait()
    pool.quiesce(timeout=60)
    still_running = not task.wait(0)
    release.set()
    assert still_running
