"""`artstore doctor` without holding the accelerator: it reads what it can without
opening JAX's backend (on a TPU, opening it takes 10-15 s and holds the chip, so the
host of a running job could not run doctor), and opens it only where asked
(`--device`) or where JAX_PLATFORMS=cpu leaves nothing to hold, saying so in the row.
Evidence is JAX's own table of initialized backends, read in the doctor's process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

# `artstore doctor` in this process, then the backends JAX initialized, on stderr.
DOCTOR = """
import json, sys
sys.argv = ["artstore", "doctor", "--json", *sys.argv[1:]]
from artifactstore.cli.app import main
code = 0
try:
    main()
except SystemExit as exc:
    code = exc.code
from jax._src import xla_bridge
print(json.dumps({"code": code, "backends": sorted(xla_bridge._backends)}), file=sys.stderr)
"""


def _doctor(env: dict[str, str], *args: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the --json report, {code, backends}) of one doctor process."""
    proc = subprocess.run([sys.executable, "-c", DOCTOR, *args], env=env, capture_output=True,
                          text=True, timeout=300, check=False)  # fmt: skip
    assert "Traceback" not in proc.stderr, proc.stderr
    report: dict[str, Any] = json.loads(proc.stdout)
    return report, json.loads(proc.stderr.strip().splitlines()[-1])


def _unset(store_env: dict[str, str]) -> dict[str, str]:
    env = dict(store_env)
    del env["JAX_PLATFORMS"]
    return env


def test_doctor_opens_no_backend_unless_asked_and_says_so(store_env: dict[str, str]) -> None:
    env = _unset(store_env)
    report, seen = _doctor(env)
    assert seen == {"code": 0, "backends": []}, seen  # not even the CPU
    assert report["ok"] is True
    checks = report["checks"]
    accel = checks["accelerator"]
    assert accel["status"] == "ok" and accel["expected"] == "cpu" and not accel["jax_platforms"]
    assert accel["detail"].startswith("JAX would open cpu (no accelerator plugin installed)")
    assert accel["detail"].endswith("not opened")
    fingerprint = checks["fingerprint"]
    assert fingerprint["status"] == "skip" and fingerprint["opened"] is False
    assert "not read" in fingerprint["detail"]
    assert "`artstore doctor --device` opens it" in fingerprint["detail"]

    report, seen = _doctor(env, "--device")  # asked: opens JAX's default backend, says so
    assert seen == {"code": 0, "backends": ["cpu"]}, seen
    fingerprint = report["checks"]["fingerprint"]
    assert fingerprint["status"] == "ok" and fingerprint["opened"] is True
    assert fingerprint["detail"].startswith("opened the CPU backend to read it (")
    assert fingerprint["platform"] == "cpu" and len(fingerprint["digest"]) == 64


def test_jax_platforms_cpu_opens_by_itself_unless_no_device(store_env: dict[str, str]) -> None:
    assert store_env["JAX_PLATFORMS"] == "cpu"  # nothing to hold: opened by itself
    report, seen = _doctor(store_env)
    assert seen["backends"] == ["cpu"] and report["checks"]["fingerprint"]["opened"] is True
    assert report["checks"]["accelerator"]["detail"].startswith("JAX would open cpu "
                                                                "(JAX_PLATFORMS=cpu)")  # fmt: skip
    report, seen = _doctor(store_env, "--no-device")
    assert seen == {"code": 0, "backends": []}, seen
    assert report["checks"]["fingerprint"]["status"] == "skip"


def test_installed_plugins_are_named_not_imported(
    store_env: dict[str, str], tmp_path: Path
) -> None:
    """A TPU plugin as JAX discovers one (a `jax_plugins` module): named in the row,
    never imported (it raises if it is); no chip here, so JAX would open the CPU."""
    plugin = tmp_path / "site" / "jax_plugins" / "xla_tpu_fake"
    plugin.mkdir(parents=True)
    (plugin / "__init__.py").write_text("raise SystemExit('the plugin was imported')\n")
    path = os.pathsep.join(p for p in (str(tmp_path / "site"), store_env.get("PYTHONPATH")) if p)
    report, seen = _doctor({**_unset(store_env), "PYTHONPATH": path})
    assert seen == {"code": 0, "backends": []}, seen
    accel = report["checks"]["accelerator"]
    assert accel["plugins"] == {"xla_tpu_fake": "jax_plugins.xla_tpu_fake"}
    assert accel["detail"].startswith("JAX would open cpu (xla_tpu_fake installed, but no "
                                      "device seen)")  # fmt: skip
    assert "JAX's cpu backend" in report["checks"]["fingerprint"]["detail"]
