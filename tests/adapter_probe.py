"""Which lines of artifactstore's JAX adapter a process runs (tests/suite_rules.py).

While `--jax-record` is on, a `.pth` file imports this module in every Python process of
the test environment (pytest, its xdist workers, and every program a test starts). Where the
recording's config file exists, it watches the adapter's files with `sys.monitoring`
(Python >= 3.12): a code object outside them costs one event, ever; inside them each line
is noted once and its event disabled, so the programs run at nearly full speed.

A process other than the pytest ones writes what it ran at exit, with the chain of its
parent processes, so that the test that started it (somewhere up that chain) claims it.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
from types import CodeType
from typing import Any

TOOL = 4  # a free sys.monitoring tool id (0 debugger, 1 coverage, 2 profiler, 5 optimizer)
CONFIG = "config.json"
ran: set[tuple[str, int]] = set()  # (file relative to the package's parent, line)
_state: dict[str, Any] = {}


def parents() -> list[str]:
    """This process's pid and its ancestors', nearest first."""
    pids, pid = [], os.getpid()
    while pid > 1 and len(pids) < 32:
        pids.append(str(pid))
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids


def take() -> set[tuple[str, int]]:
    """The lines run since the last take (by this process), and watch for them again."""
    got = set(ran)
    ran.clear()
    if _state:
        sys.monitoring.restart_events()
    return got


def _on_start(code: CodeType, offset: int) -> Any:
    rel = _state["files"].get(code.co_filename)
    if rel is not None:
        sys.monitoring.set_local_events(TOOL, code, sys.monitoring.events.LINE)
    return sys.monitoring.DISABLE


def _on_line(code: CodeType, line: int) -> Any:
    rel = _state["files"].get(code.co_filename)
    if rel is not None:
        ran.add((rel, line))
    return sys.monitoring.DISABLE


def _write_at_exit(notes: str) -> None:
    if not ran or _state.get("claimed_in_process"):
        return
    try:
        with open(os.path.join(notes, f"{os.getpid()}.json"), "w") as f:
            json.dump({"parents": parents(), "lines": sorted(ran)}, f)
    except OSError:
        pass


def install(notes: str) -> None:
    """Watch the adapter's files listed in the recording's config (no-op without one)."""
    if _state or not hasattr(sys, "monitoring"):
        return
    try:
        with open(os.path.join(notes, CONFIG)) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return
    _state["files"] = dict(config["files"])
    sys.monitoring.use_tool_id(TOOL, "artifactstore-tests")
    sys.monitoring.register_callback(TOOL, sys.monitoring.events.PY_START, _on_start)
    sys.monitoring.register_callback(TOOL, sys.monitoring.events.LINE, _on_line)
    sys.monitoring.set_events(TOOL, sys.monitoring.events.PY_START)
    atexit.register(_write_at_exit, notes)


def claim_in_process() -> None:
    """A pytest process takes its own lines per test; it writes none at exit."""
    _state["claimed_in_process"] = True
