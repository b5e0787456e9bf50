"""The quick subset that `python -m pytest` runs (tests/quick_subset.py) stays quick and true."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from conftest import REPO
from quick_subset import QUICK, QUICK_MAX_TESTS, in_quick


def _collect(*args: str) -> tuple[list[str], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [line for line in proc.stdout.splitlines() if "::" in line], proc.stdout


def test_the_quick_subset_stays_within_its_size_and_names_only_tests_that_exist() -> None:
    """`python -m pytest` with no path collects at most QUICK_MAX_TESTS tests, each in QUICK,
    out of the whole suite; every QUICK entry names at least one of them (a renamed test
    would otherwise leave the subset unnoticed).
    Slow: collects the suite (imports every test module)."""
    quick, said = _collect()
    counts = re.search(r"(\d+)/(\d+) tests collected \((\d+) deselected\)", said)
    assert counts, said[-2000:]
    assert int(counts[1]) == len(quick) <= QUICK_MAX_TESTS
    assert len(quick) < int(counts[2]) / 3, "the quick subset is not much of a subset"
    assert all(in_quick(nodeid) for nodeid in quick)
    assert [e for e in QUICK if not any(in_quick(n) and n.startswith(e) for n in quick)] == []
