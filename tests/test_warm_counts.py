"""CI pre-warm compiles are counted apart (issue 38.6): `warm_compiles`, not misses, so a
store freshly warmed by `artstore warm` shows the hit rate of the programs that read it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from conftest import PROGRAMS, artstore, clean_env, run_program


def _stats(env: dict[str, str]) -> dict[str, Any]:
    proc = artstore("stats", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def test_a_warmed_store_counts_warm_compiles_apart(tmp_path: Path) -> None:
    """Slow: `artstore warm` of a JAX program, then the program itself."""
    env = clean_env(ARTSTORE_URL=str(tmp_path / "store"))
    warm = subprocess.run(
        [sys.executable, "-m", "artifactstore", "warm", "--", sys.executable,
         str(PROGRAMS / "job.py")],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert warm.returncode == 0, warm.stderr
    warmed = _stats(env)
    assert warmed["entries"] > 0 and warmed["warm_compiles"] == warmed["entries"], (
        warmed,
        warm.stderr[-3000:],
    )
    assert warmed["misses"] == 0 and warmed["lookups_missed"] == 0
    run = run_program("job.py", env)
    assert run["xla_compiles"] == [] and run["store"]["hits"] == warmed["entries"]
    after = _stats(env)
    assert after["hits"] == warmed["entries"] and after["misses"] == 0
    assert after["hit_rate"] == 1.0  # was 50%: the warm compiles counted as misses
    assert "warm compiles" in artstore("stats", env=env).stdout
