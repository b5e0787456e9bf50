"""A compile-heavy JAX program: a small unrolled transformer's training step.

Unrolled layers (a Python loop, not `lax.scan`) and `value_and_grad` give XLA
a large graph, so compiling takes seconds on CPU while running takes
milliseconds: exactly the cost artifactstore removes from every new process.

Run it directly (`python -m artifactstore.examples.compile_heavy --store`) or
through `artstore demo`. It prints one JSON line with timings and a checksum.
With `--store` it exits 1, saying why on stderr, if the store neither loaded
nor stored anything: an inert store must not pass for a working one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def build(layers: int, width: int):  # type: ignore[no-untyped-def]
    import jax
    import jax.numpy as jnp
    import numpy as np

    def layer(params, x):  # type: ignore[no-untyped-def]
        wq, wk, wv, wo, w1, w2 = params
        h = (x - x.mean(-1, keepdims=True)) / (x.std(-1, keepdims=True) + 1e-5)
        q, k, v = h @ wq, h @ wk, h @ wv
        att = jax.nn.softmax(q @ k.T / jnp.sqrt(width), axis=-1)
        x = x + (att @ v) @ wo
        h = (x - x.mean(-1, keepdims=True)) / (x.std(-1, keepdims=True) + 1e-5)
        return x + jax.nn.gelu(h @ w1) @ w2

    def loss(all_params, x, y):  # type: ignore[no-untyped-def]
        for i, params in enumerate(all_params):
            x = layer(params, x) * (1.0 + 0.01 * i)
        return jnp.mean((x - y) ** 2)

    @jax.jit
    def train_step(all_params, x, y):  # type: ignore[no-untyped-def]
        value, grads = jax.value_and_grad(loss)(all_params, x, y)
        new = jax.tree_util.tree_map(lambda p, g: p - 1e-3 * g, all_params, grads)
        return value, new

    @jax.jit
    def evaluate(all_params, x):  # type: ignore[no-untyped-def]
        for params in all_params:
            x = layer(params, x)
        return jnp.tanh(x).sum(axis=-1)

    # NumPy initialisation: no extra small jits, so the two steps above are
    # the only compiles that matter.
    rng = np.random.default_rng(0)
    shapes = [(width, width)] * 4 + [(width, 2 * width), (2 * width, width)]
    params = [
        tuple(jnp.asarray(rng.normal(size=s).astype(np.float32) * 0.05) for s in shapes)
        for _ in range(layers)
    ]
    x = rng.normal(size=(16, width)).astype(np.float32)
    y = np.roll(x, 1, axis=0)
    return train_step, evaluate, params, jnp.asarray(x), jnp.asarray(y)


def small_jits(n: int) -> None:
    """Trivial compiles, below any sensible store threshold, of n distinct shapes."""
    import jax
    import jax.numpy as jnp

    for i in range(1, n + 1):
        jax.block_until_ready((jnp.ones((i, 3)) + jnp.arange(3.0)).reshape(3, i).T)


def use_cache(*, jax_cache: str | None, store: bool) -> None:
    """The cache under comparison: JAX's own (same 0 s threshold as ours) or the store."""
    import jax

    if jax_cache:
        jax.config.update("jax_compilation_cache_dir", jax_cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    if store:
        import artifactstore

        artifactstore.configure()


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layers", type=int, default=int(os.environ.get("DEMO_LAYERS", "10")))
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--store", action="store_true", help="call artifactstore.configure()")
    parser.add_argument("--jax-cache", metavar="DIR", help="use JAX's own persistent cache")
    parser.add_argument(
        "--small-jits",
        type=int,
        default=0,
        metavar="N",
        help="first run N trivial jits (ones, arange, reshape of N shapes), "
        "as ordinary programs do; each compiles in milliseconds",
    )
    args = parser.parse_args(argv)

    t0 = time.perf_counter()
    import jax

    use_cache(jax_cache=args.jax_cache, store=args.store)
    small_jits(args.small_jits)
    train_step, evaluate, params, x, y = build(args.layers, args.width)
    t1 = time.perf_counter()
    loss, params = train_step(params, x, y)
    out = evaluate(params, x)
    jax.block_until_ready((loss, out))
    first_call = time.perf_counter() - t1
    checksum = float(out.sum()) + float(loss)
    result: dict[str, object] = {
        "first_call_secs": first_call,
        "setup_secs": t1 - t0,
        "checksum": repr(checksum),
        "loss": repr(float(loss)),
        # What it ran on: JAX's default backend (JAX_PLATFORMS chooses another).
        "backend": jax.default_backend(),
        "devices": f"{jax.device_count()} x {jax.devices()[0].device_kind}",
    }
    if args.store:
        import artifactstore

        artifactstore.flush()
        stats = artifactstore.process_stats()
        result["store"] = stats
        if not stats.get("active") or not (stats.get("hits") or stats.get("stored")):
            why = "configure() did not activate the store" if not stats else "store unavailable"
            if stats.get("active"):
                why = "the store neither loaded nor stored an executable"
            print(json.dumps(result), flush=True)
            sys.exit(f"compile_heavy: {why} (see the log above; run `artstore doctor`)")
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
