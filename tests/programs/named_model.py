"""A model whose function body counts its own traces (named-executable tests)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

CALLS = [0]


def step(params: dict[str, Any], x: Any, depth: int) -> dict[str, Any]:
    CALLS[0] += 1  # only ever runs while JAX traces
    h = x
    for _ in range(depth):
        h = jnp.tanh(h @ params["w"] + params["b"])
    return {"out": h, "aux": (h.sum(), None), "layers": [h * 2.0]}


SPECS = (
    {
        "w": jax.ShapeDtypeStruct((16, 16), jnp.float32),
        "b": jax.ShapeDtypeStruct((16,), jnp.float32),
    },
    jax.ShapeDtypeStruct((4, 16), jnp.float32),
    3,
)
