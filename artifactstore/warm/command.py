"""`artstore warm -- CMD`: run CMD unchanged, with the store in write mode in every Python child.

The environment names the report directory (`ENV_VAR`) and puts the startup
hook first on PYTHONPATH; each process that imports JAX activates the store
(`child.activate`) and leaves its records there for `report.aggregate`.
"""

from __future__ import annotations

import shlex
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from artifactstore.runtime.run import RunError, check_command, run_forwarding_signals
from artifactstore.warm import ENV_VAR, WarmError
from artifactstore.warm.preflight import check_expected, child_env, host_fingerprint_via_subprocess
from artifactstore.warm.report import Report, aggregate, check_warmed_target


def run_command(
    argv: list[str], overrides: dict[str, Any], expected: dict[str, Any] | None
) -> Report:
    env = child_env(overrides)
    if expected is not None:
        check_expected(host_fingerprint_via_subprocess(env), expected)
    try:
        check_command(argv, env)
    except RunError as exc:
        raise WarmError(str(exc)) from None
    report_dir = Path(tempfile.mkdtemp(prefix="artstore-warm-"))
    env[ENV_VAR] = str(report_dir)
    started = time.monotonic()
    try:
        try:
            code = run_forwarding_signals(argv, env)
        except RunError as exc:
            raise WarmError(str(exc)) from None
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
