"""Fresh-process first call: no cache, JAX's cache, artifactstore's cache, a named executable.

Caches skip only the XLA compile: every fresh process still imports the model code,
traces and lowers before it can compute a key. A named executable skips all of it:
the loading process imports neither the model's libraries nor its code, it only
deserializes and calls. Two programs with long traces, each a training step:
- `diffrax`: a neural-ODE gradient step (equinox MLP vector field, Tsit5, adaptive
  steps), as in callbacks_diffrax.py but with `throw=False` (no host callbacks, which
  named executables cannot carry, and EQX_ON_ERROR=nan for the same reason; every
  configuration runs the same program);
- `flax`: a deep Flax (linen) residual MLP with LayerNorm, one SGD step.
The step takes the parameters as a flat list of arrays (a dict for flax), so that the
named executable's inputs are plain pytrees; all configurations call the same step.

Configurations (each in fresh subprocesses, JAX_PLATFORMS=cpu, interleaved runs,
warm ones after one untimed prefill): (a) no cache, (b) JAX's local cache warm,
(c) artifactstore's compile cache warm (embedded), (d) the named executable loaded
with `artifactstore.load` (embedded store; the prefill built it with
`artifactstore.compiled`). "first call" is from the process's first line of model code
(building the model, or `artifactstore.load` for (d)) to the step's result on the host;
"ready" is the part before the step is called (model built, or executable loaded).
Target: (d) first call <= 0.3x of (b) and of (c). Every run's loss must agree.

    python bench/named_first_call.py [--runs 3] [--programs diffrax,flax]
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
    Config,
    Result,
    ab_lines,
    config_records,
    interleaved,
    run_child,
    with_before,
)

STORE_WARM = "artifactstore cache (warm)"
NAMED = "named executable (load)"
CONFIGS: list[Config] = [
    Config(NO_CACHE),
    Config(JAX_WARM, args=lambda tmp: ["--jax-cache", str(tmp / "jax")], prefill=True),
    Config(STORE_WARM, env=lambda tmp: {"ARTSTORE_URL": str(tmp / "store"),
                                        "ARTSTORE_MIN_COMPILE_SECS": "0"},
           args=lambda tmp: ["--store"], prefill=True),
    Config(NAMED, env=lambda tmp: {"ARTSTORE_URL": str(tmp / "store")},
           args=lambda tmp: ["--named", str(tmp)], prefill=True),
]  # fmt: skip
COLUMNS = [("first call (s)", "first_call_secs"), ("of which ready (s)", "ready_secs"),
           ("process wall (s)", "wall_secs"), ("import jax (s)", "import_jax_secs")]  # fmt: skip
RATIO_COLS = [("first/no-cache", "first_call_secs", NO_CACHE),
              ("first/jax-warm", "first_call_secs", JAX_WARM),
              ("first/store-warm", "first_call_secs", STORE_WARM),
              ("wall/jax-warm", "wall_secs", JAX_WARM)]  # fmt: skip
TARGET = 0.3


# -- the programs: (step, initial inputs) built with their libraries ---------------
def diffrax_program() -> tuple[Any, tuple[Any, ...]]:
    import os

    os.environ["EQX_ON_ERROR"] = "nan"  # equinox's runtime checks without host callbacks
    import diffrax
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import numpy as np

    class Field(eqx.Module):
        mlp: eqx.nn.MLP

        def __call__(self, t: Any, y: Any, args: Any) -> Any:
            return self.mlp(y)

    field = Field(eqx.nn.MLP(2, 2, 64, 3, activation=jax.nn.softplus, key=jax.random.key(0)))
    arrays, static = eqx.partition(field, eqx.is_array)
    leaves, treedef = jax.tree.flatten(arrays)

    def step(flat: list[Any], ts: Any, ys: Any) -> tuple[Any, list[Any]]:
        def loss(flat: list[Any]) -> Any:
            f = eqx.combine(jax.tree.unflatten(treedef, flat), static)

            def solve(y0: Any) -> Any:
                sol = diffrax.diffeqsolve(
                    diffrax.ODETerm(f), diffrax.Tsit5(), t0=ts[0], t1=ts[-1], dt0=ts[1] - ts[0],
                    y0=y0, stepsize_controller=diffrax.PIDController(rtol=1e-3, atol=1e-6),
                    saveat=diffrax.SaveAt(ts=ts), throw=False,
                )  # fmt: skip
                return sol.ys

            return jnp.mean((jax.vmap(solve)(ys[:, 0]) - ys) ** 2)

        value, grads = jax.value_and_grad(loss)(flat)
        return value, [p - 1e-2 * g for p, g in zip(flat, grads, strict=True)]

    rng = np.random.default_rng(0)
    ts = np.linspace(0.0, 2.0, 32, dtype=np.float32)
    y0 = rng.normal(size=(8, 2)).astype(np.float32)
    ys = np.stack([y0 * np.exp(-t) * np.cos(t) for t in ts], axis=1)
    return step, ([np.asarray(x) for x in leaves], ts, ys)


def flax_program() -> tuple[Any, tuple[Any, ...]]:
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import numpy as np

    class Block(nn.Module):
        width: int

        @nn.compact
        def __call__(self, x: Any) -> Any:
            h = nn.LayerNorm()(x)
            h = nn.Dense(self.width * 2)(h)
            h = nn.gelu(h)
            return x + nn.Dense(self.width)(h)

    class Deep(nn.Module):
        depth: int = 48
        width: int = 64

        @nn.compact
        def __call__(self, x: Any) -> Any:
            x = nn.Dense(self.width)(x)
            for _ in range(self.depth):
                x = Block(self.width)(x)
            return nn.Dense(1)(nn.LayerNorm()(x))

    model = Deep()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 16)).astype(np.float32)
    y = rng.normal(size=(32, 1)).astype(np.float32)
    params = jax.tree.map(np.asarray, model.init(jax.random.key(0), x))

    def step(params: Any, x: Any, y: Any) -> tuple[Any, Any]:
        def loss(p: Any) -> Any:
            return jnp.mean((model.apply(p, x) - y) ** 2)

        value, grads = jax.value_and_grad(loss)(params)
        return value, jax.tree.map(lambda p, g: p - 1e-3 * g, params, grads)

    return step, (_plain(params), x, y)


def _plain(tree: Any) -> Any:
    """Flax's params as plain dicts (a FrozenDict would be a custom pytree node)."""
    if isinstance(tree, dict) or hasattr(tree, "items"):
        return {str(k): _plain(v) for k, v in tree.items()}
    return tree


