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


def _cache_key_module(get: object, **attrs: object) -> object:
    import types

    module = types.SimpleNamespace(get=get, custom_hook=lambda: "", **attrs)
    return module


def test_key_conventions_follow_the_signature_not_the_version() -> None:
    """Each cache_key.get convention JAX has had is called the way it expects; an
    unknown one is named, never guessed."""
    import enum

    from artifactstore.jaxhook.compat import KeyInputs, _key_fn

    def inputs(drop_partitioning: bool, host_callbacks: bool) -> KeyInputs:
        return KeyInputs("m", "d", "o", "b", "fmt", drop_partitioning, host_callbacks)

    calls: list[tuple[object, ...]] = []

    class IgnoreCallbacks(enum.IntEnum):  # JAX <= 0.10
        NO = 1
        ALL = 2
        CUSTOM_PARTITIONING = 3

    def get_010(module, devices, compile_options, backend, compression_algorithm="zstandard",  # type: ignore[no-untyped-def]
                ignore_callbacks=IgnoreCallbacks.NO):  # fmt: skip
        calls.append((compression_algorithm, ignore_callbacks))
        return "jit_f-010"

    def get_012(module, devices, compile_options, backend, compression_algorithm="zstandard",  # type: ignore[no-untyped-def]
                ignore_custom_partitioning=False):  # fmt: skip
        calls.append((compression_algorithm, ignore_custom_partitioning))
        return "jit_f-012"

    def get_plain(module, devices, compile_options, backend, compression_algorithm):  # type: ignore[no-untyped-def]
        calls.append((compression_algorithm,))
        return "jit_f-plain"

    def get_future(module, devices, options, backend, algorithm, mode):  # type: ignore[no-untyped-def]
        raise AssertionError("never called")

    old = _key_fn(_cache_key_module(get_010, IgnoreCallbacks=IgnoreCallbacks))
    assert not isinstance(old, str)
    key, _ = old
    assert key(inputs(False, True)) == "jit_f-010"
    assert key(inputs(True, False)) == "jit_f-010"
    assert key(inputs(False, False)) == "jit_f-010"
    assert calls == [("fmt", IgnoreCallbacks.ALL), ("fmt", IgnoreCallbacks.CUSTOM_PARTITIONING),
                     ("fmt", IgnoreCallbacks.NO)]  # fmt: skip
    calls.clear()

    new = _key_fn(_cache_key_module(get_012))
    assert not isinstance(new, str)
    new[0](inputs(True, True))
    assert calls == [("fmt", True)]  # callbacks are keyed by index: nothing to strip
    calls.clear()

    plain = _key_fn(_cache_key_module(get_plain))
    assert not isinstance(plain, str)
    plain[0](inputs(True, True))
    assert calls == [("fmt",)]

    assert _key_fn(_cache_key_module(get_010)) == "cache_key.IgnoreCallbacks missing"
    problem = _key_fn(_cache_key_module(get_future))
    assert isinstance(problem, str) and problem.startswith("cache_key.get(")
    assert _key_fn(object()) == "cache_key.get missing"
