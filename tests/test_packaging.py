"""A plain, non-editable install carries its migrations and example program."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import REPO, clean_env


def test_non_editable_install_upgrades_db_and_has_example(tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps",
         "--target", str(target), str(REPO)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    assert (target / "artifactstore" / "migrations" / "versions" / "0001_initial.py").is_file()
    assert (target / "artifactstore" / "examples" / "compile_heavy.py").is_file()
    assert (target / "artifactstore" / "_activate" / "sitecustomize.py").is_file()  # warm's hook
    env = clean_env(PYTHONPATH=str(target), ARTSTORE_INDEX=f"sqlite:///{tmp_path}/i.db",
                    ARTSTORE_URL=str(tmp_path / "objects"))  # fmt: skip
    run = subprocess.run(
        [sys.executable, "-c", "import artifactstore; print(artifactstore.__file__)"],
        env=env, cwd=tmp_path, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert run.stdout.startswith(str(target))
    up = subprocess.run(
        [sys.executable, "-m", "artifactstore", "db", "upgrade"],
        env=env, cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert up.returncode == 0, up.stderr
    assert "at revision 0002" in up.stdout
    # `warm -- CMD` activates the store in CMD through the hook shipped in the install.
    code = "import jax.numpy as jnp; print(float((jnp.arange(4.0) * 2).sum()))"
    warm = subprocess.run(
        [sys.executable, "-m", "artifactstore", "warm", "--", sys.executable, "-c", code],
        env=env, cwd=tmp_path, capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert warm.returncode == 0, warm.stderr
    assert warm.stdout.startswith("12.0\n") and "1 with JAX and the store active" in warm.stdout


def test_demo_runs_cold_then_warm() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "artifactstore", "demo", "--layers", "2"],
        env=clean_env(), capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "results identical: yes" in proc.stdout
    assert "entries stored: 2" in proc.stdout
    hits_row = next(line for line in proc.stdout.splitlines() if line.startswith("store hits"))
    assert hits_row.split()[-2:] == ["0", "2"]
