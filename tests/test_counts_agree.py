"""One meaning of hits and misses everywhere (issue 32), read from one place (issue 39.3):
a miss is a compile the store could have served; compiles under ARTSTORE_MIN_COMPILE_SECS
are counted apart as quick. The `artstore run` summary, the program's process_stats(),
its Prometheus metrics and `artstore stats --json` agree for the same runs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import IN_CI, PROGRAMS, artstore, clean_env

try:  # the test extra installs it: CI must run these tests, never skip them
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    if IN_CI:
        raise
    pytest.skip("prometheus-client missing: pip install -e '.[test]'", allow_module_level=True)

SUMMARY = re.compile(
    r"^artstore run: hits (\d+), misses (\d+) \((\d+) stored\), .*?"
    r"(?:; (\d+) quick compiles not stored \(ARTSTORE_MIN_COMPILE_SECS\)"
    r"(?:, \d+ kept on this host)?)?"
    r"(?:; \d+ of the hits quick compiles kept on this host)?"
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


def _metrics(env: dict[str, str], directory: Path) -> tuple[int, ...]:
    """What the run's process wrote to its metrics directory, added up by `artstore
    metrics`: (hits of both tiers, misses, stored, quick compiles)."""
    proc = artstore("metrics", "--multiprocess-dir", str(directory), env=env)
    assert proc.returncode == 0, proc.stderr
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(proc.stdout):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    names = ("hits", "misses", "stored", "quick_compiles")
    return tuple(int(totals.get(f"artstore_{name}_total", 0)) for name in names)


def test_a_warm_run_has_no_misses_and_counts_quick_compiles_apart(tmp_path: Path) -> None:
    """Slow: two JAX programs under `artstore run`, the first with compiles slowed by 1.2 s
    so that its two main functions are stored and its trivial jits are not."""
    env = clean_env(ARTSTORE_URL=str(tmp_path / "store"), ARTSTORE_MIN_COMPILE_SECS="1",
                    JOB_SMALL_JITS="1")  # fmt: skip
    cold_dir, warm_dir = tmp_path / "prom-cold", tmp_path / "prom-warm"
    cold_dir.mkdir(), warm_dir.mkdir()
    cold_env = dict(env, JOB_SLOW_COMPILE_SECS="1.2", PROMETHEUS_MULTIPROC_DIR=str(cold_dir))
    summary, cold = _run(cold_env)
    hits, misses, stored, quick = summary
    assert (hits, misses, stored) == (0, 2, 2) and quick > 0
    assert cold["misses"] == 2 and cold["quick_compiles"] == quick and cold["stored"] == 2
    assert cold["quick_kept"] == quick  # kept in this host's tier, never in the store
    assert cold["compiles"] == misses + quick
    assert _metrics(env, cold_dir) == summary  # the metrics count what the summary says

    # The warm process compiles nothing: its quick ones are loaded from this host's tier,
    # hits like the others (the store's two), and said apart.
    summary, warm = _run(dict(env, PROMETHEUS_MULTIPROC_DIR=str(warm_dir)))
    assert summary == (2 + quick, 0, 0, 0)
    assert warm["misses"] == 0 and warm["hits"] == 2 + quick and warm["quick_loads"] == quick
    assert not warm.get("quick_compiles")
    assert _metrics(env, warm_dir) == summary
    # The deprecated 0.3 name (formats.counters.DEPRECATED) is the same number, for now.
    assert cold["below_threshold"] == cold["quick_compiles"]

    stats = json.loads(artstore("stats", "--json", env=env).stdout)
    assert stats["misses"] == 2 and stats["hits"] == 2  # the index agrees
    # The cold run's quick compiles; the warm process, answered by this host's tier,
    # opened no store, so its own stay in its process_stats() (Session.compiled_below_threshold).
    assert stats["quick_compiles"] == quick
