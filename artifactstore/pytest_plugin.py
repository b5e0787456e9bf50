"""pytest plugin: the test session's JAX compiles come from the store (opt-in).

Registered through the `pytest11` entry point, so pytest loads it in every session of
an environment that has artifactstore; it does nothing unless asked, with
`pytest -p artifactstore` or `pytest --artstore` (`--artstore-read-only`: load only;
`--artstore-namespace NS`). Then the session activates the store
as `artstore run` does: in the pytest process, in every pytest-xdist worker and in
every Python process a test starts, with the `ARTSTORE_*` settings of the environment.
Each process leaves a record (`artifactstore.runtime.summary`), and the terminal report ends
with one line: hits, compiles, compile seconds saved.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

_SAVED_ENV = pytest.StashKey[dict[str, str | None]]()
_RECORDS = pytest.StashKey[Path]()
_VARS = (
    "ARTSTORE_ACTIVATE",
    "ARTSTORE_RUN",
    "PYTHONPATH",
    "ARTSTORE_READ_ONLY",
    "ARTSTORE_NAMESPACE",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("artifactstore", "compiled JAX executables from artifactstore")
    group.addoption(
        "--artstore",
        action="store_true",
        default=False,
        help="Load JAX compiles from the store (ARTSTORE_* settings) and store new ones, in "
        "this session, its xdist workers and the processes tests start (as -p artifactstore).",
    )
    group.addoption(
        "--artstore-read-only",
        action="store_true",
        default=False,
        help="As --artstore, but only load: store nothing (ARTSTORE_READ_ONLY=1), e.g. for "
        "CI jobs of untrusted branches.",
    )
    group.addoption(
        "--artstore-namespace",
        default=None,
        metavar="NS",
        help="As --artstore, in namespace NS of the store (ARTSTORE_NAMESPACE).",
    )


def _enabled(config: pytest.Config) -> bool:
    plugins = config.getoption("plugins", default=None) or []
    asked = ("artstore", "artstore_read_only", "artstore_namespace")
    return any(config.getoption(name, default=None) for name in asked) or "artifactstore" in plugins


def _overrides(config: pytest.Config) -> dict[str, Any]:
    """The command line's store settings, as `artstore run --read-only --namespace` takes them."""
    return {
        "read_only": True if config.getoption("artstore_read_only", default=False) else None,
        "namespace": config.getoption("artstore_namespace", default=None),
    }


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _is_xdist_controller(config: pytest.Config) -> bool:
    """Tests run in workers: xdist's own test (`-n N`, or `--tx`/`--dist`; not `-n 0`,
    not `--collect-only`), set by its pytest_cmdline_main before any pytest_configure."""
    if _is_worker(config) or config.getoption("dist", "no") == "no":
        return False
    return not config.getoption("collectonly", False)


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    if not _enabled(config):
        return
    from artifactstore.runtime import run, summary

    if not _is_worker(config):  # workers inherit all of this from the controller
        records = Path(tempfile.mkdtemp(prefix="artstore-pytest-"))
        config.stash[_RECORDS] = records
        # Removed at exit, not at unconfigure: this process writes its record once more
        # at exit (artifactstore.jaxhook.environment registers that on activation, after
        # this, and atexit runs last in, first out), and xdist has waited for its workers.
        atexit.register(shutil.rmtree, records, ignore_errors=True)
        config.stash[_SAVED_ENV] = {name: os.environ.get(name) for name in _VARS}
        env = run.store_env(_overrides(config))
        env.pop("ARTSTORE_WARM", None)
        env[summary.ENV_VAR] = str(records)
        os.environ.update({name: env[name] for name in _VARS if name in env})
    if not _is_xdist_controller(config):  # the controller runs no tests
        run.startup_module().arm("environment")


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Leave this process's record now (uploads flushed): an xdist worker's atexit may
    come after the controller has printed its summary."""
    config = session.config
    if not _enabled(config) or _is_xdist_controller(config) or "jax" not in sys.modules:
        return  # no JAX imported: not activated, nothing to record
    from artifactstore.jaxhook import environment

    environment.record_now()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    records = config.stash.get(_RECORDS, None)
    if records is None:
        return
    from artifactstore.runtime import summary

    line = summary.Summary.of(summary.read_records(records)).render("artifactstore")
    terminalreporter.write_sep("-", "artifactstore")
    terminalreporter.write_line(line)


def pytest_unconfigure(config: pytest.Config) -> None:
    saved = config.stash.get(_SAVED_ENV, None)
    if saved is not None:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
