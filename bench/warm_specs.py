"""`artstore warm MODULE:FUNCTION`: time to warm, and what warming buys a fresh process.

Five specializations (one per sequence length) of a small transformer-like
model are warmed with `artstore warm warm_specs:specializations`, serially
(-j 1) and with -j 2, each time into a fresh embedded store. A fresh process
that calls the five on real data is timed against an empty store (it must
compile) and against a warmed one (it must load all five, compile none).
Runs are interleaved round-robin; every run's results must agree.

    python bench/warm_specs.py [--runs 3] [--out bench/results/warm_specs.json]

This file is also the MODULE that `artstore warm` imports (`specializations`),
and, with `--call`, the fresh process that uses the warmed executables.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
LENGTHS = (64, 128, 192, 256, 320)
D, LAYERS = 64, 8
STRIP_PREFIXES = (
    "ARTSTORE_",
    "JAX_COMPILATION_CACHE",
    "JAX_PERSISTENT_CACHE",
    "JAX_ENABLE_COMPILATION_CACHE",
)


# -- the module `artstore warm` imports -----------------------------------------
def _model() -> Any:
    import jax
    import jax.numpy as jnp

    @jax.jit
    def model(params: Any, tokens: Any) -> Any:
        h = tokens
        for p in params:
            q, k, v = h @ p["wq"], h @ p["wk"], h @ p["wv"]
            att = jax.nn.softmax(q @ k.T / jnp.sqrt(float(D)), axis=-1)
            h = jax.nn.standardize(h + att @ v, axis=-1)
            h = h + jax.nn.gelu(h @ p["w1"]) @ p["w2"]
        return h.mean(axis=0)

    return model


def _param_shapes() -> list[dict[str, tuple[int, int]]]:
    layer = {"wq": (D, D), "wk": (D, D), "wv": (D, D), "w1": (D, 4 * D), "w2": (4 * D, D)}
    return [dict(layer) for _ in range(LAYERS)]


def specializations() -> list[tuple[Any, Any]]:
    import jax
    import jax.numpy as jnp

    model = _model()
    params = jax.tree_util.tree_map(
        lambda s: jax.ShapeDtypeStruct(s, jnp.float32),
        _param_shapes(),
        is_leaf=lambda x: isinstance(x, tuple),
    )
    return [(model, (params, jax.ShapeDtypeStruct((n, D), jnp.float32))) for n in LENGTHS]


def call() -> None:
    """A fresh process: the five specializations on real data, first calls timed."""
    import numpy as np

    started = time.perf_counter()
    import artifactstore

    artifactstore.configure()
    model = _model()
    rng = np.random.default_rng(0)
    params = [
        {k: (rng.standard_normal(s) * 0.1).astype(np.float32) for k, s in layer.items()}
        for layer in _param_shapes()
    ]
    first_call, digest = 0.0, hashlib.sha256()
    for n in LENGTHS:
        tokens = rng.standard_normal((n, D)).astype(np.float32)
        t0 = time.perf_counter()
        out = np.asarray(model(params, tokens))
        first_call += time.perf_counter() - t0
        digest.update(out.tobytes())
    artifactstore.flush()
    print(
        json.dumps(
            {
                "first_call_secs": first_call,
                "setup_secs": t0 - started,
                "checksum": digest.hexdigest()[:16],
                "store": artifactstore.process_stats(),
            }
        )
    )


# -- the benchmark ----------------------------------------------------------------
def _env(store: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(STRIP_PREFIXES)}
    env.update({"JAX_PLATFORMS": "cpu", "ARTSTORE_URL": str(store), **extra})
    return env


def warm(store: Path, jobs: int) -> dict[str, Any]:
    report = store.parent / f"{store.name}-report.json"
    cmd = [
        sys.executable,
        "-m",
        "artifactstore",
        "warm",
        "--report-json",
        str(report),
        "warm_specs:specializations",
        "-j",
        str(jobs),
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(
        cmd, env=_env(store), cwd=HERE, capture_output=True, text=True, timeout=900, check=False
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"warm -j {jobs} failed:\n{proc.stdout}{proc.stderr[-3000:]}")
    data = json.loads(report.read_text())
    if data["added"] != len(LENGTHS):
        sys.exit(f"warm -j {jobs} added {data['added']} entries, expected {len(LENGTHS)}")
    return {"wall_secs": wall, "compile_secs": data["compile_secs_added"]}


def create_empty(store: Path) -> Path:
    """An existing, empty store: a reader's view of a store nobody warmed."""
    subprocess.run(
        [sys.executable, "-m", "artifactstore", "stats"],
        env=_env(store),
        capture_output=True,
        check=True,
        timeout=300,
    )
    return store