PROGRAMS = {"diffrax": diffrax_program, "flax": flax_program}


# -- the child process ----------------------------------------------------------
def child(args: argparse.Namespace) -> None:
    t_import = time.perf_counter()
    import jax
    import numpy as np

    import_jax = time.perf_counter() - t_import
    name, version = f"bench/{args.program}-step", "1"
    if args.jax_cache:
        jax.config.update("jax_compilation_cache_dir", args.jax_cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    if args.store:
        import artifactstore

        artifactstore.configure()
    inputs_file = Path(args.named or ".") / f"{args.program}-inputs.npz"
    t0 = time.perf_counter()
    if args.named and inputs_file.exists():  # (d): no model code, no model libraries
        import artifactstore

        step = artifactstore.load(name, version=version)
        with np.load(inputs_file) as data:
            flat = [data[f"a{i}"] for i in range(len(data.files))]
        source = step.source
        inputs: Any = jax.tree.unflatten(jax.tree.structure(_treedef_template(args)), flat)
    else:
        fn, inputs = PROGRAMS[args.program]()
        if args.named:  # the prefill: build and store it, keep the inputs for the loads
            import artifactstore

            specs = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), inputs)
            step = artifactstore.compiled(fn, *specs, name=name, version=version)
            source = step.source
            flat = jax.tree.leaves(inputs)
            np.savez(inputs_file, **{f"a{i}": a for i, a in enumerate(flat)})
            _save_treedef(args, inputs)
        else:
            step, source = jax.jit(fn), "jit"
    ready = time.perf_counter() - t0
    value, _ = step(*inputs)
    loss = float(np.asarray(value))
    first_call = time.perf_counter() - t0
    print(json.dumps({
        "first_call_secs": first_call, "ready_secs": ready, "import_jax_secs": import_jax,
        "loss": repr(loss),
        "source": source, "model_modules": sorted(
            m for m in ("diffrax", "equinox", "flax") if m in sys.modules),
    }), flush=True)  # fmt: skip


