"""A PyTorch MLP trained with torch-xla, its compiled graphs served by the store.

torch-xla compiles each graph through its own runtime and looks it up in its persistent
cache; the store fills that cache with the team's files before the first compile and
stores what this process compiles (artifactstore.torch_xla). Turned on by ARTSTORE_URL
when the program imports torch_xla, or here by `--store`
(`artifactstore.torch_xla.enable()`, before the first computation). Needs
`pip install 'artifactstore[torch-xla]'`; on the CPU, `PJRT_DEVICE=CPU`.

    PJRT_DEVICE=CPU python -m artifactstore.examples.torch_xla_mlp --store [--steps 3]

It prints one JSON line: each step's loss (float.hex: equal means bit for bit), the first
step's time, torch-xla's persistent cache counters (PersistentCacheHit: a graph loaded
from a file the store placed; PersistentCacheMiss: none there; on the CPU,
PersistentCacheDeserializeFailure: found, but its client cannot load it) and the
store's counters.
"""

from __future__ import annotations

import json
import time
from typing import Any

from artifactstore.examples.torchax_mlp import mlp_arguments

LR = 0.05


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = mlp_arguments(__doc__, layers=4, width=64, batch=16)
    p.add_argument("--store", action="store_true", help="call artifactstore.torch_xla.enable()")
    args = p.parse_args(argv)

    t_start = time.perf_counter()
    import torch
    import torch_xla
    import torch_xla.debug.metrics as met

    import artifactstore.torch_xla as store_xla

    if args.store:
        store_xla.enable()  # settings from the environment, as artifactstore.configure()
    device = torch_xla.device()
    torch.manual_seed(0)  # initialised by PyTorch on the CPU: the same in every process
    blocks: list[Any] = []
    for _ in range(args.layers):
        blocks += [torch.nn.Linear(args.width, args.width), torch.nn.Tanh()]
    model = torch.nn.Sequential(*blocks, torch.nn.Linear(args.width, 1)).to(device)
    x = torch.randn(args.batch, args.width).to(device)
    y = torch.randn(args.batch, 1).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    setup = time.perf_counter() - t_start

    t0 = time.perf_counter()  # the first step: trace, compile (or load) and run
    losses, first_call = [], 0.0
    for _ in range(args.steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        torch_xla.sync()
        losses.append(float(loss.item()).hex())
        first_call = first_call or time.perf_counter() - t0

    out = {
        "losses": losses,
        "first_call_secs": first_call,
        "setup_secs": setup,
        "cache": {
            n: met.counter_value(n) for n in met.counter_names() if n.startswith("PersistentCache")
        },
        "store": store_xla.stats(),  # {} where the store is off
    }
    print(json.dumps(out), flush=True)
    return out


if __name__ == "__main__":
    main()
