"""`artstore warm -- CMD`: run CMD unchanged, with the store in write mode in every Python child.

The environment names the report directory (`ENV_VAR`) and puts the startup
hook first on PYTHONPATH; each process that imports JAX activates the store
(`child.activate`) and leaves its records there for `report.aggregate`.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from artifactstore.errors import one_line
from artifactstore.warm import ACTIVATE_DIR, ENV_VAR, WarmError
from artifactstore.warm.preflight import check_expected, child_env, host_fingerprint_via_subprocess
from artifactstore.warm.report import Report, aggregate, check_warmed_target


def run_command(
    argv: list[str], overrides: dict[str, Any], expected: dict[str, Any] | None
) -> Report:
    env = child_env(overrides)
    if expected is not None:
        check_expected(host_fingerprint_via_subprocess(env), expected)
    if shutil.which(argv[0], path=env.get("PATH")) is None and not os.path.exists(argv[0]):
        raise WarmError(f"command not found: {argv[0]!r}")
    report_dir = Path(tempfile.mkdtemp(prefix="artstore-warm-"))
    env[ENV_VAR] = str(report_dir)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ACTIVATE_DIR), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]
    )
    started = time.monotonic()
    try:
        code = _run_forwarding_signals(argv, env)
        report = aggregate(report_dir, what=shlex.join(argv)[:200])
    finally:
        shutil.rmtree(report_dir, ignore_errors=True)
    report.exit_code = code
    report.elapsed_secs = time.monotonic() - started
    if report.processes == 0 and code == 0:
        report.problems.append(
            "nothing was warmed: no Python process started by the command imported JAX with "
            "artifactstore importable (another interpreter or virtualenv? python -E or -I?)"
        )
    check_warmed_target(report, expected)
    return report


def _run_forwarding_signals(argv: list[str], env: dict[str, str]) -> int:
    """Run CMD; pass SIGTERM on (CI cancels), let Ctrl-C reach it, and wait for its exit."""
    try:
        proc = subprocess.Popen(argv, env=env)
    except OSError as exc:
        raise WarmError(f"cannot run {argv[0]!r}: {exc.strerror or one_line(exc)}") from None
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda signum, frame: proc.send_signal(signum))
    try:
        while True:
            try:
                code = proc.wait()
                break
            except KeyboardInterrupt:
                continue  # the child got the same SIGINT; report once it has exited
    finally:
        signal.signal(signal.SIGTERM, previous)
    return code if code >= 0 else 128 - code
