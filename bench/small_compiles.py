"""Many small compiles, side by side: JAX's warm cache (thresholds 0) vs the store at its defaults.

One program: one deep jit (compiles well past ARTSTORE_MIN_COMPILE_SECS) and --small
distinct trivial jits (each compiles in milliseconds, under the default 0.1 s threshold),
as ordinary programs (Flax models, optimizers) have. Each configuration runs it in fresh
subprocesses (JAX_PLATFORMS=cpu, no inherited ARTSTORE_* or JAX cache variables); the
warm ones are pre-filled by one untimed run; timed runs are interleaved round-robin so
that machine noise hits every configuration alike. All checksums must agree, and the
store's warm runs must load every compile (the small ones from this host's tier).

    python bench/small_compiles.py [--runs 5] [--layers 24] [--small 48] [--out PATH]
    python bench/small_compiles.py --smoke     # seconds: 1 run, small sizes, no file (but --out)

The target (issue 46): the store's warm process at its defaults no slower than JAX's
own warm cache with its thresholds at 0 (wall ratio <= 1.05).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _results

STRIP_PREFIXES = ("ARTSTORE_", "JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE",
                  "JAX_ENABLE_COMPILATION_CACHE")  # fmt: skip
NO_CACHE = "no cache"
JAX_WARM = "jax local cache (warm, thresholds 0)"
STORE_WARM = "artifactstore embedded (warm, defaults)"
TARGETS = [(STORE_WARM, 1.05)]  # wall <= ratio x JAX_WARM
COLUMNS = [("program (s)", "program_secs"), ("process wall (s)", "wall_secs")]
RATIO_COLS = [("wall/jax-warm", "wall_secs", JAX_WARM), ("wall/no-cache", "wall_secs", NO_CACHE)]

# The measured program: JAX imported first, then the store (where configured), then
# the compiles; one JSON line: its time from the first compile on, a checksum, counts.
PROGRAM = """
import json, os, sys, time
import jax, jax.numpy as jnp
if os.environ.get("ARTSTORE_URL"):
    import artifactstore
    artifactstore.configure()
layers, small = int(sys.argv[1]), int(sys.argv[2])
started = time.monotonic()

@jax.jit
def deep(x):
    for i in range(layers):
        x = jnp.tanh(x @ x.T * (0.1 + 0.01 * i)) @ x + jnp.sin(x) * i
    return x.sum()

total = float(deep(jnp.linspace(-1.0, 1.0, 256, dtype=jnp.float32).reshape(16, 16)))
for i in range(small):
    total += float(jax.jit(lambda a, i=i: jnp.cos(a * (i + 2.0)) + i)(jnp.float32(0.5)))
secs = time.monotonic() - started
stats = {}
if os.environ.get("ARTSTORE_URL"):
    artifactstore.flush()
    stats = artifactstore.process_stats()
print(json.dumps({"program_secs": secs, "checksum": f"{total:.6e}", "store": stats}))
"""

Result = dict[str, Any]


@dataclass(frozen=True)
class Config:
    name: str
    env: Callable[[Path], dict[str, str]]
    prefill: bool = True
    store: bool = False  # warm runs must load every compile


CONFIGS = [
    Config(NO_CACHE, lambda _: {}, prefill=False),
    Config(
        JAX_WARM,
        lambda tmp: {
            "JAX_COMPILATION_CACHE_DIR": str(tmp / "jax-cache"),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
        },
    ),
    # The embedded default, nothing else set: its threshold (0.1 s) and local tier.
    Config(
        STORE_WARM,
        lambda tmp: {"ARTSTORE_URL": str(tmp / "store"), "XDG_CACHE_HOME": str(tmp / "cache")},
        store=True,
    ),
]


def run_once(c: Config, tmp: Path, script: Path, layers: int, small: int) -> Result:
    env = {k: v for k, v in os.environ.items() if not k.startswith(STRIP_PREFIXES)}
    env.update(JAX_PLATFORMS="cpu", ARTSTORE_ACTIVATE="0", **c.env(tmp))
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(script), str(layers), str(small)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    wall = time.monotonic() - started
    if done.returncode != 0:
        sys.exit(f"[{c.name}] the program failed ({done.returncode}):\n{done.stderr[-2000:]}")
    result: Result = json.loads(done.stdout.strip().splitlines()[-1])
    result["wall_secs"] = wall
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=5, help="timed runs per configuration")
    p.add_argument("--layers", type=int, default=24, help="depth of the one deep jit")
    p.add_argument("--small", type=int, default=48, help="trivial jits besides it")
    p.add_argument("--out", type=Path, help="(default: bench/results/small_compiles-jax*.json)")
    p.add_argument("--smoke", action="store_true", help="seconds: 1 run, 2 layers, 8 small jits; "
                   "writes a results file only to --out")  # fmt: skip
    a = p.parse_args(argv)
    if a.out is None and not a.smoke:
        a.out = _results.default_out("small_compiles")
    if a.smoke:
        a.runs, a.layers, a.small = 1, 2, 8
    top = Path(tempfile.mkdtemp(prefix="artstore-bench-small-"))
    try:
        script = top / "program.py"
        script.write_text(PROGRAM)
        tmps = {c.name: top / str(i) for i, c in enumerate(CONFIGS)}
        for t in tmps.values():
            t.mkdir()
        raw: dict[str, list[Result]] = {c.name: [] for c in CONFIGS}
        prefills = [run_once(c, tmps[c.name], script, a.layers, a.small) for c in CONFIGS
                    if c.prefill]  # fmt: skip
        for i in range(a.runs):
            for c in CONFIGS:
                r = run_once(c, tmps[c.name], script, a.layers, a.small)
                raw[c.name].append(r)
                print(f"run {i + 1}/{a.runs} {c.name:<42} program {r['program_secs']:7.3f}s"
                      f"  wall {r['wall_secs']:7.3f}s", flush=True)  # fmt: skip
                st = r["store"]
                compiles = a.small + 1
                if c.store and (st.get("loads", 0) < compiles or st.get("compiles", 0)):
                    sys.exit(f"[{c.name}] warm run compiled, not all {compiles} loaded: {st}")
    finally:
        shutil.rmtree(top, ignore_errors=True)
    checksums = {r["checksum"] for r in [*prefills, *(r for rs in raw.values() for r in rs)]}
    if len(checksums) != 1:
        sys.exit(f"FAIL: checksums differ across runs: {sorted(checksums)}")
    res: dict[str, dict[str, Any]] = {
        c.name: {k: _results.summary([r[k] for r in raw[c.name]]) for k, _ in _keys()}
        for c in CONFIGS
    }
    lines, targets = _results.table(res, COLUMNS, RATIO_COLS, TARGETS, JAX_WARM)
    lines += [
        "",
        f"median (min-max) over {a.runs} interleaved runs of fresh processes; "
        f"one deep jit of {a.layers} layers and {a.small} small jits; "
        f"identical checksum in every run: {next(iter(checksums))}",
        *_results.target_lines(targets, JAX_WARM),
    ]
    text = "\n".join(lines)
    print("\n" + text)
    if a.out is None:
        return 0
    report = {
        **_results.run_info(),
        "runs": a.runs, "layers": a.layers, "small": a.small,
        "targets": targets, "checksum": next(iter(checksums)),
        "configs": [{"name": c.name, **res[c.name], "raw": raw[c.name]} for c in CONFIGS],
    }  # fmt: skip
    _results.write(a.out, report, text)
    return 0


def _keys() -> list[tuple[str, str]]:
    return [(k, h) for h, k in COLUMNS]


if __name__ == "__main__":
    sys.exit(main())
