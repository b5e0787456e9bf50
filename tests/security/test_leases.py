"""Issue 38, point 8: what a compile lease record can cost a reader, and gc's stale leases.

A team store (moto S3 over HTTP + PostgreSQL). Measured before: a writer killed while it
compiled left its record, and every later read-only reader that missed that key waited
~61 s without a line; a forged record held readers 60-300 s; nothing removed either.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import OpenStore, artstore, run_program
from sqlalchemy import insert
from test_single_flight import env_for, start, wait_for_lease

from artifactstore import gc
from artifactstore.blobstores.base import LEASES
from artifactstore.formats.lease import LeaseRecord
from artifactstore.index.leases import compile_lease_name, holder_name
from artifactstore.index.models import LeaseRow, utcnow
from artifactstore.store import Store
from security.flights import key, turn

TESTS = Path(__file__).resolve().parents[1]
# A writer that takes `key(N)`'s compile lease, says so once its record is in the bucket,
# then "compiles" until killed.
HOLDER = """
import os, sys, time
sys.path.insert(0, {tests!r})
from artifactstore import config
from artifactstore.store import Store
from security.flights import key, turn
store = Store.open(config.resolve({{}}, environ=os.environ), lazy_index=True)
hit, held = turn(store, key({n}))
assert hit is None and held is not None
store.flight.drain(10)
print("held", flush=True)
time.sleep(600)
"""


def forge(store: Store, k: str, **fields: Any) -> None:
    """A lease record written with bucket write alone (as an attacker would)."""
    body = {"v": 1, "holder": "evil-host:4242", "beat": 0, "ttl": 1e9, "state": "compiling"}
    body.update({"hint": 1e9, "at": time.time() + 1e8, **fields})
    store.parts.blobs.put_record(LEASES, k, json.dumps(body).encode())


def reader(open_store: OpenStore, env: dict[str, str], **extra: str) -> Store:
    return open_store(
        {**env, "ARTSTORE_READ_ONLY": "1", "ARTSTORE_LOCAL_TIER": "off", **extra},
        lazy_index=True,
    )


def turned(store: Store, k: str, timeout: float = 30) -> tuple[Any, Any]:
    """`turn` in a thread: a wait past `timeout` fails the test (before the fix: minutes)."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(turn(store, k)), daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"the reader still waits after {timeout} s"
    return out[0]


def counts(store: Store) -> dict[str, int]:
    return dict(store.parts.counters.snapshot())


def test_a_killed_holders_record_costs_a_reader_no_wait_and_gc_removes_it(
    team_env: dict[str, str], open_store: OpenStore, caplog: pytest.LogCaptureFixture
) -> None:
    k = key(3801)
    script = HOLDER.format(tests=str(TESTS), n=3801)
    pipes: dict[str, Any] = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    holder = subprocess.Popen([sys.executable, "-c", script], env=team_env, text=True, **pipes)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held", holder.stderr
    finally:
        os.kill(holder.pid, signal.SIGKILL)  # as the torture run's kill -9
        holder.wait()
    writer = open_store(team_env)
    data = writer.parts.blobs.get_record(LEASES, k)
    assert data is not None and LeaseRecord.decode(data).state == "compiling"  # left behind

    store = reader(open_store, team_env, ARTSTORE_LEASE_READER_WAIT="60")
    caplog.set_level(logging.INFO, logger="artifactstore")
    assert turned(store, k) == (None, None)  # compiles at once
    seen = counts(store)
    assert seen.get("lease_stale") == 1  # the defence ran: the dead holder was seen
    assert seen.get("lease_waits", 0) == 0
    assert "waiting up to" not in caplog.text

    # gc removes both the index row and the record, and says how many.
    done = artstore("gc", env=team_env)
    assert done.returncode == 0, done.stderr
    assert "removed 1 stale lease record and 1 lease row of dead" in done.stdout
    assert writer.parts.blobs.get_record(LEASES, k) is None


