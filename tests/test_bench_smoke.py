"""Every benchmark in bench/ runs at a smoke size and writes its results file, so none rots.

A benchmark runs by hand, on a machine of its own: a change to the store's interface can
leave one failing unseen for months (gc_scale.py's blob store missed the record methods the
interface gained). CI's "benchmarks at smoke size" phase runs each here with the fewest
runs and the smallest sizes its arguments take (seconds each), into a temporary results
file, and checks that the file holds numbers; the numbers themselves mean nothing at this
size. A new benchmark needs a row in SMOKE (test_every_benchmark_has_a_smoke_size).
Run only where `-m bench_smoke` names it (tests/suite_rules.py); in that phase, on the
venv with the bench and torch extras, a skip fails (ARTSTORE_BENCH_CI=1,
tests/security/ci_rules.py).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, skip_unless_importable

BENCH = REPO / "bench"
pytestmark = pytest.mark.bench_smoke

# bench/NAME -> (its smallest arguments, the modules beyond the dev extra it imports).
SMOKE: dict[str, tuple[str, list[str]]] = {
    "activation.py": ("--runs 1 --rounds 1 --files 1", []),
    "callbacks_diffrax.py": ("--runs 1", ["diffrax", "equinox"]),
    "cold_cluster.py": ("--ns 1 --layers 2", []),
    "gc_scale.py": ("--entries 2000", []),
    "hit_latency.py": ("--sizes-mb 1", []),
    "named_call.py": ("--leaves 10 --rounds 1 --calls 5", []),
    "named_first_call.py": ("--runs 1", ["diffrax", "equinox", "flax"]),
    "native_first_result.py": ("--runs 1 --calls 3", ["iree.compiler", "iree.runtime"]),
    "reader_scale.py": (
        "--n 2 --lookups 2 --entries 2 --payload-kb 10 --hold-secs 0.1 --min-free-mb 256",
        [],
    ),
    "signing_cost.py": ("--rounds 1", []),
    "small_compiles.py": ("--smoke", []),
    "soak.py": (
        "--minutes 0.5 --warmup 5 --tail 5 --gap-min 2 --gap-max 4 --worker-secs 20 "
        "--gc-every 5 --drift-secs 10",
        [],
    ),
    "torchax_warm_start.py": ("--runs 1 --layers 2 --width 16", ["torch", "torchax"]),
    "tpu_gpt.py": ("--runs 1 --steps 1 --platform cpu", []),
    "warm_specs.py": ("--runs 1", []),
    "warm_start.py": ("--runs 1 --layers 2", []),
}
# ... and the environment some take their smoke size from.
SMOKE_ENV = {"tpu_gpt.py": {"TPU_GPT_TINY": "1"}}  # a GPT of 2 layers, width 64
# Not benchmarks: shared code, and the program soak.py starts.
HELPERS = {"_results.py", "_stack.py", "soak_job.py"}


def test_every_benchmark_has_a_smoke_size() -> None:
    benches = {p.name for p in BENCH.glob("*.py")} - HELPERS
    assert benches == set(SMOKE), (
        f"without a smoke size: {sorted(benches - set(SMOKE))}; "
        f"no longer in bench/: {sorted(set(SMOKE) - benches)}"
    )


def test_the_gpu_scripts_parse() -> None:
    """The GPU scripts need CUDA, which CI lacks: they are only checked to parse."""
    for script in sorted(BENCH.glob("*.sh")):
        proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{script.name}: {proc.stderr}"


def numbers(value: Any) -> list[float]:
    """Every finite number in a JSON document (booleans are not numbers here)."""
    if isinstance(value, bool):
        return []
    if isinstance(value, int | float):
        return [float(value)] if math.isfinite(value) else []
    if isinstance(value, dict):
        return [n for v in value.values() for n in numbers(v)]
    if isinstance(value, list):
        return [n for v in value for n in numbers(v)]
    return []


@pytest.mark.parametrize("name", sorted(SMOKE))
def test_benchmark_runs_at_smoke_size(name: str, tmp_path: Path) -> None:
    """Slow: each starts JAX programs (5-60 s at this size)."""
    args, modules = SMOKE[name][0].split(), SMOKE[name][1]
    if modules:
        skip_unless_importable(modules, "pip install -e '.[bench,torch]'")
    out = tmp_path / f"{name.removesuffix('.py')}.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARTSTORE_")}
    proc = subprocess.run(
        [sys.executable, str(BENCH / name), *args, "--out", str(out)],
        cwd=REPO, env={**env, "JAX_PLATFORMS": "cpu", **SMOKE_ENV.get(name, {})},
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    said = f"{name} {' '.join(args)}: exit {proc.returncode}\n{proc.stdout[-2000:]}"
    said += f"\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, said
    assert out.exists(), f"{name} wrote no results file\n{said}"
    found = numbers(json.loads(out.read_text()))
    assert found, f"{name}'s results hold no number: {out.read_text()[:2000]}"
