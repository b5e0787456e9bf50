"""Activation without code: what the .pth hook costs, and what the pytest plugin saves.

1. Interpreter start-up, `python -c pass` N times (interleaved, after warm-up runs, with
   bytecode written as pip writes it): a bare venv without artifactstore; the same with
   only our two top-level files added (`artifactstore_startup.pth` and its module), with
   ARTSTORE_* unset (one environment lookup) and with ARTSTORE_URL set (a process that
   never imports JAX loads only the stdlib-only hook); and this venv (artifactstore and
   its dependencies installed, an editable install's own finder included). Median and
   p90, ratios to the bare venv, and the modules of ours `-X importtime` shows; a second
   bare venv shows what noise alone makes of two identical configurations.
2. A pytest suite of compile-heavy tests (unrolled transformer steps, one per file), run
   twice (cold, then warm) in fresh directories: without any cache, with JAX's own cache
   (JAX_COMPILATION_CACHE_DIR) and with `pytest --artstore` (embedded store). Rounds are
   interleaved; warm/cold and warm vs the baselines' warm runs.

    python bench/activation.py [--runs 50] [--rounds 2] [--out bench/results/activation-jaxV.json]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _results

STARTUP = Path(__file__).resolve().parent.parent / "artifactstore" / "startup"
STRIP = ("ARTSTORE_", "JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE", "PYTEST_")
TEST_FILE = """
import jax, jax.numpy as jnp, numpy as np

def test_step():
    layers, width = {layers}, 64
    def layer(p, x):
        wq, wk, wv, wo, w1, w2 = p
        h = (x - x.mean(-1, keepdims=True)) / (x.std(-1, keepdims=True) + 1e-5)
        att = jax.nn.softmax((h @ wq) @ (h @ wk).T / 8.0, axis=-1)
        x = x + (att @ (h @ wv)) @ wo
        return x + jax.nn.gelu(x @ w1) @ w2
    def loss(ps, x):
        for i, p in enumerate(ps):
            x = layer(p, x) * (1.0 + 0.01 * i)
        return jnp.mean(x ** 2)
    rng = np.random.default_rng(0)
    shapes = [(width, width)] * 4 + [(width, 2 * width), (2 * width, width)]
    ps = [tuple(jnp.asarray(rng.normal(size=s).astype(np.float32) * 0.05) for s in shapes)
          for _ in range(layers)]
    x = jnp.asarray(rng.normal(size=(16, width)).astype(np.float32))
    value, grads = jax.jit(jax.value_and_grad(loss))(ps, x)
    assert np.isfinite(float(value))
