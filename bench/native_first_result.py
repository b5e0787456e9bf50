"""Without Python: time to a first result, and per call, native modules against XLA.

Issue 47. Three programs stored as named executables (`artifactstore.compiled`) and
built as native modules (`artifactstore.native.build`, generic CPU, checked against
XLA): an MLP, a convolution and a scan (an RNN over time steps). Then, on the CPU:

- time to first result, each in fresh processes (wall time of the whole process, from
  its start to its result on the host, interleaved runs): (a) Python + JAX +
  `artifactstore.load` (the named executable), (b) Python + `artifactstore.native.load`
  (no JAX imported), (c) the `iree-run-module` binary on the module `artstore native get`
  wrote (no Python at all), on the MLP;
- steady state, per call, in one process: the named executable (XLA, results on the
  host) against the native module (IREE's runtime, numpy in and out), per program.

Ratios are of one run's medians. Results: bench/results/native_first_result-jaxV.json.

    python bench/native_first_result.py [--runs 5] [--calls 200] [--size full|smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _results

SIZES = {"full": {"width": 512, "batch": 64, "image": 64, "steps": 128},
         "smoke": {"width": 16, "batch": 2, "image": 8, "steps": 4}}  # fmt: skip
PROGRAMS = ("mlp", "conv", "scan")

CHILD = r"""
import json, os, sys, time
import numpy as np
mode, name, arrays = sys.argv[1], sys.argv[2], sys.argv[3]
inputs = [np.load(os.path.join(arrays, f"in{i}.npy")) for i in range(int(sys.argv[4]))]
if mode == "jax":
    import artifactstore
    f = artifactstore.load(name, version="1")
    out = [np.asarray(x) for x in f(*inputs)]
else:
    import artifactstore.native as native
    f = native.load(name, "1")
    out = list(f(*inputs))
print(json.dumps({"jax": "jax" in sys.modules, "sum": float(sum(np.sum(o) for o in out))}))
"""


def programs(size: dict[str, int]) -> dict[str, tuple[Any, list[Any]]]:
    """name -> (function of flat arrays returning a tuple, its inputs as numpy arrays)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(0)
    w, b, img, steps = size["width"], size["batch"], size["image"], size["steps"]

    def arr(*shape: int) -> Any:
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)

    def mlp(x: Any, w1: Any, w2: Any, w3: Any) -> Any:
        h = jax.nn.relu(x @ w1)
        h = jax.nn.relu(h @ w2)
        return (h @ w3,)

    def conv(x: Any, k1: Any, k2: Any) -> Any:
        dn = ("NHWC", "HWIO", "NHWC")
        h = jax.nn.relu(jax.lax.conv_general_dilated(x, k1, (1, 1), "SAME", dimension_numbers=dn))
        return (jax.lax.conv_general_dilated(h, k2, (1, 1), "SAME", dimension_numbers=dn),)

    def scan(xs: Any, wh: Any, wx: Any) -> Any:
        def cell(h: Any, x: Any) -> Any:
            h = jnp.tanh(h @ wh + x @ wx)
            return h, h.sum()

        h, sums = jax.lax.scan(cell, jnp.zeros((xs.shape[1], wh.shape[0])), xs)
        return h, sums

    return {
        "mlp": (mlp, [arr(b, w), arr(w, w), arr(w, w), arr(w, 10)]),
        "conv": (conv, [arr(b, img, img, 8), arr(3, 3, 8, 16), arr(3, 3, 16, 16)]),
        "scan": (scan, [arr(steps, b, w), arr(w, w), arr(w, w)]),
    }


def prefill(tmp: Path, size: dict[str, int], calls: int) -> dict[str, Any]:
    """Store and build every program; write their inputs; time calls per program."""
    import jax
    import numpy as np

    import artifactstore
    from artifactstore.native import build, load

    artifactstore.configure(url=str(tmp / "store"))
    steady: dict[str, Any] = {}
    for name, (fn, inputs) in programs(size).items():
        specs = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in inputs]
        xla = artifactstore.compiled(fn, *specs, name=name, version="1")
        built = build(name, "1", inputs=inputs)  # checked on these (a contractive scan)
        native = load(name, "1")
        (tmp / name).mkdir()
        for i, x in enumerate(inputs):
            np.save(tmp / name / f"in{i}.npy", x)

        def xla_call(xla: Any = xla, inputs: list[Any] = inputs) -> None:
            [np.asarray(o) for o in xla(*inputs)]

        def native_call(native: Any = native, inputs: list[Any] = inputs) -> None:
            native(*inputs)

        steady[name] = {
            "xla_call_secs": per_call(xla_call, calls),
            "native_call_secs": per_call(native_call, calls),
            "module_bytes": built.size,
            "compile_secs": built.compile_secs,
        }
        steady[name]["native_vs_xla"] = (
            steady[name]["native_call_secs"] / steady[name]["xla_call_secs"]
        )
    return steady


