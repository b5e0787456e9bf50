"""A JAX program for tests/test_metrics.py: METRICS_N functions compiled, then loaded.

Phases (METRICS_PHASES, comma list, default "compile,hit"):
  compile  call METRICS_N distinct jitted functions: misses, compiles, then uploads flushed
  hit      JAX's in-process caches cleared, the same functions called again: each one
           loaded (from this host's tier, or from the store with ARTSTORE_LOCAL_TIER=off)
Then one JSON line: this process's counters (process_stats) and whether prometheus_client
was imported; with METRICS_WAIT=1 it then waits for a line on stdin (the test scrapes its
port meanwhile).
"""

from __future__ import annotations

import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

import artifactstore

artifactstore.configure()
n = int(os.environ.get("METRICS_N", "3"))
phases = os.environ.get("METRICS_PHASES", "compile,hit").split(",")


def make(i: int):  # type: ignore[no-untyped-def]
    @jax.jit
    def f(x):  # type: ignore[no-untyped-def]
        for _ in range(3):
            x = jnp.tanh(x @ x.T * (0.5 + 0.1 * i)) + i
        return x.sum()

    return f


functions = [make(i) for i in range(n)]
x = np.linspace(-1.0, 1.0, 16, dtype=np.float32).reshape(4, 4)
results = []
for phase in phases:
    if phase == "hit":
        jax.clear_caches()
    results.append([float(f(x)) for f in functions])
    if phase == "compile":
        artifactstore.flush()

print(
    json.dumps(
        {
            "results": results,
            "store": artifactstore.process_stats(),
            "prometheus_imported": "prometheus_client" in sys.modules,
        }
    ),
    flush=True,
)
if os.environ.get("METRICS_WAIT"):
    sys.stdin.readline()
