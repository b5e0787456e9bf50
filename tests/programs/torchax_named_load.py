"""A worker that runs a torchax training step stored as a named executable, without PyTorch.

Loads NAME@VERSION (TORCHAX_NAMED) with `artifactstore.load` and runs TORCHAX_STEPS steps
on the parameters and batch that the building process saved (TORCHAX_BATCH, an .npz of
"params/NAME", "x" and "y"). Prints one JSON line: the losses (float.hex), the modules XLA
compiled (xla_probe), the store's counters, and whether torch was ever imported.
"""

from __future__ import annotations

import json
import os
import sys

import jax
import numpy as np
from xla_probe import count_compiles

import artifactstore

xla_compiles = count_compiles()
name, _, version = os.environ["TORCHAX_NAMED"].partition("@")
with np.load(os.environ["TORCHAX_BATCH"]) as saved:
    params = {k.removeprefix("params/"): saved[k] for k in saved.files if k.startswith("params/")}
    x, y = saved["x"], saved["y"]
step = artifactstore.load(name, version)
losses = []
for _ in range(int(os.environ.get("TORCHAX_STEPS", "3"))):
    loss, params = step(params, x, y)
    losses.append(float(jax.device_get(loss)).hex())
print(
    json.dumps(
        {
            "losses": losses,
            "xla_compiles": xla_compiles,
            "store": artifactstore.process_stats(),
            "torch_imported": "torch" in sys.modules,
        }
    ),
    flush=True,
)
