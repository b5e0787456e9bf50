"""`artstore demo`: the main job on the embedded default, end to end.

Runs the bundled compile-heavy example twice, each in a fresh Python process on
JAX's default backend (the accelerator where there is one; JAX_PLATFORMS chooses),
against a fresh temporary store (local directory + SQLite): the first compiles
and stores, the second loads. Checks both computed the same result, and fails
(saying why) unless the first stored and the second loaded: a store that runs
inert must never look like a success.
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


def run_example(
    store_dir: Path, *, layers: int, extra_env: dict[str, str] | None = None
) -> tuple[dict[str, Any], float]:
    """One fresh process running the example with the store; (its JSON, wall seconds)."""
    # JAX picks its default backend (the accelerator where there is one), as the user's
    # programs do; JAX_PLATFORMS, where set, chooses as it does for them.
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARTSTORE_")}
    env["ARTSTORE_URL"] = str(store_dir)
    env.update(extra_env or {})
    # -P: the installed package, not whatever the current directory holds (a checkout
    # of another version, say).
    example = "artifactstore.examples.compile_heavy"
    cmd = [sys.executable, "-P", "-m", example, "--store", "--layers", str(layers)]
    started = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    lines = proc.stdout.strip().splitlines()
    said = [line.strip() for line in proc.stderr.splitlines() if "artifactstore:" in line]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        cause = f" after logging '{said[0]}'" if said else ""
        raise ArtstoreError(f"example program failed (exit {proc.returncode}){cause}: {tail}")
    result: dict[str, Any] = json.loads(lines[-1])
    result["_log"] = said
    return result, wall


def _require_hook() -> None:
    """Refuse at once on a JAX whose internals the store cannot hook."""
    from artifactstore.jaxhook.compat import probe

    found = probe()
    if found.hooks is None:
        raise ArtstoreError(
            f"JAX {found.jax_version} cannot be hooked ({'; '.join(found.problems)}), so the "
            "store would never be used: install a JAX this artifactstore supports "
            "(see README, 'Supported JAX') or upgrade artifactstore"
        )


def _store_hits(result: dict[str, Any]) -> int:
    """A run's loads of stored entries: its hits less the compiles under the threshold
    that this host kept (loaded from its tier, never stored)."""
    counts = result["store"]
    return int(counts.get("hits", 0)) - int(counts.get("quick_loads", 0))


def _why_no_hit(cold: dict[str, Any], warm: dict[str, Any], stored: int) -> str | None:
    """Why the warm run did not load what the cold run stored, or None if it did."""
    hits = _store_hits(warm)
    if hits and stored:
        return None
    said = [*cold["_log"], *warm["_log"]]
    detail = f" (the program logged '{said[0]}')" if said else ""
    if not stored:
        return f"the cold run stored nothing{detail}; run `artstore doctor`"
    return f"the warm run loaded nothing from the store{detail}; run `artstore doctor`"


def _backend_line(result: dict[str, Any]) -> str:
    """Which backend the example ran on, and what chose it."""
    chosen = os.environ.get("JAX_PLATFORMS")
    why = f"JAX_PLATFORMS={chosen}" if chosen else "JAX's default; JAX_PLATFORMS chooses another"
    return f"backend: {result.get('backend', 'unknown')}, {result.get('devices', '?')} ({why})"


def run(*, layers: int = 10, keep: bool = False, echo: Callable[[str], None] = print) -> None:
    from artifactstore.config import resolve
    from artifactstore.formats.sizes import format_size
    from artifactstore.store import Store

    _require_hook()
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
            stats = store.parts.index.stats()
        finally:
            store.close()
        cold_t, warm_t = float(cold["first_call_secs"]), float(warm["first_call_secs"])
        rows = [
            ("", "cold (run 1)", "warm (run 2)"),
            ("first call", f"{cold_t:.2f} s", f"{warm_t:.2f} s"),
            ("whole process", f"{cold_wall:.2f} s", f"{warm_wall:.2f} s"),
            ("store hits", str(_store_hits(cold)), str(_store_hits(warm))),
        ]
        quick = [int(r["store"].get("quick_loads", 0)) for r in (cold, warm)]
        if any(quick):  # compiles under the 0.1 s threshold: kept on this host, not stored
            rows.append(("quick loads", str(quick[0]), str(quick[1])))
        echo("")
        for a, b, c in rows:
            echo(f"{a:<16}{b:>14}{c:>14}")
        echo("")
        echo(_backend_line(cold))
        echo(f"speedup (first call): {cold_t / max(warm_t, 1e-9):.1f}x")
        echo(f"entries stored: {stats.entries}, {format_size(stats.bytes)}")
        echo(f"results identical: yes (checksum {cold['checksum']})")
        why = _why_no_hit(cold, warm, stats.entries)
        if why is not None:
            raise ArtstoreError(f"demo failed: {why}")
    finally:
        if keep:
            echo(f"kept store at {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
