"""Named executables for `artstore warm warm_named:specs`: one per sequence length."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

import artifactstore

LENGTHS = (16, 32, 48)


def fold(tokens: Any, w: Any) -> Any:
    h = tokens @ w
    for _ in range(2):
        h = jnp.tanh(h @ w.T @ w)
    return h.mean(axis=0)


def specs() -> list[Any]:
    w = jax.ShapeDtypeStruct((8, 8), jnp.float32)
    return [
        artifactstore.NamedSpec(
            fold, jax.ShapeDtypeStruct((n, 8), jnp.float32), w, name=f"fold/len-{n}", version="1"
        )
        for n in LENGTHS
    ]
