"""torchax warm start, side by side: a PyTorch MLP's training step with no cache, JAX's own
persistent cache, and artifactstore (compile cache, embedded and S3+PostgreSQL; named step).

torchax runs PyTorch functions through `jax.jit`, so its compiles go through JAX's cache
and the store alike. Each configuration runs artifactstore/examples/torchax_mlp.py in fresh
subprocesses (JAX_PLATFORMS=cpu unless --platform, no inherited ARTSTORE_* or JAX cache
variables; warm configurations after one untimed prefill; timed runs interleaved
round-robin, as bench/warm_start.py does). Reported: setup (imports of torch, torchax and
JAX, the model on torchax's device), first step (trace and compile or load, and run: for
the named step, its load with no trace), process wall. Every run's losses must agree bit
for bit; warm store runs must load (hits, no misses), and JAX's warm runs miss nothing.
Needs `pip install -e '.[torch]'`.

    python bench/torchax_warm_start.py [--runs 3] [--layers 16] [--width 256] [--note TEXT]
"""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

import _results
from warm_start import (
    JAX_WARM,
    NO_CACHE,
    PLATFORM,
    RATIO_COLS,
    S3PG_NAME,
    TARGET_NAME,
    Config,
    Result,
    config_records,
    embedded_env,
    interleaved,
    run_child,
    s3pg_env,
)

EXAMPLE = [sys.executable, "-m", "artifactstore.examples.torchax_mlp"]
NAMED = "artifactstore named step (warm)"


CONFIGS: list[Config] = [
    Config(NO_CACHE),
    Config(JAX_WARM, args=lambda tmp: ["--jax-cache", str(tmp)], prefill=True),
    Config(TARGET_NAME, env=embedded_env, prefill=True, store=True),
    Config(S3PG_NAME, env=s3pg_env, prefill=True, store=True),
    Config(
        NAMED,
        args=lambda _: ["--named", "bench/torchax-step@1"],
        env=embedded_env,
        prefill=True,
        store=True,
    ),
]
COLUMNS = [
    ("setup (s)", "setup_secs"),
    ("first step (s)", "first_call_secs"),
    ("process wall (s)", "wall_secs"),
]
MISSES = "/jax/compilation_cache/cache_misses"


def check(c: Config, r: Result) -> str | None:
    """Why a warm run does not count (it compiled what its cache should have held)."""
    st = r.get("store") or {}
    if c.store and c.prefill and (st.get("hits", 0) < 1 or st.get("misses", 0)):
        return f"warm store run missed: {st}"
    if c.name == JAX_WARM and r["events"].get(MISSES):
        return f"JAX's warm cache missed {r['events'][MISSES]} compiles"
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3, help="timed runs per configuration")
    p.add_argument("--layers", type=int, default=16, help="hidden layers of the MLP")
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--platform", default="cpu", help="JAX_PLATFORMS of the runs")
    p.add_argument("--note", default="", help="a line for the results (e.g. machine load)")
    p.add_argument(
        "--configs",
        help="comma-separated substrings of config names to run (default all; a machine "
        "that may open no socket, as the TPU machine, cannot run S3+PostgreSQL)",
    )
    p.add_argument("--out", type=Path, default=_results.default_out("torchax_warm_start"))
    a = p.parse_args(argv)
    PLATFORM[0] = a.platform
    wanted = [w.strip().lower() for w in a.configs.split(",")] if a.configs else None
    configs = [c for c in CONFIGS if not wanted or any(w in c.name.lower() for w in wanted)]
    if not configs:
        p.error(f"--configs {a.configs!r} matches no configuration")
    model = ["--layers", str(a.layers), "--width", str(a.width)]

    def run(c: Config, tmp: Path) -> Result:
        return run_child(c, tmp, [*EXAMPLE, *model])

    def on_run(i: int, c: Config, r: Result) -> None:
        print(
            f"run {i + 1}/{a.runs} {c.name:<40} setup {r['setup_secs']:6.2f}s"
            f"  first step {r['first_call_secs']:6.3f}s  wall {r['wall_secs']:6.2f}s",
            flush=True,
        )
        if (why := check(c, r)) is not None:
            sys.exit(f"[{c.name}] {why}")

    raw, prefills = interleaved(configs, a.runs, run, on_run)
    losses = {tuple(r["losses"]) for r in [*prefills, *(r for rs in raw.values() for r in rs)]}
    if len(losses) != 1:
        sys.exit(f"FAIL: losses differ across runs: {sorted(losses)}")
    res: dict[str, dict[str, Any]] = {
        c.name: {k: _results.summary([r[k] for r in raw[c.name]]) for _, k in COLUMNS}
        for c in configs
    }
    lines, _ = _results.table(res, COLUMNS, RATIO_COLS, [], JAX_WARM)
    versions = {m: version(m) for m in ("torch", "torchax", "jax", "jaxlib")}
    lines += [
        "",
        f"median (min-max) over {a.runs} interleaved runs; platform={a.platform}; MLP "
        f"{a.layers}x{a.width}, 3 SGD steps; " + ", ".join(f"{m} {v}" for m, v in versions.items()),
        f"identical losses (bit for bit) in all runs, prefills too: {list(next(iter(losses)))}",
        *([a.note] if a.note else []),
    ]
    text = "\n".join(lines)
    print("\n" + text)
    report = {
        **_results.run_info(),
        **versions,
        "runs": a.runs,
        "layers": a.layers,
        "width": a.width,
        "platform": a.platform,
        "note": a.note,
        "losses": list(next(iter(losses))),
        "configs": config_records(configs, res, raw),
    }
    _results.write(a.out, report, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
