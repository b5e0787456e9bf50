"""A training-like script that knows nothing about artifactstore.

`artstore warm -- python warm_script.py` must store its compiles through the
startup hook alone. It reports one JSON line: its results, the XLA compiles it
ran (counted at JAX's compile entry point), whether the store was active in
it, and the same for a child Python process it starts with `--child`.

  --child        also run this script in a child process (variant 1: other shapes)
  --exit N       exit with status N after reporting
  --variant V    change the program's shapes (a different key)
  WARM_SCRIPT_STORE=1  configure artifactstore itself (a reader verifying the warm store)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
from xla_probe import count_compiles

xla_compiles = count_compiles()

if os.environ.get("WARM_SCRIPT_STORE"):
    import artifactstore

    artifactstore.configure()

parser = argparse.ArgumentParser()
parser.add_argument("--child", action="store_true")
parser.add_argument("--exit", type=int, default=0)
parser.add_argument("--variant", type=int, default=0)
opts = parser.parse_args()
n = 8 + 4 * opts.variant


@jax.jit
def train_step(w, x):  # type: ignore[no-untyped-def]
    def loss(w):  # type: ignore[no-untyped-def]
        h = x
        for _ in range(3):
            h = jnp.tanh(h @ w)
        return (h**2).mean()

    value, grad = jax.value_and_grad(loss)(w)
    return w - 0.1 * grad, value


@jax.jit
def evaluate(w, x):  # type: ignore[no-untyped-def]
    return jnp.tanh(x @ w).sum(axis=0)


w = jnp.eye(n, dtype=jnp.float32) * 0.5
x = jnp.linspace(-1.0, 1.0, n * n, dtype=jnp.float32).reshape(n, n)
w, value = train_step(w, x)
out = evaluate(w, x)
results = [repr(float(v)) for v in (float(value), *out.tolist())]

child = None
if opts.child:
    proc = subprocess.run(
        [sys.executable, __file__, "--variant", "1"], capture_output=True, text=True, check=True
    )
    child = json.loads(proc.stdout.strip().splitlines()[-1])

stats = {}
if "artifactstore.jaxhook" in sys.modules:
    import artifactstore

    artifactstore.flush()
    stats = artifactstore.process_stats()
print(
    json.dumps({"results": results, "xla_compiles": xla_compiles, "store": stats, "child": child}),
    flush=True,
)
sys.exit(opts.exit)