def test_an_expired_record_costs_a_reader_no_wait(
    team_env: dict[str, str], open_store: OpenStore
) -> None:
    """A holder on another host that stopped beating long ago (its TTL and a grace)."""
    writer, k = open_store(team_env), key(3802)
    forge(writer, k, holder="gone-host:7", ttl=30, at=time.time() - 3600, hint=None)
    store = reader(open_store, team_env, ARTSTORE_LEASE_READER_WAIT="60")
    assert turned(store, k) == (None, None)
    assert counts(store).get("lease_stale") == 1
    assert counts(store).get("lease_waits", 0) == 0
    report = gc.collect(writer, gc.Policy())
    assert report.lease_records_removed == 1
    assert writer.parts.blobs.get_record(LEASES, k) is None


def test_a_forged_far_future_record_holds_a_reader_only_its_own_bound(
    team_env: dict[str, str], open_store: OpenStore, caplog: pytest.LogCaptureFixture
) -> None:
    writer, k = open_store(team_env), key(3803)
    forge(writer, k)
    store = reader(open_store, team_env, ARTSTORE_LEASE_READER_WAIT="0.5")
    caplog.set_level(logging.INFO, logger="artifactstore")
    assert turned(store, k) == (None, None)  # then compiles
    seen = counts(store)
    assert seen.get("lease_waits") == 1 and seen.get("lease_timeouts") == 1  # it waited
    lines = [r.getMessage() for r in caplog.records if "waiting up to" in r.getMessage()]
    assert len(lines) == 1, caplog.text
    assert k[:12] in lines[0] and "evil-host:4242" in lines[0]
    assert "ARTSTORE_LEASE_READER_WAIT" in lines[0] and "up to 0.5 s" in lines[0]

    # The forged record has no lease in the index: gc removes it (a dry run only counts).
    dry = gc.collect(writer, gc.Policy(dry_run=True))
    assert dry.lease_records_removed == 1 and writer.parts.blobs.get_record(LEASES, k) is not None
    assert gc.collect(writer, gc.Policy()).lease_records_removed == 1
    assert writer.parts.blobs.get_record(LEASES, k) is None


def test_a_malformed_holder_name_is_not_echoed_raw(
    team_env: dict[str, str], open_store: OpenStore, caplog: pytest.LogCaptureFixture
) -> None:
    writer, k = open_store(team_env), key(3804)
    forge(writer, k, holder="evil\nartifactstore: stored 0 entries\x1b[2J")
    store = reader(open_store, team_env, ARTSTORE_LEASE_READER_WAIT="0.2")
    caplog.set_level(logging.INFO, logger="artifactstore")
    turned(store, k)
    line = next(r.getMessage() for r in caplog.records if "waiting up to" in r.getMessage())
    assert "\n" not in line and "\x1b" not in line and "evil?artifactstore" in line


def test_gc_keeps_a_live_holders_lease(team_env: dict[str, str], open_store: OpenStore) -> None:
    writer, k = open_store(team_env), key(3805)
    got, held = turn(writer, k)
    assert got is None and held is not None
    flight = writer.flight
    assert flight is not None
    flight.drain(10)
    assert writer.parts.blobs.get_record(LEASES, k) is not None
    other = open_store(team_env)
    report = gc.collect(other, gc.Policy())
    assert report.lease_records_removed == 0 and report.lease_rows_removed == 0
    assert writer.parts.blobs.get_record(LEASES, k) is not None
    held.release(stored=False)
    flight.drain(10)


def test_a_beating_forged_record_cannot_hide_an_expired_lease_from_a_writer(
    team_env: dict[str, str], open_store: OpenStore
) -> None:
    """A writer waits on the index's lease, not on the record: the holder (on another host)
    stopped renewing its row, a forger keeps the record beating; the writer takes it over
    once the row expires (before: it waited out ARTSTORE_LEASE_WAIT)."""
    k = key(3807)
    writer = open_store({**team_env, "ARTSTORE_LEASE_TTL": "1", "ARTSTORE_LEASE_WAIT": "120"})
    row = {
        "name": compile_lease_name(writer.parts.namespace, k),
        "holder": "other-host:1",
        "token": "t" * 32,
    }
    with writer.parts.engine.begin() as conn:
        conn.execute(insert(LeaseRow).values(**row, expires_at=utcnow() + timedelta(seconds=2)))
    stop = threading.Event()

    def beat() -> None:
        n = 0
        while not stop.is_set():
            forge(writer, k, beat=n, holder="other-host:1", ttl=1, at=time.time())
            n += 1
            time.sleep(0.2)

    forger = threading.Thread(target=beat, daemon=True)
    forger.start()
    try:
        got, held = turned(writer, k, timeout=30)
    finally:
        stop.set()
        forger.join()
    assert got is None and held is not None  # it compiles, holding the lease
    seen = counts(writer)
    assert seen.get("lease_takeovers") == 1 and seen.get("lease_timeouts", 0) == 0
    held.release(stored=False)
    flight = writer.flight
    assert flight is not None
    flight.drain(10)


