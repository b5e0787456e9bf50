"""torch_xla.debug.metrics as the adapter reads it: counters, and the CompileTime metric
as (total samples, accumulated ns, [(time in s, ns)])."""

from __future__ import annotations

COUNTERS: dict[str, int] = {}
COMPILE_TIMES: list[tuple[float, int]] = []


def counter_value(name: str) -> int | None:
    return COUNTERS.get(name)  # torch-xla: None for a counter never counted


def counter_names() -> list[str]:
    return sorted(COUNTERS)


def metric_data(name: str) -> tuple[int, int, list[tuple[float, int]]] | None:
    if name != "CompileTime" or not COMPILE_TIMES:
        return None
    return len(COMPILE_TIMES), sum(ns for _, ns in COMPILE_TIMES), list(COMPILE_TIMES)
