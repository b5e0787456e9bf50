"""Build a named function's native module (artifactstore.native.build), in a fresh process.

Stores `mlp@1` (pytrees in and out) with artifactstore.compiled, then: builds its
module for NATIVE_CPU (default generic), checked against XLA; builds it again (found
stored); builds one that really disagrees (a test seam rewrites the StableHLO before
IREE compiles it: tanh becomes sine), which must be refused with nothing stored; and
tries a function that cannot go native (LAPACK's custom call on the CPU). Writes the
inputs it calls with and XLA's outputs as .npy files into NATIVE_OUT. Prints one JSON
line.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import artifactstore
from artifactstore.native import build
from artifactstore.native.errors import NativeBuildError

OUT = Path(os.environ["NATIVE_OUT"])
CPU = os.environ.get("NATIVE_CPU", "generic")


def mlp(params: dict[str, jax.Array], x: jax.Array) -> tuple[dict[str, jax.Array], jax.Array]:
    h = jnp.tanh(x @ params["w"] + params["b"])
    return {"y": h.sum(axis=1), "h": h}, jnp.argmax(h, axis=1)


def inverse(a: jax.Array) -> jax.Array:
    return jnp.linalg.inv(a)


def entries() -> int:
    from artifactstore.jaxhook import compile as _compile

    current = _compile.current()
    assert current is not None
    store = current.store()
    assert store is not None
    return sum(1 for _ in store.parts.index.iter_entries())


def refused(**kwargs: object) -> str | None:
    try:
        build(*kwargs.pop("ref"), **kwargs)  # type: ignore[misc]
    except NativeBuildError as exc:
        return str(exc)
    return None


def main() -> None:
    artifactstore.configure()
    f32 = jnp.float32
    specs = (
        {"w": jax.ShapeDtypeStruct((8, 16), f32), "b": jax.ShapeDtypeStruct((16,), f32)},
        jax.ShapeDtypeStruct((4, 8), f32),
    )
    named = artifactstore.compiled(mlp, *specs, name="mlp", version="1")
    rng = np.random.default_rng(7)
    params = {"w": rng.standard_normal((8, 16)).astype(np.float32),
              "b": rng.standard_normal(16).astype(np.float32)}  # fmt: skip
    x = rng.standard_normal((4, 8)).astype(np.float32)
    # The module's inputs in order (pytree order: b, w, x), and XLA's outputs (h, y, argmax).
    for i, array in enumerate((params["b"], params["w"], x)):
        np.save(OUT / f"in{i}.npy", array)
    out, idx = named(params, x)
    for i, array in enumerate((out["h"], out["y"], idx)):
        np.save(OUT / f"xla{i}.npy", np.asarray(array))
    built = build("mlp", "1", cpu=CPU)
    again = build("mlp", "1", cpu=CPU)
    before = entries()
    other = "host" if CPU == "generic" else "generic"
    wrong = refused(ref=("mlp", "1"), cpu=other, rewrite=lambda t: t.replace("tanh", "sine"))
    after = entries()
    artifactstore.compiled(inverse, jax.ShapeDtypeStruct((3, 3), f32), name="inv", version="1")
    lapack = refused(ref=("inv", "1"))
    print(json.dumps({
        "key": built.key, "present": [built.present, again.present], "rows": built.rows,
        "cpu": built.convention.cpu, "wrong": wrong, "entries": [before, after], "lapack": lapack,
    }))  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
