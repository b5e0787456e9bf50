"""Host callbacks, side by side: a diffrax neural-ODE gradient step with equinox checks.

Before JAX 0.11, JAX never writes a program with host callbacks to its
persistent cache, and equinox's runtime checks (which diffrax adds by default)
are host callbacks, so such a program compiles in every fresh process, warm JAX
cache or not; JAX 0.11 and later cache them, and are the baseline to match.
artifactstore stores it and binds the new process's callbacks on load.

Each configuration runs this file with --child in fresh subprocesses
(JAX_PLATFORMS=cpu, no inherited ARTSTORE_* or JAX cache variables): no cache,
JAX's persistent cache and artifactstore, embedded and S3+PostgreSQL (all warm:
one untimed prefill run). Targets as in warm_start.py: warm wall <= 1.05x
(embedded) and <= 1.10x (S3+PostgreSQL) of JAX's warm wall.
Timed runs are interleaved round-robin. Reported: first call of the jitted step
(trace + compile or load + run) and seconds spent in XLA compiles (timed around
JAX's `backend_compile_and_load`). All losses must agree, and warm artifactstore
runs must compile nothing. Needs `pip install -e '.[bench]'` (diffrax, equinox).

    python bench/callbacks_diffrax.py [--runs 3] [--out bench/results/callbacks_diffrax.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import _results
from warm_start import (
    JAX_WARM,
    NO_CACHE,
    RATIO_COLS,
    S3PG_NAME,
    TARGET_NAME,
    TARGETS,
    Config,
    Result,
    config_records,
    embedded_env,
    interleaved,
    run_child,
    s3pg_env,
)

from artifactstore.examples.compile_heavy import use_cache

CONFIGS: list[Config] = [
    Config(NO_CACHE),
    Config(JAX_WARM, args=lambda tmp: ["--jax-cache", str(tmp)], prefill=True),
    Config(TARGET_NAME, env=embedded_env, prefill=True, store=True),
    Config(S3PG_NAME, env=s3pg_env, prefill=True, store=True),
]
COLUMNS = [("first call (s)", "first_call_secs"), ("XLA compile (s)", "xla_compile_secs"),
           ("process wall (s)", "wall_secs")]  # fmt: skip


def child(args: argparse.Namespace) -> None:
    """The measured program: one gradient step of a neural ODE, in this fresh process."""
    t_start = time.perf_counter()
    import jax
    from jax._src import compiler

    compiles: list[dict[str, Any]] = []
    real_compile = compiler.backend_compile_and_load

    def timed_compile(backend: Any, module: Any, *rest: Any, **kw: Any) -> Any:
        started = time.perf_counter()
        try:
            return real_compile(backend, module, *rest, **kw)
        finally:
            name = str(module.operation.attributes["sym_name"]).strip('"')
            host_callbacks = rest[2] if len(rest) > 2 else kw.get("host_callbacks", ())
            compiles.append({"module": name, "secs": time.perf_counter() - started,
                             "host_callbacks": len(host_callbacks or ())})  # fmt: skip

    compiler.backend_compile_and_load = timed_compile
    use_cache(jax_cache=args.jax_cache, store=args.store)

    import diffrax
    import equinox as eqx
    import jax.numpy as jnp
    import numpy as np

    class Field(eqx.Module):
        mlp: eqx.nn.MLP

        def __call__(self, t: Any, y: Any, args: Any) -> Any:
            return self.mlp(y)

    def solve(field: Field, ts: Any, y0: Any) -> Any:
        sol = diffrax.diffeqsolve(  # default throw=True: equinox checks (host callbacks)
            diffrax.ODETerm(field), diffrax.Tsit5(), t0=ts[0], t1=ts[-1], dt0=ts[1] - ts[0],
            y0=y0, stepsize_controller=diffrax.PIDController(rtol=1e-3, atol=1e-6),
            saveat=diffrax.SaveAt(ts=ts),
        )  # fmt: skip
        return sol.ys

    @eqx.filter_jit
    def step(field: Field, ts: Any, ys: Any) -> tuple[Any, Field]:
        def loss(f: Field) -> Any:
            pred = jax.vmap(solve, in_axes=(None, None, 0))(f, ts, ys[:, 0])
            return jnp.mean((pred - ys) ** 2)

        value, grads = eqx.filter_value_and_grad(loss)(field)
        return value, eqx.apply_updates(field, jax.tree.map(lambda g: -1e-2 * g, grads))

    rng = np.random.default_rng(0)
    ts = np.linspace(0.0, 2.0, 32, dtype=np.float32)
    y0 = rng.normal(size=(8, 2)).astype(np.float32)
    ys = np.stack([y0 * np.exp(-t) * np.cos(t) for t in ts], axis=1)  # (batch, time, 2)
    field = Field(eqx.nn.MLP(2, 2, 64, 3, activation=jax.nn.softplus, key=jax.random.key(0)))
    setup = time.perf_counter() - t_start

    before = len(compiles)
    t0 = time.perf_counter()
    value, field = step(field, jnp.asarray(ts), jnp.asarray(ys))
    value = float(jax.block_until_ready(value))
    first_call = time.perf_counter() - t0
    first = compiles[before:]
    stats: dict[str, int] = {}
    if args.store:
        import artifactstore

        artifactstore.flush()
        stats = artifactstore.process_stats()
    print(json.dumps({
        "first_call_secs": first_call, "setup_secs": setup, "loss": repr(value),
        "xla_compile_secs": sum(c["secs"] for c in compiles), "xla_compiles": len(compiles),
        "first_call_xla_compile_secs": sum(c["secs"] for c in first),
        "step_host_callbacks": max((c["host_callbacks"] for c in first), default=None),
        "store": stats,
    }), flush=True)  # fmt: skip


def run_once(cfg: Config, tmp: Path) -> Result:
    return run_child(cfg, tmp, [sys.executable, __file__, "--child"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3, help="timed runs per configuration")
    p.add_argument("--out", type=Path, default=_results.default_out("callbacks_diffrax"))
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--jax-cache", help=argparse.SUPPRESS)
    p.add_argument("--store", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        child(a)
        return 0

    def on_run(i: int, c: Config, r: Result) -> None:
        print(f"run {i + 1}/{a.runs} {c.name:<30} first {r['first_call_secs']:7.3f}s"
              f"  xla compile {r['xla_compile_secs']:7.3f}s ({r['xla_compiles']})",
              flush=True)  # fmt: skip
        if c.store and (r["xla_compiles"] or r["store"].get("hits", 0) < 1):
            sys.exit(f"[{c.name}] warm run compiled or missed: {r}")

    raw, prefills = interleaved(CONFIGS, a.runs, run_once, on_run)
    losses = {r["loss"] for r in [*prefills, *(r for rs in raw.values() for r in rs)]}
    if len(losses) != 1:
        sys.exit(f"FAIL: losses differ across runs: {sorted(losses)}")
    callbacks = raw[NO_CACHE][0]["step_host_callbacks"]

    res = {c.name: {k: _results.summary([r[k] for r in raw[c.name]]) for _, k in COLUMNS}
           for c in CONFIGS}  # fmt: skip
    lines, targets = _results.table(res, COLUMNS, RATIO_COLS, TARGETS, JAX_WARM)
    lines += ["", f"median (min-max) over {a.runs} interleaved runs; the step has "
              f"{callbacks} host callbacks; identical loss in all runs (prefills too): "
              f"{next(iter(losses))}", *_results.target_lines(targets, JAX_WARM)]  # fmt: skip
    text = "\n".join(lines)
    print("\n" + text)
    report = {
        **_results.run_info(), "runs": a.runs, "loss": next(iter(losses)),
        "step_host_callbacks": callbacks, "targets": targets,
        "configs": config_records(CONFIGS, res, raw),
    }  # fmt: skip
    _results.write(a.out, report, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