def _treedef_file(args: argparse.Namespace) -> Path:
    return Path(args.named) / f"{args.program}-tree.json"


def _save_treedef(args: argparse.Namespace, inputs: Any) -> None:
    """The inputs' containers as JSON (plain dicts and lists), for the loading process."""

    def shape(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: shape(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return {"list" if isinstance(x, list) else "tuple": [shape(v) for v in x]}
        return 0

    _treedef_file(args).write_text(json.dumps(shape(inputs)))


def _treedef_template(args: argparse.Namespace) -> Any:
    def build(x: Any) -> Any:
        if isinstance(x, dict) and set(x) in ({"list"}, {"tuple"}):
            items = [build(v) for v in next(iter(x.values()))]
            return items if "list" in x else tuple(items)
        if isinstance(x, dict):
            return {k: build(v) for k, v in x.items()}
        return 0

    return build(json.loads(_treedef_file(args).read_text()))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3, help="timed runs per configuration")
    p.add_argument("--programs", default="diffrax,flax")
    p.add_argument("--out", type=Path, default=_results.default_out("named_first_call"))
    p.add_argument("--before", metavar="REF", help="also run each store config as git REF "
                   "(A/B in one run: a refactoring must stay within noise)")  # fmt: skip
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--program", help=argparse.SUPPRESS)
    p.add_argument("--jax-cache", help=argparse.SUPPRESS)
    p.add_argument("--store", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--named", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        child(a)
        return 0
    report: dict[str, Any] = {**_results.run_info(), "runs": a.runs, "before": a.before,
                              "programs": {}}  # fmt: skip
    configs = with_before(CONFIGS, a.before) if a.before else CONFIGS
    texts = []
    for program in a.programs.split(","):

        def run_once(cfg: Config, tmp: Path, program: str = program) -> Result:
            return run_child(cfg, tmp, [sys.executable, __file__, "--child", "--program", program])

        def on_run(i: int, c: Config, r: Result, program: str = program) -> None:
            print(f"{program} run {i + 1}/{a.runs} {c.name:<28} first "
                  f"{r['first_call_secs']:7.3f}s wall {r['wall_secs']:7.3f}s ({r['source']})",
                  flush=True)  # fmt: skip
            if c.name.startswith(NAMED) and (r["source"] != "store" or r["model_modules"]):
                sys.exit(f"[{c.name}] did not load natively without the model: {r}")

        raw, prefills = interleaved(configs, a.runs, run_once, on_run)
        losses = {r["loss"] for r in [*prefills, *(r for rs in raw.values() for r in rs)]}
        if len(losses) != 1:
            sys.exit(f"FAIL: {program}: losses differ across configurations: {sorted(losses)}")
        res = {c.name: {k: _results.summary([r[k] for r in raw[c.name]]) for _, k in COLUMNS}
               for c in configs}  # fmt: skip
        lines, _ = _results.table(res, COLUMNS, RATIO_COLS, [], JAX_WARM)
        named = res[NAMED]["first_call_secs"]["median"]
        verdicts = [
            f"target (d) first call <= {TARGET}x of {base}: "
            f"{named / res[base]['first_call_secs']['median']:.2f}x "
            f"{'met' if named <= TARGET * res[base]['first_call_secs']['median'] else 'NOT met'}"
            for base in (JAX_WARM, STORE_WARM)
        ]
        ab = ab_lines(res, a.before, ["first_call_secs", "wall_secs"]) if a.before else []
        texts.append("\n".join([f"## {program}", *lines, "", *verdicts, *ab]))
        report["programs"][program] = {"loss": next(iter(losses)), "verdicts": verdicts, "ab": ab,
                                       "configs": config_records(configs, res, raw)}  # fmt: skip
    text = "\n\n".join(texts) + f"\n\nmedian (min-max) over {a.runs} interleaved runs"
    print("\n" + text)
    _results.write(a.out, report, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
