"""Shared fixtures: fresh stores, and running JAX programs in fresh processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
PROGRAMS = Path(__file__).resolve().parent / "programs"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment without any ARTSTORE_* setting, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARTSTORE_")}
    env["JAX_PLATFORMS"] = "cpu"
    env["ARTSTORE_MIN_COMPILE_SECS"] = "0"
    env.update(extra)
    return env


def run_program(
    name: str, env: dict[str, str], *, check: bool = True, timeout: float = 300
) -> dict[str, Any]:
    """Run tests/programs/NAME in a fresh interpreter; its last stdout line as JSON."""
    proc = subprocess.run(
        [sys.executable, str(PROGRAMS / name)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    lines = proc.stdout.strip().splitlines()
    out: dict[str, Any] = json.loads(lines[-1]) if lines else {}
    out["_stderr"] = proc.stderr
    out["_returncode"] = proc.returncode
    return out


def start_program(name: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(PROGRAMS / name)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def artstore(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the CLI as a user would, in a fresh process."""
    return subprocess.run(
        [sys.executable, "-m", "artifactstore", *args],
        env=env or clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture
def store_env(tmp_path: Path) -> dict[str, str]:
    """Environment for a fresh embedded store (local directory + SQLite) in tmp_path."""
    return clean_env(ARTSTORE_URL=str(tmp_path / "store"))


@pytest.fixture
def cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    return artstore
