"""`python -I` and `python -E` are never activated from the environment (issue 29, point 7).

Measured on main: ARTSTORE_URL activated the store in `python -I` and `python -E`
processes, which promise to ignore the environment (a hardened tool, a setuid-like
helper, a build step run isolated on purpose). The .pth line and `install()` now
check `sys.flags`. The startup files are what an install ships at the top of
site-packages (setup.py), so the test copies this checkout's into a fresh venv
whose other packages (JAX) come from this venv through a path line, as
tests/test_packaging.py does; the copies installed in this venv may be stale.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from conftest import REPO, clean_env

from artifactstore.runtime.run import STARTUP_DIR

pytestmark = pytest.mark.slow

PROGRAM = """
import json, sys
import jax, jax.numpy as jnp
result = float(jax.jit(lambda x: (x * 2).sum())(jnp.ones(8)))
mods = sorted(m for m in sys.modules if m.split(".")[0] == "artifactstore")
print(json.dumps({"result": result, "artifactstore_modules": mods}))
"""


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with this checkout's startup files at the top of its site-packages."""
    venv = tmp_path_factory.mktemp("isolated") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    where = "import sysconfig; print(sysconfig.get_path('purelib'))"
    site = Path(subprocess.run([str(python), "-I", "-c", where], check=True,
                               capture_output=True, text=True).stdout.strip())  # fmt: skip
    for name in ("artifactstore_startup.pth", "artifactstore_startup.py"):
        shutil.copy(STARTUP_DIR / name, site / name)
    # Path lines only (not processed as site directories): this checkout, then JAX & co.
    (site / "zz_deps.pth").write_text(f"{REPO}\n{sysconfig.get_path('purelib')}\n")
    return python


def _run(python: Path, flags: list[str], env: dict[str, str]) -> dict[str, object]:
    proc = subprocess.run([str(python), *flags, "-c", PROGRAM], env=env, capture_output=True,
                          text=True, timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def _env(tmp_path: Path, **settings: str) -> dict[str, str]:
    env = clean_env(XDG_CACHE_HOME=str(tmp_path / "xdg"), **settings)
    if "ARTSTORE_ACTIVATE" not in settings:
        del env["ARTSTORE_ACTIVATE"]  # clean_env turns activation off; a user's has nothing
    return env


def _stored(tmp_path: Path) -> list[Path]:
    return [p for p in tmp_path.rglob("*") if p.is_file()]


@pytest.mark.parametrize("flag", ["-I", "-E"])
@pytest.mark.parametrize("setting", ["ARTSTORE_URL", "ARTSTORE_ACTIVATE"])
def test_isolated_interpreters_are_not_activated(
    tmp_path: Path, venv_python: Path, flag: str, setting: str
) -> None:
    value = str(tmp_path / "store") if setting == "ARTSTORE_URL" else "1"
    out = _run(venv_python, [flag], _env(tmp_path, **{setting: value}))
    assert out["result"] == 16.0
    assert out["artifactstore_modules"] == [], out  # not even the startup module
    assert _stored(tmp_path) == []  # no store, no tier, no embedded default


def test_a_plain_interpreter_is_activated(tmp_path: Path, venv_python: Path) -> None:
    """The same venv and program without the flag: the check above can fail."""
    out = _run(venv_python, [], _env(tmp_path, ARTSTORE_URL=str(tmp_path / "store")))
    assert out["result"] == 16.0
    assert "artifactstore.jaxhook.api" in out["artifactstore_modules"], out  # type: ignore[operator]
    assert any(p.parent.parent.name == "objects" for p in _stored(tmp_path / "store"))
