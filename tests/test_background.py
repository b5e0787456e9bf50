"""The process's one executor (store.background) at exit: quiet after the flush."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from conftest import PROGRAMS

from artifactstore.store.background import Executor


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
    pool = Executor()
    release = threading.Event()
    pool.submit(lambda: release.wait(30))
    begun = time.monotonic()
    pool.quiesce(timeout=0.3)
    waited = time.monotonic() - begun
    release.set()
    assert 0.2 <= waited < 10  # bounded: a hung call does not hold the exit
