"""Programs with host callbacks: stored by one process, loaded by the next with its callbacks."""

from __future__ import annotations

import json
from typing import Any

import pytest
import tamper
from conftest import artstore, program

# The jitted function with callbacks in each case of tests/programs/callbacks.py.
MODULES = {"pure": "jit_f", "io": "jit_g", "debug": "jit_d", "eqx": "jit_checked"}


def run_case(case: str, env: dict[str, str], **extra: str) -> dict[str, Any]:
    """Run one case in a process of its own: its JSON report, plus stdout and stderr."""
    proc = program("callbacks.py", {**env, "CALLBACKS_CASE": case, **extra})
    assert proc.returncode == 0, f"{case} failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    out["_stdout"], out["_stderr"] = proc.stdout, proc.stderr
    return out


def compiled(out: dict[str, Any], module: str) -> bool:
    return f'"{module}"' in out["xla_compiles"]


def stored_modules(env: dict[str, str]) -> set[str]:
    rows = json.loads(artstore("ls", "--json", env=env).stdout)
    return {row["module_name"] for row in rows}


def assert_loaded_and_ran_here(a: dict[str, Any], b: dict[str, Any], module: str) -> None:
    assert compiled(a, module), "process A must compile the program"
    assert b["xla_compiles"] == [], "process B must load everything"
    assert b["store"]["hits"] >= 1 and b["store"].get("misses", 0) == 0
    assert b["results"] == a["results"]


@pytest.mark.parametrize("case", ["pure", "io", "debug"])
def test_callbacks_run_in_the_loading_process(store_env: dict[str, str], case: str) -> None:
    a = run_case(case, store_env)
    assert MODULES[case] in stored_modules(store_env)
    b = run_case(case, store_env)
    assert_loaded_and_ran_here(a, b, MODULES[case])
    # `calls` is filled only by callbacks running in that process: B's own ran, in order.
    assert b["calls"] and b["calls"] == a["calls"]
    if case == "io":
        assert [c[0] for c in b["calls"]] == ["step", "step", "step", "done"]
        assert [c[1] for c in b["calls"][:3]] == [0, 1, 2]
    if case == "debug":
        printed = [line for line in b["_stdout"].splitlines() if "debug-print" in line]
        assert printed == [line for line in a["_stdout"].splitlines() if "debug-print" in line]
        assert len(printed) == 1


def test_equinox_check_raises_the_same_error_after_loading(store_env: dict[str, str]) -> None:
    a = run_case("eqx", store_env)
    b = run_case("eqx", store_env)
    assert_loaded_and_ran_here(a, b, MODULES["eqx"])
    assert a["error"]["type"].endswith("EquinoxRuntimeError")
    assert "activation over the limit" in a["error"]["message"]
    assert b["error"] == a["error"]


def test_loaded_executable_calls_the_current_trace_callbacks(store_env: dict[str, str]) -> None:
    """Same module, different Python function: B loads A's executable and runs B's function."""
    a = run_case("pure", store_env)  # np.sin
    b = run_case("pure_cos", store_env)  # np.cos, same shapes
    assert b["xla_compiles"] == []
    assert [c[0] for c in a["calls"]] == ["sin"] and [c[0] for c in b["calls"]] == ["cos"]
    fresh = run_case("pure_cos", store_env, ARTSTORE_CACHE_CALLBACKS="0")
    assert compiled(fresh, MODULES["pure"])
    assert b["results"] == fresh["results"] != a["results"]


@pytest.mark.parametrize("variant", ["pure_two", "pure_int"])
def test_other_callbacks_miss_instead_of_crashing(store_env: dict[str, str], variant: str) -> None:
    """Same computation around the callback, another number or signature of callbacks."""
    a = run_case("pure", store_env)
    b = run_case(variant, store_env)
    assert compiled(b, MODULES["pure"]), "a different callback signature must be a miss"
    assert b["store"]["misses"] >= 1 and b["store"]["hits"] >= 1  # the eager ops still hit
    assert len(b["calls"]) == (2 if variant == "pure_two" else 1)
    assert b["results"] != a["results"]
    again = run_case(variant, store_env)  # stored under its own key
    assert again["xla_compiles"] == [] and again["results"] == b["results"]