def per_call(call: Any, calls: int) -> float:
    """Median seconds of `call` over `calls` calls (after 3 untimed ones)."""
    for _ in range(3):
        call()
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def timed(cmd: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    secs = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[:3]} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    if cmd[0] == sys.executable:
        said = json.loads(proc.stdout.strip().splitlines()[-1])
        assert said["jax"] == (cmd[3] == "jax"), said  # native.load: no JAX imported
    return secs


def first_results(tmp: Path, runs: int, env: dict[str, str]) -> dict[str, list[float]]:
    """Wall seconds of fresh processes to the MLP's first result, per configuration."""
    from artifactstore.native.iree import run_module_binary

    arrays, count = tmp / "mlp", 4
    got = tmp / "got"
    subprocess.run([sys.executable, "-m", "artifactstore", "native", "get", "mlp@1", "-o",
                    str(got)], env=env, check=True, capture_output=True)  # fmt: skip
    binary = [run_module_binary(), f"--module={got / 'mlp.vmfb'}", "--function=main",
              *(f"--input=@{arrays / f'in{i}.npy'}" for i in range(count))]  # fmt: skip
    configs = {
        "python + jax + artifactstore.load": [sys.executable, "-c", CHILD, "jax", "mlp",
                                              str(arrays), str(count)],
        "python + artifactstore.native.load": [sys.executable, "-c", CHILD, "native", "mlp",
                                               str(arrays), str(count)],
        "iree-run-module (no python)": binary,
    }  # fmt: skip
    times: dict[str, list[float]] = {name: [] for name in configs}
    for _ in range(runs):  # interleaved
        for name, cmd in configs.items():
            times[name].append(timed(cmd, env))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--size", choices=sorted(SIZES), default="full")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.runs == 1 and args.calls <= 5:
        args.size = "smoke"
    size = SIZES[args.size]
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        env = {k: v for k, v in os.environ.items() if not k.startswith("ARTSTORE_")}
        env.update(ARTSTORE_URL=str(tmp / "store"), JAX_PLATFORMS="cpu")
        os.environ.update(env)
        steady = prefill(tmp, size, args.calls)
        first = first_results(tmp, args.runs, env)
    report = report_of(first, steady, args, size)
    _results.write(args.out or _results.default_out("native_first_result"), report,
                   "\n".join(report["lines"]))  # fmt: skip


def report_of(
    first: dict[str, list[float]], steady: dict[str, Any], args: Any, size: dict[str, int]
) -> dict[str, Any]:
    base = "python + jax + artifactstore.load"
    summaries = {name: _results.summary(values) for name, values in first.items()}
    ratios = {n: s["median"] / summaries[base]["median"] for n, s in summaries.items()}
    lines = ["time to first result (MLP, fresh process, wall s): median (min-max), vs JAX"]
    for name, s in summaries.items():
        lines.append(f"  {name:<36} {s['median']:.3f} ({s['min']:.3f}-{s['max']:.3f})"
                     f"  {ratios[name]:.3f}x")  # fmt: skip
    lines.append("steady state per call (ms): XLA (named) vs native (IREE), ratio")
    for name, s in steady.items():
        xla, native = 1e3 * s["xla_call_secs"], 1e3 * s["native_call_secs"]
        lines.append(f"  {name:<6} {xla:.3f}  {native:.3f}  {s['native_vs_xla']:.2f}x"
                     f"  ({s['module_bytes']} B module)")  # fmt: skip
    print("\n".join(lines))
    return {"run": _results.run_info(), "args": vars(args) | {"out": str(args.out)},
            "size": size, "first_result": summaries, "first_result_vs_jax": ratios,
            "steady": steady, "lines": lines}  # fmt: skip


if __name__ == "__main__":
    main()
