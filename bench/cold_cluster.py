"""A cluster starting at once on an empty store: single-flight on vs off, JAX's shared cache.

N processes (N = 1, 2, 8, 16 by default) start the bundled compile-heavy example at the
same moment on an empty store, as the workers of a new job do after a new model, jaxlib
or GPU type. For each N and configuration the bench reports the total CPU seconds the
processes spent in XLA compiles (measured inside each process around JAX's compile entry
point) and the wall time from the first start to the last exit. Configurations, side by
side in one run, each on a fresh empty store (a new namespace, new local tiers):

- artifactstore S3+PostgreSQL, single-flight on (the default): one process compiles each
  key, the others wait for its result;
- the same with single-flight off (ARTSTORE_SINGLE_FLIGHT=0): every process compiles;
- JAX's own persistent cache in one directory shared by all N processes (the reference);
- artifactstore, warm (the store already holds everything): the floor that start-up
  alone (interpreters, `import jax`, N processes on this machine's cores) sets.

Targets (issue 17): with single-flight, compile CPU-seconds flat in N (<= 1.2x of N = 1)
and wall <= 1.3x of one cold process. On a machine with fewer cores than N, start-up
alone grows with N: compare the wall against the warm row of the same N.

    python bench/cold_cluster.py [--ns 1,2,8,16] [--layers 10] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import _results
import _stack

CHILD = r"""
import json, sys, time
from jax._src import compiler
real, spent, count = compiler.backend_compile_and_load, [0.0], [0]
def timed(*args, **kwargs):
    started = time.process_time()
    try:
        return real(*args, **kwargs)
    finally:
        spent[0] += time.process_time() - started
        count[0] += 1
compiler.backend_compile_and_load = timed
from artifactstore.examples import compile_heavy
import contextlib, io
out = io.StringIO()
with contextlib.redirect_stdout(out):
    result = compile_heavy.main(sys.argv[1:])
result.update(compile_cpu_secs=spent[0], xla_compiles=count[0])
print(json.dumps(result))
"""
STRIP = ("ARTSTORE_", "JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE")
ON, OFF, JAX, WARM = (
    "artifactstore, single-flight on",
    "artifactstore, single-flight off",
    "jax cache, one shared directory",
    "artifactstore warm (start-up floor)",
)
CONFIGS = (ON, OFF, JAX, WARM)


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(STRIP)}
    env["JAX_PLATFORMS"] = "cpu"
    return env


def launch(n: int, config: str, store: dict[str, str], work: Path, layers: int) -> dict[str, Any]:
    """Start n processes at once; total compile CPU, wall to the last exit, checksums."""
    run = uuid.uuid4().hex[:8]
    namespace = "warm" if config == WARM else f"cold-{run}"
    procs = []
    started = time.perf_counter()
    for i in range(n):
        env = base_env()
        args = ["--layers", str(layers)]
        if config == JAX:
            args += ["--jax-cache", str(work / f"jax-{run}")]
        else:
            args.append("--store")
            env.update(store, ARTSTORE_NAMESPACE=namespace, ARTSTORE_MIN_COMPILE_SECS="0",
                       ARTSTORE_TIMEOUT="120", ARTSTORE_LOCAL_TIER=str(work / f"tier-{run}-{i}"),
                       ARTSTORE_SINGLE_FLIGHT="0" if config == OFF else "auto")  # fmt: skip
        command = [sys.executable, "-c", CHILD, *args]
        pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
        procs.append(subprocess.Popen(command, env=env, **pipes))  # type: ignore[call-overload]
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=1800)
        if proc.returncode != 0:
            sys.exit(f"[{config}, N={n}] a process failed:\n{err[-3000:]}")
        outs.append(json.loads(out.strip().splitlines()[-1]))
    wall = time.perf_counter() - started
    return {
        "n": n,
        "config": config,
        "wall_secs": wall,
        "compile_cpu_secs": sum(o["compile_cpu_secs"] for o in outs),
        "xla_compiles": sum(o["xla_compiles"] for o in outs),
        "lease_waits": sum(o.get("store", {}).get("lease_waits", 0) for o in outs),
        "checksums": sorted({o["checksum"] for o in outs}),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ns", default="1,2,8,16", help="process counts (comma-separated)")
    parser.add_argument("--layers", type=int, default=10)
    parser.add_argument("--out", type=Path, default=_results.default_out("cold_cluster"))
    args = parser.parse_args(argv)
    ns = [int(n) for n in args.ns.split(",")]
    rows: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory(prefix="artstore-cold-") as tmp,
        _stack.team_store("artstore-bench-cold", "artstore_bench_cold") as store,
    ):
        work = Path(tmp)
        launch(1, WARM, store, work, args.layers)  # fills the warm namespace (untimed)
        for n in ns:
            for config in CONFIGS:  # side by side, for each N
                row = launch(n, config, store, work, args.layers)
                rows.append(row)
                print(f"N={n:<3} {config:<38} wall {row['wall_secs']:6.1f} s  compile CPU "
                      f"{row['compile_cpu_secs']:6.1f} s  XLA compiles {row['xla_compiles']}",
                      flush=True)  # fmt: skip
    checksums = {c for r in rows for c in r["checksums"]}
    if len(checksums) != 1:
        sys.exit(f"FAIL: results differ between processes or configurations: {checksums}")
    one = {r["config"]: r for r in rows if r["n"] == min(ns)}
    cold_one = one[ON]["wall_secs"]
    lines = [
        f"cold cluster: {args.layers}-layer compile_heavy, {os.cpu_count()} cores; ratios "
        f"against N={min(ns)} of the same configuration (CPU) and one cold process (wall)",
        "| N | configuration | compile CPU (s) | CPU / N=1 | wall (s) | wall / one cold "
        "| wall / warm floor | XLA compiles |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        floor = next(x for x in rows if x["n"] == r["n"] and x["config"] == WARM)["wall_secs"]
        base = one[r["config"]]["compile_cpu_secs"]
        cpu_ratio = f"{r['compile_cpu_secs'] / base:.2f}x" if base > 0 else "-"
        lines.append(
            f"| {r['n']} | {r['config']} | {r['compile_cpu_secs']:.1f} | {cpu_ratio} | "
            f"{r['wall_secs']:.1f} | {r['wall_secs'] / cold_one:.2f}x | "
            f"{r['wall_secs'] / floor:.2f}x | {r['xla_compiles']} |"
        )
    table = "\n".join(lines)
    print("\n" + table)
    report = {"run": _results.run_info(), "layers": args.layers, "rows": rows}
    _results.write(args.out, report, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
