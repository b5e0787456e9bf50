"""Faults during `artstore gc`, and the CLI against frozen backends.

Each cell runs `artstore gc --grace 0s` (no eviction policy: reconcile only, so a healthy
store loses nothing) on a warm store with the fault in place. T = ARTSTORE_TIMEOUT = 2 s;
psycopg's connect timeout has a floor of 2 s (PG_CONNECT = max(2, T)).

| fault | gc: outcome | stderr | extra time |
|---|---|---|---|
| S3 stopped / frozen / 500 / 503 | exit 1, nothing removed | 1 line | <= T |
| object corrupted / truncated | exit 0 (gc reads no bytes); `verify` names that object | - | 0 |
| object deleted | exit 0; the dangling entry dropped | - | 0 |
| database stopped | exit 1, nothing removed | 1 line | 0 |
| database frozen | exit 1, nothing removed | 1 line | <= PG_CONNECT |
| connections killed every 20 ms | exit 0, or 1 with one line; nothing lost | <= 1 line | 0 |
| `entries` locked | exit 1 (lock_timeout = T), nothing removed | 1 line | <= T |
| writer SIGKILLed before its commit | exit 0; the orphan carries its entry: restored | - | 0 |
| local tier's file system full | exit 0, nothing removed | - | 0 |
| CLI (`ls`, `verify`, `gc --dry-run`), S3 frozen | verify: exit 1; others work | 1 line | <= T |
| CLI, database frozen | exit 1 | 1 line | <= PG_CONNECT |

After every cell (fault cleared): entries listed before are still listed (less the one
whose object was deleted), and `artstore verify` finds the store consistent or exactly
the injected fault.

CLI against a frozen object store or database (`ls`, `verify`, `gc --dry-run`): each ends
within T (S3; PG_CONNECT for the database) plus start-up, with one error line and no
traceback, or succeeds when it needs only the index (`ls`, `gc --dry-run` with S3 frozen).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from faults.harness import (
    DB_FAULTS,
    FAULTS,
    OBJECT_FAULTS,
    PG_CONNECT,
    S3_FAULTS,
    SLACK,
    Stack,
    T,
    killed_writer,
    store_lines,
)

# fault -> (exit codes allowed, derived bound on the seconds gc takes beyond start-up)
GC: dict[str, tuple[set[int], float]] = {
    **{fault: ({1}, T) for fault in S3_FAULTS},
    **{fault: ({0}, 0.0) for fault in OBJECT_FAULTS},
    "db-down": ({1}, 0.0),
    "db-frozen": ({1}, PG_CONNECT),
    "db-killed": ({0, 1}, 0.0),
    "db-locked": ({1}, T),
    "writer-killed": ({0}, 0.0),
    "tier-full": ({0}, 0.0),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_gc_path(
    fault: str, stack: Stack, warm: str, full_tier: tuple[Path, str], gc_baseline: float
) -> None:
    codes, bound = GC[fault]
    namespace, extra_env, committed = warm, {}, set()
    if fault == "object-deleted":
        namespace = stack.warm()  # its entry goes for good
    elif fault == "writer-killed":
        namespace = stack.warm()  # a warm namespace of its own, with one orphan
        committed = set(stack.objects(namespace))
        killed_writer(stack, namespace, during="commit")
    elif fault == "tier-full":
        extra_env["ARTSTORE_LOCAL_TIER"] = str(full_tier[0])
    before = stack.ls(namespace)
    orphans = sorted(set(stack.objects(namespace)) - committed) if fault == "writer-killed" else []
    damaged = None
    if fault in OBJECT_FAULTS:
        damaged = stack.damage(namespace, fault)
    elif fault == "db-killed":
        stack.keep_terminating()
    elif fault in S3_FAULTS or fault in DB_FAULTS:
        stack.inject(fault)
    try:
        gc = stack.cli(namespace, "gc", "--grace", "0s", **extra_env)
    finally:
        stack.clear()
    print(f"{fault}: rc {gc.returncode} in {gc.secs:.2f} s (healthy {gc_baseline:.2f} s); "
          f"{gc.stderr.strip()[-300:]}")  # fmt: skip

    assert gc.returncode in codes, gc.stderr
    assert "Traceback" not in gc.stderr
    lines = store_lines(gc.stderr)
    if gc.returncode:  # one line (progress shows only on a terminal)
        assert len(gc.stderr.strip().splitlines()) == 1, gc.stderr
        assert lines and lines[0].startswith("artstore: error: ")
    else:
        assert not lines, gc.stderr
    assert gc.secs - gc_baseline <= bound + SLACK, (gc.secs, bound)

    after = stack.ls(namespace)
    report = stack.verify(namespace, grace="0s")
    found = {k: report[k] for k in ("corrupt", "entries_without_object", "objects_without_entry")}
    wanted: dict[str, list[str]] = {k: [] for k in found}
    if damaged is not None and fault == "object-deleted":
        assert set(after) == set(before) - {damaged.key}
    elif fault == "writer-killed":
        assert len(orphans) == 1, orphans  # restored from its envelope: a new entry
        assert set(after) > set(before) and {e["digest"] for e in after.values()} >= set(orphans)
        assert len(after) == len(before) + 1
    else:
        assert set(after) == set(before)
    if damaged is not None and fault != "object-deleted":
        wanted["corrupt"] = [damaged.digest]
        stack.restore(namespace, damaged)
    assert found == wanted


def test_cli_against_frozen_backends_is_bounded(stack: Stack, warm: str) -> None:
    """`ls`, `verify`, `gc --dry-run` against a frozen S3, then a frozen database: each ends
    within a bound derived from ARTSTORE_TIMEOUT, with one line and no traceback."""
    timeout = 3.0  # not T: a bound of its own shows that the wait follows the setting
    outcomes = {}
    commands = (["ls", "--json"], ["verify"], ["gc", "--dry-run", "--no-progress"])
    for which, backend_bound in (("s3", timeout), ("pg", max(2.0, timeout))):
        stack.proxy(which).set_mode("freeze")
        try:
            with ThreadPoolExecutor(len(commands)) as pool:  # at once: 3x faster
                runs = list(pool.map(
                    lambda c: stack.cli(warm, *c, ARTSTORE_TIMEOUT=f"{timeout:g}"), commands
                ))  # fmt: skip
        finally:
            stack.clear()
        for command, run in zip(commands, runs, strict=True):
            outcomes[(which, command[0])] = (run.returncode, round(run.secs, 2))
            assert "Traceback" not in run.stderr, run.stderr
            assert run.secs <= backend_bound + SLACK, (which, command, run.secs)
            if which == "pg" or command[0] == "verify":  # needs what is frozen
                assert run.returncode == 1, (which, command, run.stdout)
                assert len(run.stderr.strip().splitlines()) == 1, run.stderr
                assert run.stderr.startswith("artstore: error: ")
            else:  # index only: the object store is not needed
                assert run.returncode == 0, run.stderr
                assert run.stderr == ""
                if command[0] == "ls":
                    assert len(json.loads(run.stdout)) == len(stack.ls(warm))
                else:
                    assert "not cross-checked" in run.stdout, run.stdout
    print(outcomes)
    for value in ("inf", "1e12", "nan"):  # absurd bounds: one line, before anything is opened
        run = stack.cli(warm, "ls", ARTSTORE_TIMEOUT=value)
        assert run.returncode != 0 and len(run.stderr.strip().splitlines()) == 1, run.stderr
        assert "ARTSTORE_TIMEOUT" in run.stderr and "Traceback" not in run.stderr
