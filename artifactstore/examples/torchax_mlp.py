"""A PyTorch MLP trained through torchax: PyTorch modules run by `jax.jit`.

torchax (the PyTorch/XLA project's JAX path) turns a PyTorch function into a JAX
function, so its training step compiles through JAX, and the store serves it as it
serves any `jax.jit`: set ARTSTORE_URL, or pass `--store` (`artifactstore.configure()`).
`--named NAME@VERSION` builds the step as a named executable instead (loaded with no
trace when the store holds it). Needs `pip install 'artifactstore[torch]'`.

    python -m artifactstore.examples.torchax_mlp --store [--steps 3] [--layers 8]

It prints one JSON line: each step's loss (float.hex: equal means bit for bit), the first
step's time (trace and compile, or load, and run), JAX's own cache events, and the
store's counters with `--store`.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from typing import Any

from artifactstore.examples.compile_heavy import use_cache

LR = 0.05


def build(layers: int, width: int, batch: int):  # type: ignore[no-untyped-def]
    """The model on torchax's device, its parameters, a batch, and the step as a
    PyTorch function of (params, x, y) -> (loss, new params)."""
    import torch
    import torchax

    torch.manual_seed(0)  # initialised by PyTorch on the CPU: the same in every process
    blocks: list[Any] = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(width, width), torch.nn.Tanh()]
    model = torch.nn.Sequential(*blocks, torch.nn.Linear(width, 1))
    x, y = torch.randn(batch, width), torch.randn(batch, 1)
    with torchax.default_env():
        model.to("jax")
        x, y = x.to("jax"), y.to("jax")
    params = {name: p.detach() for name, p in model.named_parameters()}

    def loss_fn(params, x, y):  # type: ignore[no-untyped-def]
        out = torch.func.functional_call(model, params, (x,))
        return torch.nn.functional.mse_loss(out, y)

    from torchax import interop

    value_and_grad = interop.jax_value_and_grad(loss_fn)

    def step(params, x, y):  # type: ignore[no-untyped-def]
        loss, grads = value_and_grad(params, x, y)
        return loss, {k: p - LR * grads[k] for k, p in params.items()}

    return step, params, x, y


def named_step(step, params, x, y, name: str, version: str):  # type: ignore[no-untyped-def]
    """The step as a named executable: a JAX function of JAX arrays (torchax's
    `jax_view`), built for the shapes of `params`, `x` and `y`."""
    import jax
    from torchax import interop

    import artifactstore

    specs = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), interop.jax_view((params, x, y))
    )
    executable = artifactstore.compiled(interop.jax_view(step), *specs, name=name, version=version)
    return interop.torch_view(executable)


def save_batch(path: str, params, x, y) -> None:  # type: ignore[no-untyped-def]
    """`params` (as "params/NAME"), `x` and `y` as NumPy arrays in one .npz file."""
    import numpy as np
    from torchax import interop

    arrays = {f"params/{k}": v for k, v in params.items()} | {"x": x, "y": y}
    saved: dict[str, Any] = {k: np.asarray(v) for k, v in interop.jax_view(arrays).items()}
    np.savez(path, **saved)


def mlp_arguments(
    doc: str | None, *, layers: int, width: int, batch: int
) -> argparse.ArgumentParser:
    """The MLP examples' parser: steps and the model's size (this one's, torch_xla_mlp's)."""
    p = argparse.ArgumentParser(description=(doc or "").split("\n")[0])
    p.add_argument("--steps", type=int, default=3, help="training steps")
    p.add_argument("--layers", type=int, default=layers, help="hidden layers")
    p.add_argument("--width", type=int, default=width)
    p.add_argument("--batch", type=int, default=batch)
    return p


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = mlp_arguments(__doc__, layers=8, width=128, batch=32)
    p.add_argument("--store", action="store_true", help="call artifactstore.configure()")
    p.add_argument("--jax-cache", metavar="DIR", help="use JAX's own persistent cache")
    p.add_argument("--named", metavar="NAME@VERSION", help="the step as a named executable")
    p.add_argument(
        "--save-batch",
        metavar="FILE.npz",
        help="save the initial parameters and the batch, for a worker that loads "
        "the named step without PyTorch",
    )
    args = p.parse_args(argv)

    t_start = time.perf_counter()
    import jax

    events: collections.Counter[str] = collections.Counter()

    def count(event: str, **kwargs: str | int) -> None:
        events.update([event])

    jax.monitoring.register_event_listener(count)
    use_cache(jax_cache=args.jax_cache, store=args.store)
    from torchax import interop

    step, params, x, y = build(args.layers, args.width, args.batch)
    if args.save_batch:
        save_batch(args.save_batch, params, x, y)
    setup = time.perf_counter() - t_start

    t0 = time.perf_counter()  # the first step: trace and compile (or load), and run
    if args.named:
        name, _, version = args.named.partition("@")
        train_step = named_step(step, params, x, y, name, version or "1")
    else:
        train_step = interop.jax_jit(step)
    losses, first_call = [], 0.0
    for _ in range(args.steps):
        loss, params = train_step(params, x, y)
        losses.append(float(interop.jax_view(loss)).hex())
        first_call = first_call or time.perf_counter() - t0

    stats: dict[str, Any] = {}
    if "artifactstore.jaxhook" in sys.modules:  # configured here, or by ARTSTORE_URL
        import artifactstore

        artifactstore.flush()
        stats = artifactstore.process_stats()
    out = {
        "losses": losses,
        "checksum": losses[-1],
        "first_call_secs": first_call,
        "setup_secs": setup,
        "events": dict(events),
        "store": stats,
    }
    print(json.dumps(out), flush=True)
    return out


if __name__ == "__main__":
    main()
