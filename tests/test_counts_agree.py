"""One meaning of hits and misses everywhere (issue 32): a miss is a compile the store
could have served; compiles under ARTSTORE_MIN_COMPILE_SECS are counted apart as quick."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from conftest import PROGRAMS, artstore, clean_env

SUMMARY = re.compile(
    r"^artstore run: hits (\d+), misses (\d+) \((\d+) stored\), .*?"
    r"(?:; (\d+) quick compiles not stored \(ARTSTORE_MIN_COMPILE_SECS\))?"
    r"(?:; compiling took [\d.]+ s)?$",
    re.MULTILINE,
)


def _run(env: dict[str, str]) -> tuple[tuple[int, ...], dict[str, int]]:
    """`artstore run` of job.py: its summary's (hits, misses, stored, quick), and the
    program's own process_stats()."""
    proc = subprocess.run(
        [sys.executable, "-m", "artifactstore", "run", "--", sys.executable,
         str(PROGRAMS / "job.py")],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    found = SUMMARY.search(proc.stderr)
    assert found, proc.stderr
    stats = json.loads(proc.stdout.strip().splitlines()[-1])["store"]
    return tuple(int(n or 0) for n in found.groups()), stats


def test_a_warm_run_has_no_misses_and_counts_quick_compiles_apart(tmp_path: Path) -> None:
    """Slow: two JAX programs under `artstore run`, the first with compiles slowed by 1.2 s
    so that its two main functions are stored and its trivial jits are not."""
    env = clean_env(ARTSTORE_URL=str(tmp_path / "store"), ARTSTORE_MIN_COMPILE_SECS="1",
                    JOB_SMALL_JITS="1")  # fmt: skip
    (hits, misses, stored, quick), cold = _run(dict(env, JOB_SLOW_COMPILE_SECS="1.2"))
    assert (hits, misses, stored) == (0, 2, 2) and quick > 0
    assert cold["misses"] == 2 and cold["quick_compiles"] == quick and cold["stored"] == 2
    assert cold["compiles"] == misses + quick

    (hits, misses, stored, quick_again), warm = _run(env)
    assert (hits, misses, stored, quick_again) == (2, 0, 0, quick)
    assert warm["misses"] == 0 and warm["hits"] == 2 and warm["quick_compiles"] == quick

    stats = json.loads(artstore("stats", "--json", env=env).stdout)
    assert stats["misses"] == 2 and stats["hits"] == 2  # the index agrees
