"""The adapter hooks the installed JAX, leaves a mismatching one alone, and the off switch works."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import clean_env


def test_installed_jax_can_be_hooked() -> None:
    """A JAX release that breaks our hooks must turn CI red, not ship an inert store."""
    from artifactstore.jaxhook.compat import probe

    found = probe()
    assert found.problems == [], f"JAX {found.jax_version}: {found.problems}"
    assert found.hooks is not None


MISMATCH = """
import jax
from jax._src import compiler
def compile_or_get_cached(backend, module, devs, opts):  # a future JAX's signature
    raise AssertionError("never called")
orig = compiler.compile_or_get_cached
compiler.compile_or_get_cached = compile_or_get_cached
import artifactstore
print("settings:", artifactstore.configure())
artifactstore.configure()
assert compiler.compile_or_get_cached is compile_or_get_cached
compiler.compile_or_get_cached = orig
print("result:", jax.jit(lambda x: x * 2)(3))
"""


def _run(code: str, store: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        env=clean_env(ARTSTORE_URL=str(store)),
        capture_output=True,
        text=True,
        check=False,
    )


def test_mismatched_jax_internals_warn_once_and_leave_jax_untouched(tmp_path: Path) -> None:
    proc = _run(MISMATCH, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "settings: None" in proc.stdout and "result: 6" in proc.stdout
    assert proc.stderr.count("internals do not match") == 1
    assert not (tmp_path / "index.db").exists()


DEACTIVATE = """
import jax
from jax._src import compiler, cache_key
orig, hook = compiler.compile_or_get_cached, cache_key.custom_hook
import artifactstore
artifactstore.configure()
assert compiler.compile_or_get_cached is not orig
print(jax.jit(lambda x: x + 1)(1))
artifactstore.deactivate()
assert compiler.compile_or_get_cached is orig and cache_key.custom_hook is hook
print(jax.jit(lambda x: x + 2)(1))
"""


def test_deactivate_restores_jax(tmp_path: Path) -> None:
    proc = _run(DEACTIVATE, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["2", "3"]
