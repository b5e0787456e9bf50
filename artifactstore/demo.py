"""`artstore demo`: the main job on the embedded default, end to end.

Runs the bundled compile-heavy example twice, each in a fresh Python process,
against a fresh temporary store (local directory + SQLite): the first compiles
and stores, the second loads. Checks both computed the same result.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from artifactstore.errors import ArtstoreError


def run_example(store_dir: Path, *, layers: int, extra_env: dict[str, str] | None = None
                ) -> tuple[dict[str, Any], float]:  # fmt: skip
    """One fresh process running the example with the store; (its JSON, wall seconds)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARTSTORE_")}
    env.update({"ARTSTORE_URL": str(store_dir), "JAX_PLATFORMS": env.get("JAX_PLATFORMS", "cpu")})
    env.update(extra_env or {})
    cmd = [sys.executable, "-m", "artifactstore.examples.compile_heavy", "--store",
           "--layers", str(layers)]  # fmt: skip
    started = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ArtstoreError(f"example program failed (exit {proc.returncode}): {tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1]), wall


def run(*, layers: int = 10, keep: bool = False, echo: Callable[[str], None] = print) -> None:
    from artifactstore.config import resolve
    from artifactstore.sizes import format_size
    from artifactstore.store import Store

    tmp = Path(tempfile.mkdtemp(prefix="artstore-demo-"))
    try:
        echo(f"store: {tmp} (fresh, embedded: local directory + SQLite)")
        echo("run 1: fresh process, empty store (compiles, stores) ...")
        cold, cold_wall = run_example(tmp, layers=layers)
        echo("run 2: fresh process, same store (loads) ...")
        warm, warm_wall = run_example(tmp, layers=layers)
        if cold["checksum"] != warm["checksum"]:
            raise ArtstoreError(
                f"results differ between runs ({cold['checksum']} vs {warm['checksum']})"
            )
        store = Store.open(resolve({"url": str(tmp)}))
        try:
            stats = store.index.stats()
        finally:
            store.close()
        cold_t, warm_t = float(cold["first_call_secs"]), float(warm["first_call_secs"])
        rows = [
            ("", "cold (run 1)", "warm (run 2)"),
            ("first call", f"{cold_t:.2f} s", f"{warm_t:.2f} s"),
            ("whole process", f"{cold_wall:.2f} s", f"{warm_wall:.2f} s"),
            ("store hits", str(cold["store"].get("hits", 0)), str(warm["store"].get("hits", 0))),
        ]
        echo("")
        for a, b, c in rows:
            echo(f"{a:<16}{b:>14}{c:>14}")
        echo("")
        echo(f"speedup (first call): {cold_t / max(warm_t, 1e-9):.1f}x")
        echo(f"entries stored: {stats.entries}, {format_size(stats.bytes)}")
        echo(f"results identical: yes (checksum {cold['checksum']})")
    finally:
        if keep:
            echo(f"kept store at {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
