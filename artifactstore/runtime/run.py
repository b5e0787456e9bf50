"""`artstore run -- CMD`: CMD unchanged, with the store active in it and every Python child.

The reader-side sibling of `artstore warm -- CMD`, and what both share: the children's
environment puts the startup hook (`artifactstore/startup`) first on PYTHONPATH, so
each Python process activates the store when it imports JAX, as `configure()` would
with the environment's settings; each leaves a record (`summary`) for the one line
printed at the end. The parent never imports JAX.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

from artifactstore import config as _config
from artifactstore import interrupts
from artifactstore.errors import ArtstoreError, one_line
from artifactstore.runtime import summary

# The startup hook's directory: `sitecustomize.py` and `artifactstore_startup.py`.
STARTUP_DIR = Path(__file__).resolve().parents[1] / "startup"


class RunError(ArtstoreError):
    """CMD cannot be started; one line for the user."""


def store_env(overrides: dict[str, Any], env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (ours by default) with the command line's store settings and the startup hook."""
    env = dict(os.environ if env is None else env)
    env.update(_config.to_environment(overrides))
    # An inherited ARTSTORE_ACTIVATE=0 would keep it off; "off": a configuration that
    # cannot work, so CMD runs as it would without us.
    env["ARTSTORE_ACTIVATE"] = "0" if overrides.get("off") else "1"
    env["PYTHONPATH"] = os.pathsep.join(
        [str(STARTUP_DIR), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]
    )
    return env


def check_command(argv: list[str], env: dict[str, str]) -> None:
    if shutil.which(argv[0], path=env.get("PATH")) is None and not os.path.exists(argv[0]):
        raise RunError(f"command not found: {argv[0]!r}")


def run_forwarding_signals(argv: list[str], env: dict[str, str]) -> int:
    """Run CMD and return its exit code once it has exited.

    SIGINT and SIGTERM are passed on to CMD (a Ctrl-C on the terminal has reached it
    already, in our process group: not twice) and CMD is waited for, however long it
    takes to stop; a second signal kills it. Then the signal is raised here
    (KeyboardInterrupt, `interrupts.Terminated`): the callers' cleanup runs and
    `artstore` exits 130 / 143 whatever CMD's code was.
    """
    try:
        proc = subprocess.Popen(argv, env=env)
    except OSError as exc:
        raise RunError(f"cannot run {argv[0]!r}: {exc.strerror or one_line(exc)}") from None
    received: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        again = bool(received)
        received.append(signum)
        try:
            if again:
                proc.kill()
            elif signum != signal.SIGINT or not _terminal_delivered():
                proc.send_signal(signum)
        except OSError:  # exited meanwhile
            pass

    main = threading.current_thread() is threading.main_thread()
    previous = {s: signal.getsignal(s) for s in interrupts.SIGNALS} if main else {}
    for signum in previous:
        signal.signal(signum, on_signal)
    try:
        code = proc.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if received:
        interrupts.deliver(received[0])
    return code if code >= 0 else 128 - code


def _terminal_delivered() -> bool:
    """Whether a Ctrl-C reached CMD itself: our process group (CMD's) is the foreground
    group of our terminal."""
    for fd in (0, 1, 2):
        try:
            if os.isatty(fd):
                return os.tcgetpgrp(fd) == os.getpgrp()
        except OSError:
            continue
    return False


def run_command(argv: list[str], overrides: dict[str, Any]) -> tuple[int, summary.Summary]:
    """CMD's exit code, and what the store did in its processes."""
    env = store_env(overrides)
    env.pop("ARTSTORE_WARM", None)
    check_command(argv, env)
    with tempfile.TemporaryDirectory(prefix="artstore-run-") as records:
        env[summary.ENV_VAR] = records
        code = run_forwarding_signals(argv, env)
        return code, summary.Summary.of(summary.read_records(Path(records)))


def startup_module() -> ModuleType:
    """`artifactstore_startup`, as the .pth file imports it, or from STARTUP_DIR."""
    module = sys.modules.get("artifactstore_startup")
    if module is not None:
        return module
    spec = importlib.util.spec_from_file_location(
        "artifactstore_startup", STARTUP_DIR / "artifactstore_startup.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["artifactstore_startup"] = module
    spec.loader.exec_module(module)
    return module