def test_stored_callback_count_is_checked_before_loading(store_env: dict[str, str]) -> None:
    """A forged entry: the executable of a program with two host callbacks, its metadata
    rewritten to the one-callback program's key, that key's row and tier key file pointing
    at it. Loaded with the one callback this trace provides, jaxlib would crash natively
    calling the second; the count stored with the object makes it a miss instead."""
    import dataclasses

    from artifactstore import config
    from artifactstore.formats import codec
    from artifactstore.store import Store
    from artifactstore.store.tier import TierEntry

    a = run_case("pure", store_env)  # one callback
    run_case("pure_two", store_env)  # two callbacks: same module name, its own key
    store = Store.open(config.resolve({"url": store_env["ARTSTORE_URL"]}, {}))
    by_count = {}
    for entry in store.parts.index.iter_entries():
        if entry.module_name == MODULES["pure"]:
            meta = codec.read_meta(store.parts.blobs.get(entry.digest) or b"")
            assert meta is not None
            by_count[meta.callbacks] = entry
    assert sorted(by_count) == [1, 2], "objects record their host callback count"
    one, two = by_count[1], by_count[2]
    data = store.parts.blobs.get(two.digest)
    assert data is not None
    meta = codec.read_meta(data)
    assert meta is not None
    payload = codec.decode(data, digest=two.digest, fingerprint=two.fingerprint)
    forged = codec.encode(payload, two.fingerprint, dataclasses.replace(meta, key=one.key))
    store.parts.blobs.put(forged.digest, forged.data)
    tamper.point(store, one.key, forged.digest, size=len(forged.data), raw_size=forged.raw_size)
    assert store.parts.tier is not None
    store.parts.tier.remember(one.key, TierEntry(forged.digest, two.fingerprint, 1.0), forged.data)
    store.close()

    b = run_case("pure", store_env)
    assert compiled(b, MODULES["pure"]), "the forged executable must not be loaded"
    assert b["results"] == a["results"] and b["calls"] == a["calls"]
    assert b["store"]["callback_mismatch"] == 1
    lines = [line for line in b["_stderr"].splitlines() if "artifactstore" in line]
    assert len(lines) == 1 and "expects 2 host callback(s)" in lines[0], lines


def test_callback_count_in_object_metadata() -> None:
    """Objects record the count; those written before it (0.2.0) load by their key alone."""
    from artifactstore.config import host
    from artifactstore.formats import codec, frames

    fp = host.compute(platform_name="cpu", platform_version="v", device_kind="cpu",
                      device_count=1, jax_version="1", jaxlib_version="1")  # fmt: skip
    key = "c" * 64

    def obj(callbacks: int | None) -> bytes:
        meta = codec.ObjectMeta(key, "jit_f", 1.0, 3, "h", fp.to_dict(), callbacks=callbacks)
        assert codec.ObjectMeta.from_bytes(meta.to_bytes()) == meta
        return codec.encode(b"exe", fp.digest, meta).data

    def load(data: bytes, callbacks: int | None) -> bytes:
        digest = codec.digest_of(data)
        return codec.decode(
            data, digest=digest, fingerprint=fp.digest, key=key, callbacks=callbacks
        )

    _, body = frames.split(obj(None))
    assert body is not None and b"callbacks" not in body  # 0.2.0's bytes, unchanged
    assert load(obj(2), 2) == load(obj(None), 2) == load(obj(0), 0) == b"exe"
    assert load(obj(2), None) == b"exe"  # callers that bind no callbacks do not ask
    for stored, provided in ((2, 1), (1, 2), (0, 1), (1, 0)):
        with pytest.raises(codec.CallbackMismatch):
            load(obj(stored), provided)


@pytest.mark.parametrize("how", ["env", "configure"])
def test_off_switch_compiles_like_jax(store_env: dict[str, str], how: str) -> None:
    off = {"ARTSTORE_CACHE_CALLBACKS": "0"} if how == "env" else {"CALLBACKS_CONFIGURE": "off"}
    a = run_case("pure", store_env, **off)
    b = run_case("pure", store_env, **off)
    assert compiled(a, "jit_f") and compiled(b, "jit_f")
    assert b["store"]["hits"] >= 1  # programs without callbacks are still stored
    assert b["results"] == a["results"] and b["calls"] == a["calls"]
    assert "jit_f" not in stored_modules(store_env)


