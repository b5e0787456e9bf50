"""Build or load the named executable `t/step@1` and call it once, in a fresh process.

ROLLBACK_MODE: `old` (artifactstore.compiled with the first function: x + 1), `new`
(the same name and version as another function: x * 3) or `load` (by name alone);
ROLLBACK_NAME: the name (default `t/step`); ROLLBACK_FIRST: a name `load` tries first,
in the same process (its error reported as "first").
Prints one JSON line: where the executable came from, the result on ones(4), and this
process's counters; or the error `load` raised.
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np

import artifactstore

MODE = os.environ.get("ROLLBACK_MODE", "load")
NAME = os.environ.get("ROLLBACK_NAME", "t/step")
FIRST = os.environ.get("ROLLBACK_FIRST")
SPEC = jax.ShapeDtypeStruct((4,), jnp.float32)


def old(x: jax.Array) -> jax.Array:
    return x + 1.0


def new(x: jax.Array) -> jax.Array:
    return x * 3.0


first = {}
if FIRST and MODE == "load":
    try:
        artifactstore.load(FIRST, version="1")
        first = {"first": "loaded"}
    except artifactstore.ArtstoreError as exc:
        first = {"first": type(exc).__name__}
try:
    if MODE == "load":
        fn = artifactstore.load(NAME, version="1")
    else:
        fn = artifactstore.compiled(old if MODE == "old" else new, SPEC, name=NAME, version="1")
except artifactstore.ArtstoreError as exc:
    out = {**first, "error": type(exc).__name__, "message": str(exc)}
    print(json.dumps({**out, "stats": artifactstore.process_stats()}))
    raise SystemExit(0) from None

result = np.asarray(fn(np.ones(4, np.float32))).tolist()
stats = artifactstore.process_stats()
print(json.dumps({**first, "source": fn.source, "result": result, "stats": stats}))
