"""What the store did for a run of several processes: `artstore run`, the pytest plugin.

Each activated process leaves one record (its `process_stats()`) in the directory
that ARTSTORE_RUN names, at exit; the parent adds them up into one line. A file per
process, written atomically, because processes end in any order (multiprocessing
workers, xdist workers) and some never run atexit: those are simply not counted.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from artifactstore.blobstores.local import write_atomic

# The record directory, set by `artstore run` and the pytest plugin; each process that
# activates from the environment writes its record there (artifactstore.jaxhook.environment).
ENV_VAR = "ARTSTORE_RUN"


def write_record(directory: Path, stats: dict[str, int]) -> None:
    """This process's counters, for the parent's summary."""
    data = json.dumps({"pid": os.getpid(), "stats": stats}).encode()
    write_atomic(directory / f"{os.getpid()}.json", data, durable=False)


@dataclass
class Summary:
    """Counters added up over processes; `render` is the line users see."""

    processes: int = 0  # processes that imported JAX with the store active
    hits: int = 0  # executables loaded (from the store or this host's tier)
    compiles: int = 0  # misses: compiles the store could have served
    quick: int = 0  # compiles under ARTSTORE_MIN_COMPILE_SECS: never stored, not misses
    quick_kept: int = 0  # of those, kept in this host's tier
    quick_loads: int = 0  # hits of compiles this host kept below the threshold
    stored: int = 0
    compile_secs: float = 0.0
    compile_secs_saved: float = 0.0
    degraded: int = 0  # processes whose store failed (they compiled as usual)
    mismatched: int = 0  # writers that stored nothing: object store and index not one store
    exit_code: int = 0  # the command's (`artstore run`): why no process may have reported

    def add(self, stats: dict[str, int]) -> None:
        if not stats:
            return
        self.processes += 1
        self.hits += int(stats.get("loads", 0))
        self.compiles += int(stats.get("misses", 0))  # as process_stats() counts them
        self.quick += int(stats.get("quick_compiles", 0))
        self.quick_kept += int(stats.get("quick_kept", 0))
        self.quick_loads += int(stats.get("quick_loads", 0))
        self.stored += int(stats.get("stored", 0))
        self.compile_secs += int(stats.get("compile_ms", 0)) / 1000
        self.compile_secs_saved += int(stats.get("compile_ms_saved", 0)) / 1000
        if not stats.get("active", 1) or stats.get("breaker_opened"):
            self.degraded += 1
        if stats.get("store_mismatch"):
            self.mismatched += 1

    @classmethod
    def of(cls, records: Iterable[dict[str, int]]) -> Summary:
        summary = cls()
        for stats in records:
            summary.add(stats)
        return summary

    def render(self, prefix: str = "artstore") -> str:
        if not self.processes and self.exit_code:  # it failed: its own error says why
            return (
                f"{prefix}: no process used the store: the command exited {self.exit_code} "
                "before any Python process of it imported JAX (its error is above)"
            )
        if not self.processes:
            return (
                f"{prefix}: no process used the store (none imported JAX with artifactstore "
                "importable: another interpreter or virtualenv? python -E or -I?)"
            )
        procs = f"{self.processes} process" + ("es" if self.processes != 1 else "")
        line = (
            f"{prefix}: hits {self.hits}, misses {self.compiles} ({self.stored} stored), "
            f"~{self.compile_secs_saved:.1f} s of compiling saved, {procs}"
        )
        if self.quick:
            line += f"; {self.quick} quick compiles not stored (ARTSTORE_MIN_COMPILE_SECS)"
            if self.quick_kept:
                line += f", {self.quick_kept} kept on this host"
        if self.quick_loads:
            line += f"; {self.quick_loads} of the hits quick compiles kept on this host"
        if self.compile_secs:
            line += f"; compiling took {self.compile_secs:.1f} s"
        if self.degraded:
            line += f"; the store failed in {self.degraded} (they compiled as usual)"
        if self.mismatched:
            line += (
                f"; {self.mismatched} stored nothing: object store and index do not belong "
                "together (`artstore doctor` says why)"
            )
        return line


def read_records(directory: Path) -> list[dict[str, int]]:
    """Every complete record in `directory` (a half-written one cannot exist: atomic)."""
    out = []
    for path in sorted(directory.glob("*.json")):
        try:
            stats = json.loads(path.read_text()).get("stats", {})
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(stats, dict):
            out.append(stats)
    return out
