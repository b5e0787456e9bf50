"""Faults on the read path: a warm store, a fresh read-only reader (its own, empty tier).

The reader opens the store, then pauses (JOB_PAUSE=open); the fault starts; the reader
loads or compiles job.py's 12 jits and exits. T = ARTSTORE_TIMEOUT = 2 s. Extra time is
measured against the same run without the fault (plus SLACK, start-up noise); the counts
(hits, compiles, breaker_opened) prove that only one call paid for the fault.

| fault | read path: outcome | log lines | extra time |
|---|---|---|---|
| S3 stopped (connection refused) | 12 compiles; object store breaker opens once | 1 | <= T |
| S3 frozen (never answers) | 12 compiles; object store breaker opens once | 1 | <= T |
| S3 answers 500 / 503 | 12 compiles; object store breaker opens once | 1 | <= T |
| object corrupted / truncated | 11 hits, 1 compile; `corrupt` 1; not quarantined | 1 | 0 |
| object deleted | 11 hits, 1 compile; `missing_object` 1 | 1 | 0 |
| database stopped | 12 hits: lookups follow the manifests, not the index | 0 | 0 |
| database frozen | 12 hits; its hits go to a hit journal in the bucket | 0 | 0 |
| connections killed (pg_terminate_backend) | 12 hits; the reader holds none to kill | 0 | 0 |
| `entries` locked (ACCESS EXCLUSIVE) | 12 hits: lookups follow the manifests | 0 | 0 |
| another writer SIGKILLed before its commit | 12 hits: its orphan disturbs no one | 0 | 0 |
| local tier's file system full | 12 hits from S3; the tier not updated | 1 | 0 |
| S3 and database frozen, warm tier | 12 tier hits; nothing else asked | 0 | 0 |
| ... and one key missing from the tier | 11 tier hits, 1 compile; object store breaker | 1 | <= T |

After every cell (fault cleared): the results equal a run without the store, every entry
`artstore ls` listed before is still listed, and `artstore verify` finds the store
consistent, or exactly the injected fault (the damaged object; the killed writer's orphan).
The breaker closing again in a running program: tests/test_units.py
(test_store_breaker_recovers_in_a_running_program).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from faults.harness import (
    DB_FAULTS,
    FAULTS,
    N_JITS,
    OBJECT_FAULTS,
    S3_FAULTS,
    SLACK,
    Expect,
    Job,
    Stack,
    T,
    check_job,
    killed_writer,
    reference_results,
)

BREAKER_S3 = Expect(0, N_JITS, ("object store unavailable",), {"breaker_opened_object_store": 1}, T)
BREAKER_DB = Expect(0, N_JITS, ("index unavailable",), {"breaker_opened_index": 1}, T)
READ: dict[str, Expect] = {
    **{fault: BREAKER_S3 for fault in S3_FAULTS},
    "object-corrupt": Expect(N_JITS - 1, 1, ("not quarantined",), {"corrupt": 1}),
    "object-truncated": Expect(N_JITS - 1, 1, ("not quarantined",), {"corrupt": 1}),
    "object-deleted": Expect(N_JITS - 1, 1, ("which is gone",), {"missing_object": 1}),
    # Lookups follow the manifests in the object store: a reader needs no index to load.
    "db-down": Expect(N_JITS, 0),
    # ... nor for its hit counts (a hit journal in the bucket): nothing waits on it.
    "db-frozen": Expect(N_JITS, 0),
    "db-killed": Expect(N_JITS, 0),
    "db-locked": Expect(N_JITS, 0),
    "writer-killed": Expect(N_JITS, 0),
    "tier-full": Expect(N_JITS, 0, ("local tier not updated",)),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_read_path(
    fault: str,
    stack: Stack,
    warm: str,
    warm_keys: set[str],
    references: dict[str, list[str]],
    baselines: dict[str, float],
    full_tier: tuple[Path, str],
) -> None:
    expect = READ[fault]
    namespace, extra_env, grace, committed = warm, {}, "1h", set()
    if fault == "writer-killed":
        namespace = stack.warm()  # a warm namespace of its own, with one orphan
        committed = set(stack.objects(namespace))
        killed_writer(stack, namespace, during="commit")
        grace = "0s"  # the orphan is seconds old: count it
    elif fault == "tier-full":
        extra_env["ARTSTORE_LOCAL_TIER"] = str(full_tier[0])
    before = warm_keys if namespace == warm else set(stack.ls(namespace))
    orphans = sorted(set(stack.objects(namespace)) - committed) if fault == "writer-killed" else []

    job = Job(stack.env(namespace, JOB_PAUSE="open", ARTSTORE_READ_ONLY="1", **extra_env))
    assert job.start().paused("open")["store"] is True
    damaged = None
    if fault in OBJECT_FAULTS:
        damaged = stack.damage(namespace, fault)  # put back after the checks
    elif fault in S3_FAULTS or fault in DB_FAULTS:
        stack.inject(fault)
        assert fault != "db-killed" or stack.killed == 0  # a reader holds no connection
    try:
        job.go()
        job.wait()
        stack.clear()
        check_job(fault, job, expect, references["0"], baselines["read"])
        # No entry lost; the store is consistent, or shows exactly the injected fault.
        assert before <= set(stack.ls(namespace))
        report = stack.verify(namespace, grace=grace)
    finally:
        stack.clear()
        if damaged is not None:
            stack.restore(namespace, damaged)
    found = {k: report[k] for k in ("corrupt", "entries_without_object", "objects_without_entry")}
    wanted: dict[str, list[str]] = {k: [] for k in found}
    if damaged is not None and fault == "object-deleted":
        wanted["entries_without_object"] = [damaged.key]
    elif damaged is not None:
        wanted["corrupt"] = [damaged.digest]
    elif fault == "writer-killed":
        assert len(orphans) == 1, orphans
        wanted["objects_without_entry"] = orphans
    assert found == wanted


def test_warm_tier_serves_with_s3_and_database_down(
    stack: Stack, references: dict[str, list[str]]
) -> None:
    """A warm host loads from its tier with S3 and the database both stopped, or both
    frozen: nothing is asked of either (no line, no wait); a key the tier lacks costs one
    bounded attempt (frozen: T), then the breaker."""
    namespace = "tier-" + uuid.uuid4().hex[:8]
    env = stack.env(namespace)  # one tier for every run below
    first = Job(env).run()
    assert first.out["store"]["stored"] == N_JITS
    served = Expect(N_JITS, 0, (), {"tier_hits": N_JITS})
    for mode in ("down", "freeze"):
        stack.s3_proxy.set_mode(mode)
        stack.pg_proxy.set_mode(mode)
        try:
            warm = Job(env).run()
            if mode == "freeze":  # jit_mlp changes: not in the tier
                miss = Job(dict(env, JOB_VARIANT="1")).run()
        finally:
            stack.clear()
        check_job(f"warm tier, both {mode}", warm, served, references["0"], warm.secs)
        assert warm.secs - first.secs <= SLACK
    assert miss.out["xla_compiles"] == ['"jit_mlp"']
    once = {"tier_hits": N_JITS - 1, "breaker_opened_object_store": 1, "kept_in_tier": 1}
    expect = Expect(N_JITS - 1, 1, ("object store unavailable",), once)
    check_job("warm tier, one miss", miss, expect, reference_results(references, "1"), 0.0)
    assert miss.secs - warm.secs <= T + SLACK
    assert len(stack.ls(namespace)) == N_JITS  # nothing lost, nothing half-written