"""


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(STRIP)}
    env["JAX_PLATFORMS"] = "cpu"
    return env


def bytecode_env() -> dict[str, str]:
    """Bytecode written, as `pip install` leaves it (some machines set the opposite)."""
    return {k: v for k, v in base_env().items() if k != "PYTHONDONTWRITEBYTECODE"}


def p90(values: list[float]) -> float:
    # One run (the smoke size) has no spread; Python < 3.13 refuses quantiles of one point.
    return values[0] if len(values) == 1 else statistics.quantiles(values, n=10)[-1]


def ours_at_startup(python: str, env: dict[str, str]) -> list[str]:
    proc = subprocess.run([python, "-X", "importtime", "-c", "pass"], env=env,
                          capture_output=True, text=True, check=True)  # fmt: skip
    names = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()]
    return [n for n in names if n.startswith(("artifactstore", "jax"))]


def startup(runs: int, tmp: Path) -> tuple[list[str], dict[str, Any]]:
    def venv(name: str, ours: bool) -> str:
        where = tmp / name
        subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(where)],
                       check=True)  # fmt: skip
        python = str(where / "bin" / "python")
        if ours:
            code = "import site; print(site.getsitepackages()[0])"
            site = subprocess.run([python, "-c", code], capture_output=True, text=True,
                                  check=True).stdout.strip()  # fmt: skip
            for name in ("artifactstore_startup.pth", "artifactstore_startup.py"):
                shutil.copy(STARTUP / name, Path(site) / name)
            subprocess.run([python, "-m", "compileall", "-q", site], env=bytecode_env(),
                           check=True)  # fmt: skip
        return python

    bare, control, ours = venv("bare", False), venv("bare2", False), venv("ours", True)
    url = {"ARTSTORE_URL": str(tmp / "store")}
    configs = {
        "bare venv (no artifactstore)": (bare, base_env()),
        "another bare venv (the noise)": (control, base_env()),
        "bare + our .pth, ARTSTORE_* unset": (ours, base_env()),
        "bare + our .pth, ARTSTORE_URL set (no JAX import)": (ours, {**base_env(), **url}),
        "this venv (installed), ARTSTORE_* unset": (sys.executable, base_env()),
    }
    times: dict[str, list[float]] = {name: [] for name in configs}
    for round_ in range(runs + 3):  # 3 warm-up rounds, not counted
        for name, (python, env) in configs.items():
            started = time.perf_counter()
            subprocess.run([python, "-c", "pass"], env=env, check=True)
            if round_ >= 3:
                times[name].append(time.perf_counter() - started)
    base = statistics.median(times["bare venv (no artifactstore)"])
    rows, res = [], {}
    for name, values in times.items():
        python, env = configs[name]
        found = ours_at_startup(python, env)
        med = statistics.median(values)
        res[name] = {"median_secs": med, "p90_secs": p90(values), "runs": len(values),
                     "modules_of_ours": found, "ratio_to_bare": med / base}  # fmt: skip
        rows.append([name, f"{med * 1000:.2f}", f"{p90(values) * 1000:.2f}",
                     f"{med / base:.3f}x", ", ".join(found) or "none"])  # fmt: skip
    header = ["python -c pass", "median ms", "p90 ms", "median/bare", "ours imported"]
    return _results.grid(header, rows), res


def suite(rounds: int, files: int, tmp: Path) -> tuple[list[str], dict[str, Any]]:
    tests = tmp / "suite"
    tests.mkdir()
    for i in range(files):
        (tests / f"test_heavy_{i}.py").write_text(TEST_FILE.format(layers=4 + i))
    pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
              "--rootdir", str(tests), str(tests)]  # fmt: skip

    def config(name: str, where: Path) -> tuple[list[str], dict[str, str]]:
        env = base_env()
        if name == "jax local cache":
            env.update(JAX_COMPILATION_CACHE_DIR=str(where),
                       JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                       JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")  # fmt: skip
            return pytest, env
        if name == "pytest --artstore":
            env.update(ARTSTORE_URL=str(where), XDG_CACHE_HOME=str(where / "xdg"))
            return [*pytest, "--artstore"], env
        return pytest, env

    names = ["no cache", "jax local cache", "pytest --artstore"]
    walls: dict[str, dict[str, list[float]]] = {n: {"cold": [], "warm": []} for n in names}
    for r in range(rounds):
        for name in names:
            where = tmp / f"{name.replace(' ', '_')}-{r}"
            argv, env = config(name, where)
            for phase in ("cold", "warm"):
                started = time.perf_counter()
                proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
                walls[name][phase].append(time.perf_counter() - started)
                if proc.returncode != 0:
                    raise SystemExit(f"{name} {phase} failed:\n{proc.stdout[-2000:]}")
                if name == "pytest --artstore" and "artifactstore:" not in proc.stdout:
                    raise SystemExit("the plugin printed no summary: inert?\n" + proc.stdout)
    med = {n: {p: statistics.median(v) for p, v in walls[n].items()} for n in names}
    rows, res = [], {}
    for name in names:
        cold, warm = med[name]["cold"], med[name]["warm"]
        res[name] = {"cold_wall_secs": cold, "warm_wall_secs": warm, "runs": walls[name],
                     "warm_over_cold": warm / cold,
                     "warm_over_no_cache": warm / med["no cache"]["warm"],
                     "warm_over_jax_warm": warm / med["jax local cache"]["warm"]}  # fmt: skip
        rows.append([name, f"{cold:.2f}", f"{warm:.2f}", f"{warm / cold:.3f}x",
                     f"{res[name]['warm_over_no_cache']:.3f}x",
                     f"{res[name]['warm_over_jax_warm']:.3f}x"])  # fmt: skip
    header = [f"pytest, {files} compile-heavy tests", "cold s", "warm s", "warm/cold",
              "warm/no-cache", "warm/jax-warm"]  # fmt: skip
    return _results.grid(header, rows), res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--out", type=Path, default=_results.default_out("activation"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="artstore-bench-activation-") as tmp:
        start_lines, start_res = startup(args.runs, Path(tmp))
        print("\n".join(start_lines))
        suite_lines, suite_res = suite(args.rounds, args.files, Path(tmp))
        print()
        print("\n".join(suite_lines))
    report = {**_results.run_info(), "startup": start_res, "pytest_suite": suite_res}
    _results.write(args.out, report, "\n".join([*start_lines, "", *suite_lines]))


if __name__ == "__main__":
    main()
