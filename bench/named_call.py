"""Steady-state cost of one call: a named executable against `jax.jit`, side by side.

Issue 31's targets: a loaded named executable costs at most 1.10x a jitted call at
600 argument leaves and 1.25x at 10 on the CPU (what the dispatch costs, since the
step does little work), and at most 1.02x on an accelerator's training step (run
`bench/tpu_gpt.py` for that). Configurations, all in this one process on the same
arrays: `jax.jit` (the baseline), the named executable (`artifactstore.load`, its
fast path), and the checked path every call took before (`call_checked`: each leaf
checked and placed in Python), so the table shows what the fast path removed.

Each is timed in interleaved rounds (blocks of calls, results blocked on), the
median of the rounds reported; ratios are against jit's median of the same rounds.

    python bench/named_call.py [--leaves 10,600] [--rounds 15] [--calls 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _results

JIT, NAMED, CHECKED = "jax.jit", "named (fast path)", "named, checked path (before)"
TARGETS = {10: 1.25, 600: 1.10}


def step(params: dict[str, Any], x: Any, lr: float) -> tuple[dict[str, Any], Any]:
    """A tiny update over many leaves: the call's dispatch is what is measured."""
    import jax.numpy as jnp

    new = {k: v - lr * jnp.tanh(v * x[0]) for k, v in params.items()}
    return new, x * 2.0


def measure(leaves: int, rounds: int, calls: int, store: Path) -> dict[str, list[float]]:
    import jax
    import jax.numpy as jnp

    import artifactstore

    artifactstore.configure(url=str(store))
    params = {f"p{i:03d}": jnp.full((8,), 0.01 * i, jnp.float32) for i in range(leaves)}
    x = jnp.ones((4,), jnp.float32)
    specs = (jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), params),
             jax.ShapeDtypeStruct(x.shape, x.dtype), 0.1)  # fmt: skip
    name = f"bench/named-call-{leaves}"
    artifactstore.compiled(step, *specs, name=name, version="1", static_argnums=2)
    named = artifactstore.load(name, version="1")
    assert named.fast, "the fast call path is off on this JAX"
    jitted = jax.jit(step, static_argnums=2)
    fns = {
        JIT: lambda: jitted(params, x, 0.1),
        NAMED: lambda: named(params, x, 0.1),
        CHECKED: lambda: named.call_checked(params, x, 0.1),
    }
    reference = jax.tree.leaves(jitted(params, x, 0.1))
    for label, fn in fns.items():  # same results, and warm
        got = jax.tree.leaves(fn())
        assert all(bool((a == b).all()) for a, b in zip(got, reference, strict=True)), label
    times: dict[str, list[float]] = {label: [] for label in fns}
    for _ in range(rounds):
        for label, fn in fns.items():
            n = calls if label != CHECKED else max(calls // 10, 5)
            started = time.perf_counter()
            for _ in range(n):
                out = fn()
            jax.block_until_ready(out)
            times[label].append((time.perf_counter() - started) / n)
    artifactstore.deactivate()  # the store closed, its writes done, before its folder goes
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--leaves", default="10,600")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    import jax

    platform = jax.default_backend()
    report: dict[str, Any] = {"run": _results.run_info(), "platform": platform, "cases": {}}
    lines = [f"named call vs jax.jit, steady state, per call ({platform}, "
             f"{args.rounds} rounds, median)", "",
             "| leaves | config | per call (us) | vs jit | target |",
             "|---|---|---|---|---|"]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for leaves in [int(n) for n in args.leaves.split(",")]:
            times = measure(leaves, args.rounds, args.calls, Path(tmp) / "store")
            base = statistics.median(times[JIT])
            case = {}
            for label, values in times.items():
                med = statistics.median(values)
                ratio = med / base
                target = TARGETS.get(leaves) if label == NAMED else None
                case[label] = {**_results.summary(values), "ratio_vs_jit": ratio,
                               "target": target}  # fmt: skip
                met = (
                    ""
                    if target is None
                    else f"<= {target:.2f}x " + ("met" if ratio <= target else "MISSED")
                )
                lines.append(f"| {leaves} | {label} | {med * 1e6:.1f} | {ratio:.3f}x | {met} |")
            report["cases"][str(leaves)] = case
    table = "\n".join(lines)
    print(table)
    out = args.out or _results.default_out(f"named_call-{platform}")
    _results.write(out, report, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
