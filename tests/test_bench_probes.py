"""The benchmarks' probes into the store still find what they time.

bench/tpu_gpt.py times a warm start's phases by wrapping the store's methods; a redesign
that renames one leaves the benchmark failing only where it runs (on an accelerator, by
hand). This checks the names here, on every CI run.
"""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_every_probe_of_the_tpu_benchmark_exists() -> None:
    sys.path.insert(0, str(BENCH))
    try:
        import tpu_gpt
    finally:
        sys.path.remove(str(BENCH))
    targets = tpu_gpt.probe_targets()
    assert len(targets) == len(tpu_gpt.PROBES)
    missing = [
        f"{obj!r}.{attr}" for obj, attr, _ in targets if not callable(getattr(obj, attr, None))
    ]
    assert not missing, f"bench/tpu_gpt.py times methods that no longer exist: {missing}"