def fresh_process(store: Path, *, warmed: bool) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--call"]
    t0 = time.perf_counter()
    proc = subprocess.run(
        cmd,
        env=_env(store, ARTSTORE_READ_ONLY="1"),
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"fresh process failed:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    st = out["store"]
    want = (len(LENGTHS), 0) if warmed else (0, len(LENGTHS))
    if (st.get("loads", 0), st.get("compiles", 0)) != want:
        sys.exit(f"fresh process (warmed={warmed}) loads/compiles {st}, expected {want}")
    return {
        "wall_secs": wall,
        "first_call_secs": out["first_call_secs"],
        "checksum": out["checksum"],
    }


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3, help="timed runs per measurement")
    p.add_argument("--out", type=Path, default=Path("bench/results/warm_specs.json"))
    p.add_argument("--call", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.call:
        call()
        return 0
    sys.path.insert(0, str(HERE))
    import _results

    names = [
        "warm -j 1 (serial)",
        "warm -j 2",
        "fresh process, empty store",
        "fresh process, warmed store",
    ]
    raw: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    checksums: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="artstore-bench-") as root:
        for i in range(a.runs):
            base = Path(root) / f"run{i}"
            base.mkdir()
            raw[names[0]].append(warm(base / "serial", 1))
            warmed = base / "parallel"
            raw[names[1]].append(warm(warmed, 2))
            for name, store, is_warm in (
                (names[2], create_empty(base / "empty"), False),
                (names[3], warmed, True),
            ):
                r = fresh_process(store, warmed=is_warm)
                raw[name].append(r)
                checksums.add(r["checksum"])
            print(
                f"run {i + 1}/{a.runs}: "
                + "  ".join(f"{n} {raw[n][-1]['wall_secs']:.2f}s" for n in names),
                flush=True,
            )
    if len(checksums) != 1:
        sys.exit(f"FAIL: results differ across runs: {sorted(checksums)}")

    res = {
        n: {k: summary([r[k] for r in raw[n]]) for k in raw[n][0] if k != "checksum"} for n in names
    }

    def med(name: str, key: str) -> float:
        return float(res[name][key]["median"])

    def cell(s: dict[str, float]) -> str:
        return f"{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})"

    lines = [f"{'measurement':<30}{'wall (s)':>20}{'first calls (s)':>20}{'compile (s)':>20}"]
    for n in names:
        r = res[n]
        lines.append(
            f"{n:<30}{cell(r['wall_secs']):>20}"
            f"{cell(r['first_call_secs']) if 'first_call_secs' in r else '-':>20}"
            f"{cell(r['compile_secs']) if 'compile_secs' in r else '-':>20}"
        )
    ratios = {
        "warm wall, -j 2 / serial": med(names[1], "wall_secs") / med(names[0], "wall_secs"),
        "first calls, warmed / empty": (
            med(names[3], "first_call_secs") / med(names[2], "first_call_secs")
        ),
        "fresh process wall, warmed / empty": (
            med(names[3], "wall_secs") / med(names[2], "wall_secs")
        ),
    }
    lines += [
        "",
        *(f"{k:<40}{v:.3f}x" for k, v in ratios.items()),
        "",
        f"median (min-max) over {a.runs} interleaved runs; {len(LENGTHS)} specializations "
        f"(lengths {', '.join(map(str, LENGTHS))}; d={D}, {LAYERS} layers); "
        f"os.cpu_count()={os.cpu_count()}; identical checksum in every fresh process: "
        f"{next(iter(checksums))}",
    ]
    text = "\n".join(lines)
    print("\n" + text)
    report = {
        **_results.run_info(),
        "runs": a.runs,
        "lengths": list(LENGTHS),
        "d": D,
        "layers": LAYERS,
        "ratios": ratios,
        "results": {n: {**res[n], "raw": raw[n]} for n in names},
    }
    _results.write(a.out, report, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
