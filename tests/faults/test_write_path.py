"""Faults on the write path: a writer on an empty store (a namespace of its own).

The writer opens the store, then pauses (JOB_PAUSE=open); the fault starts; the writer
compiles job.py's 12 jits, queues their uploads, flushes them (`artifactstore.flush()`,
bounded by F) and exits. T = ARTSTORE_TIMEOUT = 2 s, F = ARTSTORE_FLUSH_TIMEOUT = 6 s.
Object faults need something to damage: there the writer meets a damaged object of a warm
store, and repairs it (quarantines it or drops its entry, compiles, stores it again).

| fault | write path: outcome | log lines | extra time |
|---|---|---|---|
| S3 down / frozen / 500 / 503 | 12 compiles; breaker opens at a lookup; 12 in tier | 1 | <= T |
| object corrupted / truncated | 11 hits; quarantined, compiled, stored again | 1 | 0 |
| object deleted | 11 hits; dangling entry dropped, compiled, stored again | 1 | 0 |
| database down or frozen | 12 compiles; 1st lease fails (T), no upload; 12 in tier | 1 | <= T |
| connections killed | 12 stored (the writer connects at its first store) | 0 | 0 |
| `entries` locked | 1st upload's lock wait fails (T), rest skipped; 12 in tier | 1 | <= T |
| writer SIGKILLed mid-upload | nothing committed, no object; next writer stores 12 | - | - |
| local tier's file system full | 12 stored; the tier not updated | 1 | 0 |
| exit flush, S3 uploads frozen, T > F | the exit flush waits F once, then exits | 1 | F |
| exit flush, database frozen, only hits | nothing waits: hits go to a hit journal | 0 | 0 |

After a write fails because a backend is unavailable (the lookups answered, the compile
lease or the upload did not), that backend's breaker opens for writes (process.breaker): the
writer drops the uploads queued behind it for the cool-down, counted as `put_skipped`, and
takes no compile lease, instead of paying T for each (and then F at exit): tests/test_units.py.

After every cell (fault cleared): the results equal a run without the store, every entry
the writer reported stored is listed by `artstore ls`, nothing listed before was lost, and
`artstore verify` finds the store consistent.
"""

from __future__ import annotations

import json
import time
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
    store_lines,
)

# A writer's lookups read manifests in the object store: a failing store is noticed there,
# before any upload, as a failing index is.
STORE_DOWN = Expect(
    0,
    N_JITS,
    ("object store unavailable",),
    {"breaker_opened_object_store": 1, "kept_in_tier": N_JITS},
    T,
)
# Lookups need no index; the first compile lease meets the failing index (after T), which
# opens the index's breaker for writes: every upload is skipped for the cool-down, and this
# host's tier keeps them all.
INDEX_DOWN = Expect(
    0,
    N_JITS,
    ("index unavailable",),
    {"put_skipped": N_JITS, "kept_in_tier": N_JITS, "breaker_opened_index": 1},
    T,
)
# `entries` locked, `leases` not: the lease is taken, the first upload waits out the lock
# (T) and opens the breaker; the uploads queued behind it are skipped.
ENTRIES_LOCKED = Expect(
    0,
    N_JITS,
    ("index unavailable",),
    {"put_errors": 1, "put_skipped": N_JITS - 1, "kept_in_tier": N_JITS},
    T,
)
REPAIRED = {"hits": N_JITS - 1, "stored": 1}
WRITE: dict[str, Expect] = {
    **{fault: STORE_DOWN for fault in S3_FAULTS},
    "object-corrupt": Expect(N_JITS - 1, 1, ("quarantined",), {"corrupt": 1, **REPAIRED}),
    "object-truncated": Expect(N_JITS - 1, 1, ("quarantined",), {"corrupt": 1, **REPAIRED}),
    "object-deleted": Expect(N_JITS - 1, 1, ("which is gone",), {"missing_object": 1, **REPAIRED}),
    "db-down": INDEX_DOWN,
    "db-frozen": INDEX_DOWN,
    "db-killed": Expect(0, N_JITS, (), {"stored": N_JITS}),
    "db-locked": ENTRIES_LOCKED,
    "tier-full": Expect(0, N_JITS, ("local tier not updated",), {"stored": N_JITS}),
}


@pytest.mark.parametrize("fault", [f for f in FAULTS if f != "writer-killed"])
def test_write_path(
    fault: str,
    stack: Stack,
    warm: str,
    warm_keys: set[str],
    references: dict[str, list[str]],
    baselines: dict[str, float],
    full_tier: tuple[Path, str],
) -> None:
    expect = WRITE[fault]
    namespace = "write-" + uuid.uuid4().hex[:8]
    extra_env: dict[str, str] = {}
    if fault in OBJECT_FAULTS:
        namespace = warm  # left consistent by the writer's repair
    elif fault == "tier-full":
        extra_env["ARTSTORE_LOCAL_TIER"] = str(full_tier[0])

    job = Job(stack.env(namespace, JOB_PAUSE="open", **extra_env))
    assert job.start().paused("open")["store"] is True
    if fault in OBJECT_FAULTS:
        stack.damage(namespace, fault)
    elif fault in S3_FAULTS or fault in DB_FAULTS:
        stack.inject(fault)
    try:
        job.go()
        job.wait()
    finally:
        stack.clear()
    check_job(fault, job, expect, references["0"], baselines["write"])

    # Every entry reported stored is listed; nothing else was lost; the store is consistent.
    after = set(stack.ls(namespace))
    if fault in OBJECT_FAULTS:
        assert after == warm_keys
    else:
        assert len(after) == job.out["store"].get("stored", 0)
    report = stack.verify(namespace)
    assert report["ok"], report


