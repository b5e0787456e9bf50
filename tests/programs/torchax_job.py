"""The torchax example (artifactstore/examples/torchax_mlp.py) in a fresh process, counted.

Runs the example's `main` with the arguments in TORCHAX_ARGS (space-separated) and prints
its result line with `xla_compiles` added: the modules XLA really compiled (xla_probe).
Whether the store is in use is the environment's business (ARTSTORE_URL activates it).
"""

from __future__ import annotations

import json
import os

from xla_probe import count_compiles

xla_compiles = count_compiles()

from artifactstore.examples import torchax_mlp  # noqa: E402

out = torchax_mlp.main(os.environ.get("TORCHAX_ARGS", "").split())
print(json.dumps({**out, "xla_compiles": xla_compiles}), flush=True)
