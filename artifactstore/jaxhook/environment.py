"""Activation without code: the store in a process whose environment asks for it.

`artifactstore_startup` (a .pth file, or the sitecustomize of `artstore run`) calls
`activate()` once the program imports JAX. Nothing here may stop the program: a bad
setting or an unreachable store is one log line, and the program compiles as usual.
Under `artstore run` (or the pytest plugin) the process also keeps its record
(`artifactstore.runtime.summary`) up to date: after every load or compile, since
multiprocessing workers end without atexit, and once more at exit.
"""

from __future__ import annotations

import atexit
import os
import sys
from pathlib import Path

from artifactstore.jaxhook import api
from artifactstore.jaxhook import compile as _compile
from artifactstore.runtime import summary
from artifactstore.runtime.session import warn_once


def activate() -> None:
    """Configure from the environment unless the program does (an explicit `configure()`
    wins, before or after)."""
    try:
        settings = api.configure_from_environment()
    except Exception as exc:
        warn_once("environment", "could not activate the store (%s); compiling as usual", exc)
        return
    if settings is None:
        return
    report_dir = os.environ.get(summary.ENV_VAR)
    if report_dir:
        records = Path(report_dir)
        session = _compile.current()
        if session is not None:
            session.on_change = lambda: _write(records)
        atexit.register(_finish_and_write, records)
    if "multiprocessing" in sys.modules:
        # A multiprocessing child ends with os._exit, after its finalizers but without
        # atexit: flush its uploads there (a worker killed by Pool.terminate cannot).
        from multiprocessing import util

        util.Finalize(
            None, _finish_and_write, args=(Path(report_dir),) if report_dir else (), exitpriority=10
        )


def record_now() -> None:
    """Leave this process's record now (at the end of a pytest session), if it has one."""
    report_dir = os.environ.get(summary.ENV_VAR)
    if report_dir and api.process_stats():
        _finish_and_write(Path(report_dir))


def _write(records: Path) -> None:
    try:
        summary.write_record(records, api.process_stats())
    except Exception as exc:
        warn_once("environment", "could not write this process's summary record (%s)", exc)


def _finish_and_write(records: Path | None = None) -> None:
    """Uploads flushed first (within their bound), so the record counts them; a program
    that called `configure()` itself is counted with its own session."""
    try:
        api.finish()
    except Exception as exc:
        warn_once("environment", "could not finish the store's work (%s)", exc)
    if records is not None:
        _write(records)