def test_a_failed_upload_pauses_the_queue_behind_it(
    stack: Stack, references: dict[str, list[str]], baselines: dict[str, float]
) -> None:
    """S3 answers lookups but its uploads hang: the first upload fails after T and the
    uploads queued behind it are skipped for the breaker cool-down (`put_skipped`),
    instead of paying T each and then F at exit. Nothing is stored; the store is
    consistent."""
    namespace = "write-" + uuid.uuid4().hex[:8]
    job = Job(stack.env(namespace, JOB_PAUSE="open"))
    assert job.start().paused("open")["store"] is True
    stack.s3_proxy.set_mode("freeze-writes")
    try:
        job.go()
        job.wait()
    finally:
        stack.clear()
    skipped = {"put_errors": 1, "put_skipped": N_JITS - 1}
    check_job("s3-uploads-frozen", job, Expect(0, N_JITS, ("could not store",), skipped, T),
              references["0"], baselines["write"])  # fmt: skip
    assert stack.ls(namespace) == {}
    assert stack.verify(namespace)["ok"]


def test_writer_killed_mid_upload_commits_nothing(
    stack: Stack, references: dict[str, list[str]]
) -> None:
    """The write cell of "writer SIGKILLed": S3's uploads frozen, so its first upload hangs.
    Nothing was committed and no object landed; the next writer stores everything."""
    namespace = "killed-" + uuid.uuid4().hex[:8]
    killed = killed_writer(stack, namespace, during="upload")
    assert "Traceback" not in killed.stderr
    assert stack.ls(namespace) == {} and stack.objects(namespace) == []
    assert stack.verify(namespace, grace="0s")["ok"]
    again = Job(stack.env(namespace)).run()
    check_job("after the kill", again, Expect(0, N_JITS, (), {"stored": N_JITS}),
              references["0"], again.secs)  # fmt: skip
    assert len(stack.ls(namespace)) == N_JITS
    assert stack.verify(namespace, grace="0s")["ok"]


def test_exit_with_frozen_s3_ends_within_the_flush_timeout_once(stack: Stack) -> None:
    """Uploads left at exit against a frozen S3 (one upload outlasts the flush bound:
    ARTSTORE_TIMEOUT 30 s > ARTSTORE_FLUSH_TIMEOUT): the exit flush waits F, once, says
    so in one line, and the process ends.

    The wait is measured inside the program (from its result line to the end of the last
    exit handler, which runs after the store's), so the bound is tight and no scheduling
    noise of a loaded machine reaches it; the interpreter's own teardown after it (JAX's
    native destructors) is bounded apart, by SLACK."""
    flush = 5.0
    env = stack.env("exit-" + uuid.uuid4().hex[:8], JOB_PAUSE="open", JOB_SKIP_FLUSH="1",
                    JOB_EXIT_TIMES="1", ARTSTORE_TIMEOUT="30",
                    ARTSTORE_FLUSH_TIMEOUT=f"{flush:g}")  # fmt: skip
    job = Job(env).start()
    job.paused("open")
    stack.s3_proxy.set_mode("freeze-writes")  # lookups answer; uploads hang
    try:
        job.go()
        said = job.line()  # printed just before the interpreter exits
        printed = time.monotonic()
        job.wait()
        exit_secs = time.monotonic() - printed
    finally:
        stack.clear()
    assert job.proc is not None and job.proc.returncode == 0, job.stderr
    lines = store_lines(job.stderr)
    assert len(lines) == 1 and f"not finished within {flush:g} s" in lines[0], job.stderr
    (done,) = [json.loads(x)["atexit_done"] for x in job.stdout_lines if "atexit_done" in x]
    waited = done - said["printed_at"]
    print(f"exit handlers took {waited:.2f} s, the whole exit {exit_secs:.2f} s")
    # It waited (the uploads were not abandoned at once), and only once: twice is 2F.
    assert flush - 0.5 <= waited <= flush + 1.0 < 2 * flush, waited
    assert exit_secs <= waited + SLACK, (exit_secs, waited)


def test_exit_with_frozen_database_does_not_wait_for_it(stack: Stack, warm: str) -> None:
    """A writer that only loaded never opened the index: its hits (for LRU) go to a hit
    journal in the bucket at exit, so a database frozen after the run costs it nothing
    (no wait, no line)."""
    flush = 5.0
    env = stack.env(warm, JOB_PAUSE="exit", JOB_SKIP_FLUSH="1",
                    ARTSTORE_FLUSH_TIMEOUT=f"{flush:g}")  # fmt: skip
    job = Job(env).start()
    assert job.line()["store"]["hits"] == N_JITS  # the result line: its hits are pending
    job.paused("exit")
    connections = stack.pg_proxy.connections
    stack.pg_proxy.set_mode("freeze")
    try:
        job.go()
        job.wait(timeout=60)
    finally:
        stack.clear()
    assert job.proc is not None and job.proc.returncode == 0, job.stderr
    assert job.secs <= T + 4.0, job.secs
    assert store_lines(job.stderr) == []
    assert stack.pg_proxy.connections == connections  # never reached the database