def test_unreadable_callbacks_warn_once_and_compile(store_env: dict[str, str]) -> None:
    a = run_case("pure", store_env, CALLBACKS_BREAK="1")
    b = run_case("pure", store_env, CALLBACKS_BREAK="1")
    assert compiled(a, "jit_f") and compiled(b, "jit_f")
    assert a["_stderr"].count("could not read a program's host callbacks") == 1
    assert "jit_f" not in stored_modules(store_env)
    assert b["results"] == a["results"] == run_case("pure", store_env)["results"]


def test_pure_callback_through_the_team_store(team_env: dict[str, str]) -> None:
    a = run_case("pure", team_env)
    b = run_case("pure", team_env)
    assert_loaded_and_ran_here(a, b, "jit_f")
    assert b["calls"] == a["calls"] == [["sin", [4, 4]]]


# -- the callback signature, in-process ---------------------------------------
def _lowered(fn: Any) -> tuple[Any, list[Any]]:
    import jax
    import jax.numpy as jnp

    lowering = jax.jit(fn).lower(jnp.ones((2, 3), jnp.float32))._lowering
    return lowering.stablehlo(), list(lowering.compile_args["host_callbacks"])


def _two_callbacks(host: Any, dtype: Any = None) -> Any:
    import jax
    import numpy as np

    def fn(x: Any) -> Any:
        out = jax.ShapeDtypeStruct(x.shape, dtype or x.dtype)
        y = jax.pure_callback(lambda a: host(a).astype(out.dtype), out, x)
        jax.debug.callback(lambda a: None, y)
        return y.astype(np.float32) + x

    return fn


def test_signature_counts_callbacks_and_ignores_their_identity() -> None:
    import numpy as np

    from artifactstore.jaxhook.callbacks import NotStorable, callback_signature

    sin, callbacks = _lowered(_two_callbacks(np.sin))
    cos, _ = _lowered(_two_callbacks(np.cos))
    ints, _ = _lowered(_two_callbacks(np.sin, np.int32))
    assert len(callbacks) == 2
    assert callback_signature(sin, 2, False) == callback_signature(cos, 2, False)
    assert callback_signature(ints, 2, False) != callback_signature(sin, 2, False)
    for wrong in (0, 1, 3):  # fewer callbacks would crash on execute: refused
        with pytest.raises(NotStorable):
            callback_signature(sin, wrong, False)


_MODULE = """
module @jit_probe {
  func.func public @main(%arg0: tensor<3xf32>) -> tensor<3xf32> {
    %0 = stablehlo.custom_call @TARGET(%arg0) {backend_config = "CONFIG",
      mhlo.backend_config = {index = 0 : ui64}} : (tensor<3xf32>) -> tensor<3xf32>
    return %0 : tensor<3xf32>
  }
}
"""


@pytest.mark.parametrize(
    ("target", "backend_config", "storable"),
    [
        ("xla_ffi_python_cpu_callback", "", True),
        ("xla_ffi_python_cpu_callback", "139871234", False),  # an address: not by index
        ("xla_python_cpu_callback", "139871234", False),  # legacy: called through an address
        ("InspectSharding", "139871234", False),
        ("CustomSPMDPartitioning", "139871234", False),  # unless JAX may drop its pointer
        ("my_library_callback", "", False),  # unknown: JAX's key would drop its config
        ("my_library_kernel", "opaque", True),  # not a callback: left alone
    ],
)
def test_only_callbacks_bound_by_index_are_storable(
    target: str, backend_config: str, storable: bool
) -> None:
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir

    from artifactstore.jaxhook.callbacks import NotStorable, callback_signature

    text = _MODULE.replace("TARGET", target).replace("CONFIG", backend_config)
    # The module's one host callback, or none where the custom call is something else.
    count = 1 if target.startswith("xla_ffi") else 0
    with mlir.make_ir_context():
        module = ir.Module.parse(text)
        if storable:
            assert len(callback_signature(module, count, False)) == 64
        else:
            with pytest.raises(NotStorable):
                callback_signature(module, count, False)
        if target == "CustomSPMDPartitioning":  # JAX told to drop the pointer from keys
            assert len(callback_signature(module, 0, True)) == 64