@pytest.mark.serial
def test_a_beating_forged_record_holds_a_reader_no_longer_than_the_default(
    team_env: dict[str, str], open_store: OpenStore
) -> None:
    """Timing (serial): with default settings a read-only reader waits a few seconds at most,
    even while the forger keeps "beating" the record (before: up to 300 s)."""
    writer, k = open_store(team_env), key(3806)
    stop = threading.Event()

    def beat() -> None:
        n = 0
        while not stop.is_set():
            forge(writer, k, beat=n, holder=holder_name())
            n += 1
            time.sleep(0.3)

    forger = threading.Thread(target=beat, daemon=True)
    forger.start()
    try:
        time.sleep(0.5)
        store = reader(open_store, team_env)
        started = time.monotonic()
        assert turned(store, k, timeout=60) == (None, None)
        waited = time.monotonic() - started
    finally:
        stop.set()
        forger.join()
    assert counts(store).get("lease_timeouts") == 1
    assert 4 <= waited < 10  # ARTSTORE_LEASE_READER_WAIT's default, 5 s


def test_a_program_killed_mid_compile_costs_a_reader_program_no_wait(
    team_env: dict[str, str], tmp_path: Path, open_store: OpenStore
) -> None:
    """Slow: the torture run's case with real JAX programs: a writer killed (SIGKILL) while
    it compiles leaves its lease record; a read-only reader program that then misses that
    key compiles at once, without the ~61 s wait measured before, and without a wait line."""
    holder = start(env_for(team_env, tmp_path, 0, JOB_SLOW_COMPILE_SECS="600"))
    try:
        k = wait_for_lease(open_store, team_env, holder.pid)
    finally:
        holder.kill()
        holder.wait()
    assert open_store(team_env).parts.blobs.get_record(LEASES, k) is not None  # left behind
    patient = {"ARTSTORE_READ_ONLY": "1", "ARTSTORE_LEASE_READER_WAIT": "120"}
    out = run_program("job.py", env_for(team_env, tmp_path, 1, **patient))
    assert out["store"].get("lease_stale", 0) >= 1  # the defence ran: the dead holder seen
    assert out["store"].get("lease_waits", 0) == 0 and "waiting up to" not in out["_stderr"]


@pytest.mark.parametrize("read_only", ["1", "0"])
def test_a_process_that_trusts_no_key_never_waits_on_a_lease(
    team_env: dict[str, str], open_store: OpenStore, read_only: str
) -> None:
    """Signatures required and no key trusted (nor one of its own): it loads nothing from
    this store, so a planted record (measured before: the reader's 5 s) costs no wait;
    nor does a writer that could store nothing take a lease for others to wait on."""
    writer, k = open_store(team_env), key(3805)
    forge(writer, k)
    keyless = {n: v for n, v in team_env.items() if n not in ("ARTSTORE_SIGNING_KEY",)}
    keyless["ARTSTORE_TRUSTED_KEYS"] = ""
    store = open_store(
        {**keyless, "ARTSTORE_READ_ONLY": read_only, "ARTSTORE_LOCAL_TIER": "off"},
        lazy_index=True,
    )
    assert store.parts.settings.require_signatures and not store.parts.settings.trusted_keys.names
    started = time.monotonic()
    assert turned(store, k) == (None, None)
    assert time.monotonic() - started < 2
    assert counts(store).get("lease_waits", 0) == 0
    assert counts(store).get("lease_skipped") == 1  # the defence ran
