"""Specializations for `artstore warm warm_specs:FUNCTION`, good and bad.

`specializations()` lists one compile per sequence length (AlphaFold-style).
Run as a script, it calls the same functions on real data of those shapes
with the store configured and reports, as one JSON line, its results and the
XLA compiles it ran (counted at JAX's compile entry point).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

LENGTHS = (16, 32, 48, 64, 80)
FEATURES = 8


@jax.jit
def embed(tokens, w):  # type: ignore[no-untyped-def]
    h = tokens @ w
    for _ in range(3):
        h = jax.nn.gelu(h @ w.T @ w)
    return h.mean(axis=0)


def _specs(length: int) -> tuple[Any, ...]:
    return (
        jax.ShapeDtypeStruct((length, FEATURES), jnp.float32),
        jax.ShapeDtypeStruct((FEATURES, FEATURES), jnp.float32),
    )


def specializations() -> list[tuple[Any, Any]]:
    return [(embed, _specs(n)) for n in LENGTHS]


def named() -> dict[str, Any]:
    """The dict form, with a duplicate that must be compiled once."""
    return {f"embed-{n}": (embed, _specs(n)) for n in (16, 32)} | {"again-16": (embed, _specs(16))}


def one_fails() -> list[Any]:
    """The middle one cannot lower (shapes do not multiply); the others must still be stored."""
    bad = (
        jax.ShapeDtypeStruct((16, FEATURES + 1), jnp.float32),
        jax.ShapeDtypeStruct((FEATURES, FEATURES), jnp.float32),
    )
    return [(embed, _specs(16)), ("mismatched", embed, bad), (embed, _specs(32))]


class _CrashesWhenLowered:
    """Stands in for a compile that takes its process down (an XLA abort, the OOM killer)."""

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        os._exit(3)


def one_crashes() -> list[Any]:
    return [(embed, _specs(16)), ("crashes", _CrashesWhenLowered(), ()), (embed, _specs(32))]


def wrong_type() -> int:
    return 42


def not_jitted() -> list[Any]:
    return [(lambda x: x, (jax.ShapeDtypeStruct((2,), jnp.float32),))]


def bad_specs() -> list[Any]:
    return [(embed, {"tokens": 1})]


def raises() -> list[Any]:
    raise RuntimeError("cannot list shapes today")


def empty() -> list[Any]:
    return []


NOT_CALLABLE = 3


def _main() -> None:
    from xla_probe import count_compiles

    xla_compiles = count_compiles()
    import artifactstore

    artifactstore.configure()
    # NumPy inputs: the only compiles this program asks for are the warmed ones.
    w = np.eye(FEATURES, dtype=np.float32) * 0.3
    results = []
    for n in LENGTHS:
        tokens = np.linspace(-1.0, 1.0, n * FEATURES, dtype=np.float32).reshape(n, FEATURES)
        results.append([repr(float(v)) for v in embed(tokens, w).tolist()])
    artifactstore.flush()
    out = {"results": results, "xla_compiles": xla_compiles, "store": artifactstore.process_stats()}
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    _main()
    sys.exit(0)
