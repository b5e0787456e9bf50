"""A torch-xla program on the CPU: three graphs compiled, torch-xla's cache counters printed.

The store is turned on by the environment (ARTSTORE_URL, `artstore run`) when torch_xla is
imported, or, with TORCH_XLA_JOB_ENABLE=1, by `artifactstore.torch_xla.enable()` after
the import (settings from the environment; TORCH_XLA_JOB_READ_ONLY=1: `read_only=True`).
Prints one JSON line: the adapter's stats, the files in torch-xla's cache directory
before exit (name -> size) and the results.
"""

from __future__ import annotations

import json
import os

import torch
import torch_xla
import torch_xla.debug.metrics as met

import artifactstore.torch_xla as store_xla

if os.environ.get("TORCH_XLA_JOB_ENABLE") == "1":
    read_only = True if os.environ.get("TORCH_XLA_JOB_READ_ONLY") == "1" else None
    store_xla.enable(read_only=read_only)

device = torch_xla.device()
results = []
for n in (8, 16, 24):  # three shapes: three graphs
    x = torch.arange(n * n, dtype=torch.float32, device=device).reshape(n, n) / (n * n)
    y = torch.tanh(x @ x.T).sum()
    torch_xla.sync()
    results.append(float(y.item()).hex())

cache = os.environ.get("XLA_PERSISTENT_CACHE_PATH", "")
files = {f: os.path.getsize(os.path.join(cache, f)) for f in os.listdir(cache)} if cache else {}
print(
    json.dumps(
        {
            "stats": store_xla.stats(),
            "cache": cache,
            "files": files,
            "results": results,
            "counters": {
                n: met.counter_value(n)
                for n in met.counter_names()
                if n.startswith("PersistentCache")
            },
        }
    ),
    flush=True,
)
