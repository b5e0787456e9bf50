"""SIGTERM ends a test session as Ctrl-C does: with its teardown.

A CI job's timeout, or `kill`, sends SIGTERM, whose default ends a Python process at once:
what the session started stayed behind (the moto server, the tests' PostgreSQL databases,
which teardown drops, the temporary folders and fork servers, which exit removes). Here the
first SIGTERM raises KeyboardInterrupt in the main thread, so pytest tears the fixtures down
and the process exits through atexit, as after Ctrl-C. Later SIGTERMs are ignored while that
runs: one sent to the whole process group (`timeout` does) and the controller's below would
otherwise cut it short; SIGKILL still ends everything.

Under pytest-xdist the workers run the tests and hold those things, and the controller ends
them (execnet) 10 s after its own session ends, cutting a slow teardown short. So a controller
passes SIGTERM on to its workers and waits (up to STOP_SECS) for them to exit; a worker
stopped by SIGTERM exits as soon as its session is torn down and atexit has run.
Loaded by tests/conftest.py (`pytest_plugins`).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
import time
from pathlib import Path
from types import FrameType

import pytest

STOP_SECS = 120.0
STOPPED = pytest.StashKey[bool]()


def _stat(pid: int | str) -> list[str]:
    """The fields of /proc/PID/stat after the command name (state, parent, ...); [] if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def running(pid: int) -> bool:
    """Whether `pid` runs (a zombie has ended). Linux's /proc."""
    return _stat(pid)[:1] not in ([], ["Z"])


def children(pid: int | None = None) -> list[int]:
    """The processes whose parent is `pid` (this one unless said). Linux's /proc, else none."""
    parent = str(pid or os.getpid())
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        if _stat(entry.name)[1:2] == [parent]:
            found.append(int(entry.name))
    return found


def _stop_workers() -> None:
    workers = children()
    for pid in workers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_SECS
    while any(running(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)


def pytest_configure(config: pytest.Config) -> None:
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers are the main thread's

    def interrupt(signum: int, frame: FrameType | None) -> None:
        if config.stash.get(STOPPED, False):
            return
        config.stash[STOPPED] = True
        if config.pluginmanager.has_plugin("dsession"):  # an xdist controller
            _stop_workers()
        raise KeyboardInterrupt("SIGTERM")

    signal.signal(signal.SIGTERM, interrupt)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput") and config.stash.get(STOPPED, False):
        atexit._run_exitfuncs()
        os._exit(pytest.ExitCode.INTERRUPTED)
