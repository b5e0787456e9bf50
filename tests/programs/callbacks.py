"""JAX programs with host callbacks, run by tests/test_callbacks.py in fresh processes.

It reports, as one JSON line: its results, the calls its host callbacks made in
this process (in order), the exception an equinox check raised, how many times
XLA actually compiled, and the store's counters for this process.

Environment knobs (tests only):
  CALLBACKS_CASE       pure | pure_cos | pure_two | pure_int | io | debug | eqx
  CALLBACKS_CONFIGURE  "off": configure(cache_callbacks=False)
  CALLBACKS_BREAK=1    make reading the callbacks fail (the program must still run)
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import io_callback
from xla_probe import count_compiles

xla_compiles = count_compiles()

import artifactstore  # noqa: E402
from artifactstore.jaxhook import compile as hook_compile  # noqa: E402

if os.environ.get("CALLBACKS_BREAK"):

    def _broken(*args: Any) -> str:
        raise RuntimeError("simulated MLIR API change")

    hook_compile.callback_signature = _broken

if os.environ.get("CALLBACKS_CONFIGURE") == "off":
    artifactstore.configure(cache_callbacks=False)
else:
    artifactstore.configure()

CASE = os.environ["CALLBACKS_CASE"]
calls: list[Any] = []  # appended to only by callbacks running in this process


def host_sin(a: np.ndarray) -> np.ndarray:
    calls.append(["sin", a.shape])
    return np.sin(a)


def host_cos(a: np.ndarray) -> np.ndarray:
    calls.append(["cos", a.shape])
    return np.cos(a)


def host_round(a: np.ndarray) -> np.ndarray:
    calls.append(["round", a.shape])
    return np.round(a * 10).astype(np.int32)


def record(tag: str) -> Any:
    def callback(*values: Any) -> None:
        calls.append([tag, *(np.asarray(v).tolist() for v in values)])

    return callback


def run() -> tuple[list[Any], dict[str, str] | None]:
    x = jnp.linspace(0.1, 1.0, 16, dtype=jnp.float32).reshape(4, 4)
    like = jax.ShapeDtypeStruct(x.shape, x.dtype)

    def dense(h: jax.Array) -> jax.Array:  # the same around every callback
        for i in range(3):
            h = jnp.tanh(h @ h.T * (0.5 + 0.1 * i)) @ h * 0.25 + 0.01 * i
        return h

    if CASE in ("pure", "pure_cos", "pure_two", "pure_int"):
        host = host_cos if CASE == "pure_cos" else host_sin

        @jax.jit
        def f(h: jax.Array) -> jax.Array:
            h = dense(h)
            if CASE == "pure_int":
                r = jax.pure_callback(host_round, jax.ShapeDtypeStruct(h.shape, jnp.int32), h)
                h = h + r.astype(h.dtype)
            else:
                h = jax.pure_callback(host, like, h)
            if CASE == "pure_two":
                h = jax.pure_callback(host_cos, like, h)
            return dense(h) + h  # the callbacks' results show through

        return f(x).ravel().tolist(), None

    if CASE == "io":

        @jax.jit
        def g(h: jax.Array) -> jax.Array:
            def body(i: jax.Array, h: jax.Array) -> jax.Array:
                io_callback(record("step"), None, i, h.sum(), ordered=True)
                return dense(h) * 0.9

            h = lax.fori_loop(0, 3, body, h)
            io_callback(record("done"), None, h.sum(), ordered=True)
            return h

        return g(x).ravel().tolist(), None

    if CASE == "debug":

        @jax.jit
        def d(h: jax.Array) -> jax.Array:
            h = dense(h)
            jax.debug.print("debug-print total={t}", t=h.sum())
            jax.debug.callback(record("debug-callback"), h[0])
            return dense(h)

        return d(x).ravel().tolist(), None

    if CASE == "eqx":
        import equinox as eqx

        @eqx.filter_jit
        def checked(h: jax.Array, limit: jax.Array) -> jax.Array:
            h = dense(h)
            h = eqx.error_if(h, jnp.abs(h).max() > limit, "activation over the limit")
            return dense(h)

        results = checked(x, jnp.float32(1e6)).ravel().tolist()  # the check holds
        try:
            checked(x, jnp.float32(0.0))  # same executable; the check fires
        except Exception as exc:
            kind = type(exc)
            return results, {"type": f"{kind.__module__}.{kind.__qualname__}", "message": str(exc)}
        raise AssertionError("the equinox check did not fire")

    raise SystemExit(f"unknown CALLBACKS_CASE {CASE!r}")


results, error = run()
artifactstore.flush()
print(
    json.dumps(
        {
            "results": [repr(float(v)) for v in results],
            "calls": calls,
            "error": error,
            "xla_compiles": xla_compiles,
            "store": artifactstore.process_stats(),
        }
    ),
    flush=True,
)
