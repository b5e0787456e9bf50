"""A plain, non-editable install carries its migrations and example program."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from conftest import REPO, clean_env

# A future JAX, as far as the adapter can tell: imported at every interpreter start
# through PYTHONPATH, before artifactstore or the program runs.
MISMATCHING_JAX = """
from jax._src import compiler
_original = compiler.compile_or_get_cached
def compile_or_get_cached(backend, module, devs, opts, *rest):
    return _original(backend, module, devs, opts, *rest)
compiler.compile_or_get_cached = compile_or_get_cached
"""


def test_non_editable_install_upgrades_db_and_has_example(tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps",
         "--target", str(target), str(REPO)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    assert (target / "artifactstore" / "migrations" / "versions" / "0001_initial.py").is_file()
    assert (target / "artifactstore" / "examples" / "compile_heavy.py").is_file()
    assert (target / "artifactstore" / "startup" / "sitecustomize.py").is_file()
    # The .pth file (ARTSTORE_URL alone activates the store) and its module, at the top.
    assert (target / "artifactstore_startup.pth").read_text().count("\n") == 1
    assert (target / "artifactstore_startup.py").is_file()
    assert (target / "artifactstore" / "cli" / "render.py").is_file()
    env = clean_env(PYTHONPATH=str(target), ARTSTORE_INDEX=f"sqlite:///{tmp_path}/i.db",
                    ARTSTORE_URL=str(tmp_path / "objects"))  # fmt: skip
    run = subprocess.run(
        [sys.executable, "-c", "import artifactstore; print(artifactstore.__file__)"],
        env=env, cwd=tmp_path, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert run.stdout.startswith(str(target))
    # The docs' example command from the checkout root, whose `artifactstore/` comes first
    # on sys.path (`-m`) and shadows the install; -S leaves out this venv's editable finder,
    # which would find what the checkout's package lacks (measured: "No module named
    # 'artifactstore.examples'" before the examples moved into the package).
    for where in (REPO, tmp_path):
        command = [sys.executable, "-S", "-m", "artifactstore.examples.compile_heavy", "--help"]
        example = subprocess.run(command, env=env, cwd=where, capture_output=True, text=True)
        assert example.returncode == 0 and "usage:" in example.stdout, (where, example.stderr)
    up = subprocess.run(
        [sys.executable, "-m", "artifactstore", "db", "upgrade"],
        env=env, cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert up.returncode == 0, up.stderr
    assert "at revision 0005" in up.stdout
    # `warm -- CMD` activates the store in CMD through the hook shipped in the install.
    code = "import jax.numpy as jnp; print(float((jnp.arange(4.0) * 2).sum()))"
    warm = subprocess.run(
        [sys.executable, "-m", "artifactstore", "warm", "--", sys.executable, "-c", code],
        env=env, cwd=tmp_path, capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert warm.returncode == 0, warm.stderr
    assert warm.stdout.startswith("12.0\n") and "1 with JAX and the store active" in warm.stdout


def test_demo_runs_cold_then_warm_on_jax_default_backend() -> None:
    env = clean_env()
    del env["JAX_PLATFORMS"]  # JAX's default: the accelerator where there is one, else cpu
    proc = subprocess.run(
        [sys.executable, "-m", "artifactstore", "demo", "--layers", "2"],
        env=env, capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "results identical: yes" in proc.stdout
    _assert_cold_stored_warm_loaded(proc.stdout)
    backend = next(line for line in proc.stdout.splitlines() if line.startswith("backend: "))
    assert backend.startswith("backend: cpu, 1 x cpu (JAX's default;"), proc.stdout


def _assert_cold_stored_warm_loaded(stdout: str) -> None:
    """The two training programs at least (a trivial jit may also compile past the
    0.1 s threshold on a loaded machine, and is then stored too); the warm run loads
    every entry the cold run stored."""
    stored = int(stdout.split("entries stored: ")[1].split(",")[0])
    assert stored >= 2, stdout
    hits_row = next(line for line in stdout.splitlines() if line.startswith("store hits"))
    assert hits_row.split()[-2:] == ["0", str(stored)], stdout


@pytest.mark.slow
def test_readme_demo_command_from_repo_root_with_plain_install(tmp_path: Path) -> None:
    """The README's first command where a new user stands: the repository root, a fresh
    venv, a non-editable install. Dependencies come from this venv's site-packages (a
    .pth line) so the test installs nothing from the network."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    # This venv's pip, aimed at the fresh one: it installs there and touches nothing here.
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
         "--no-deps", "."],
        cwd=REPO, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr
    where = "import sysconfig; print(sysconfig.get_path('purelib'))"
    fresh_site = subprocess.run(
        [str(venv / "bin" / "python"), "-c", where], check=True, capture_output=True, text=True
    ).stdout.strip()
    (Path(fresh_site) / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    demo = subprocess.run(
        [str(venv / "bin" / "artstore"), "demo", "--layers", "2"],
        cwd=REPO, env=clean_env(), capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    assert demo.returncode == 0, demo.stderr
    _assert_cold_stored_warm_loaded(demo.stdout)


def _with_mismatching_jax(tmp_path: Path) -> dict[str, str]:
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(MISMATCHING_JAX)
    path = os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH")) if p)
    return clean_env(PYTHONPATH=path)


def test_demo_fails_when_jax_cannot_be_hooked(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "artifactstore", "demo", "--layers", "1"],
        env=_with_mismatching_jax(tmp_path), capture_output=True, text=True, check=False,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "cannot be hooked (compiler.compile_or_get_cached(" in err
    assert "store would never be used" in err


def test_example_exits_nonzero_when_the_store_stays_inert(tmp_path: Path) -> None:
    env = _with_mismatching_jax(tmp_path)
    env["ARTSTORE_URL"] = str(tmp_path / "store")
    proc = subprocess.run(
        [sys.executable, "-m", "artifactstore.examples.compile_heavy", "--store", "--layers", "1"],
        env=env, capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "internals do not match" in proc.stderr
    assert "configure() did not activate the store" in proc.stderr


def test_every_package_directory_is_listed_in_pyproject() -> None:
    """A sub-package missing from `packages` is left out of a non-editable install:
    editable installs and this checkout import it, users' installs fail on import."""
    import tomllib

    listed = set(
        tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {
        ".".join(init.parent.relative_to(REPO).parts)
        for init in (REPO / "artifactstore").rglob("__init__.py")
    }
    assert found - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
