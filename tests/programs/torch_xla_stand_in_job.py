"""torch-xla's cache through the adapter, with the stand-in torch_xla (tests/programs/
stand_in on PYTHONPATH: no torch) and, with JOB_JAX=1, a JAX compile in the same process.

The store is turned on by the environment (ARTSTORE_URL, `artstore run`) when torch_xla
is imported. Prints one JSON line: the adapter's stats, whether the JAX hook joined the
session the adapter made, torch-xla's counters and its cache's files.
"""

from __future__ import annotations

import json
import os

import torch_xla
import torch_xla.debug.metrics as met

import artifactstore.torch_xla as store_xla
from artifactstore.runtime import process
from artifactstore.torch_xla import adapter

first = process.current()  # the session the adapter made
if os.environ.get("JOB_JAX") == "1":
    import jax
    import jax.numpy as jnp

    jax.jit(lambda x: x * 2 + 1)(jnp.arange(4.0)).block_until_ready()

for graph in ("a", "b", "c"):
    torch_xla.compile(graph)

current = adapter.current()
cache = os.environ.get("XLA_PERSISTENT_CACHE_PATH", "")
print(
    json.dumps(
        {
            "stats": store_xla.stats(),
            # JAX's hook joined it (it made none, nor replaced it): one session.
            "one_session": current is not None and process.current() is current.session is first,
            "counters": met.COUNTERS,
            "files": sorted(os.listdir(cache)) if cache else [],
        }
    ),
    flush=True,
)
