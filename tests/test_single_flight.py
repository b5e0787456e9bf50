"""Single-flight compiles (artifactstore/store/flight.py) across real processes.

Every process runs tests/programs/job.py on the team store (moto S3 over HTTP +
PostgreSQL). Its two main functions' compiles are made slow (JOB_SLOW_COMPILE_SECS)
so that the processes overlap; each reports which modules XLA compiled, so the tests
count compiles across all of them.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import OpenStore, clean_env, run_program, start_program
from faultproxy import FaultProxy
from forks import Process

from artifactstore import config
from artifactstore.blobstores.base import LEASES
from artifactstore.errors import ConfigError, CorruptObject
from artifactstore.formats.lease import LeaseRecord
from artifactstore.store.lease import DEFAULT_WAIT_SECS, enabled, filesystem_type, wait_bound

pytestmark = pytest.mark.slow
MLP = '"jit_mlp"'  # as job.py reports XLA compiles (a quoted StringAttr)


def start(env: dict[str, str], **extra: str) -> Process:
    return start_program("job.py", {**env, **extra}, stdin=subprocess.PIPE)


def finish(proc: Process, timeout: float = 240) -> dict[str, Any]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    result["_stderr"] = err
    return result


def paused(proc: Process) -> None:
    """Wait for job.py's `open` pause (JOB_PAUSE=open): JAX imported, store configured."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert json.loads(line)["paused"] == "open", line


def resume(*procs: Process) -> None:
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("\n")
        proc.stdin.flush()


def env_for(team_env: dict[str, str], tmp_path: Path, i: int, **extra: str) -> dict[str, str]:
    """Process `i`: its own tier (never warm by another's), slow main compiles."""
    return {
        **team_env,
        "ARTSTORE_LOCAL_TIER": str(tmp_path / f"tier-{i}"),
        "ARTSTORE_TIMEOUT": "60",  # many processes on 2 cores: never a timeout by load
        "JOB_SLOW_COMPILE_SECS": "3",
        **extra,
    }


def wait_for_lease(open_store: OpenStore, env: dict[str, str], pid: int) -> str:
    """The key of the lease `pid` holds for a slow compile (its record stays)."""
    store = open_store(env, lazy_index=True)
    deadline = time.monotonic() + 120
    seen: dict[str, float] = {}
    while time.monotonic() < deadline:
        for key in list(store.parts.blobs.iter_records(LEASES)):
            data = store.parts.blobs.get_record(LEASES, key)
            if data is None:
                continue
            record = LeaseRecord.decode(data)
            if record.holder.endswith(f":{pid}") and record.state == "compiling":
                first = seen.setdefault(key, time.monotonic())
                if time.monotonic() - first > 1.0:  # not one of the quick compiles
                    return key
        time.sleep(0.2)
    raise AssertionError("the holder never took a lease for its slow compile")


def waiting_on(proc: Process, key: str) -> None:
    """Read `proc`'s stderr until it says it waits on `key`'s holder (flight.py says each
    wait in one line; JOB_LOG_INFO shows the ones after the first), instead of sleeping
    for long enough on a loaded machine."""
    assert proc.stderr is not None
    said = []
    for line in proc.stderr:
        said.append(line)
        if "waiting up to" in line and key[:12] in line:
            return
    raise AssertionError(f"it never waited on {key[:12]}:\n{''.join(said)[-3000:]}")


def compiles(results: list[dict[str, Any]]) -> collections.Counter[str]:
    return collections.Counter(m for r in results for m in r["xla_compiles"])


def total(results: list[dict[str, Any]], counter: str) -> int:
    return sum(r["store"].get(counter, 0) for r in results)


def test_sixteen_processes_compile_each_key_once(team_env: dict[str, str], tmp_path: Path) -> None:
    """Slow: sixteen JAX processes started at once, the point of the test."""
    reference = run_program("job.py", clean_env(JOB_NO_STORE="1"))
    one_run = collections.Counter(reference["xla_compiles"])
    procs = [start(env_for(team_env, tmp_path, i)) for i in range(16)]
    results = [finish(p) for p in procs]
    # Every key XLA compiled once across all sixteen processes, however they interleaved.
    assert compiles(results) == one_run
    assert all(r["results"] == reference["results"] for r in results)
    assert total(results, "lease_waits") >= 1
    assert total(results, "lease_timeouts") == 0
    assert total(results, "stored") == sum(one_run.values())


def test_holder_killed_mid_compile_one_waiter_takes_over(
    team_env: dict[str, str], tmp_path: Path, open_store: OpenStore
) -> None:
    """Slow: waits out a killed holder's lease TTL with real JAX compiles in several processes."""
    holder = start(env_for(team_env, tmp_path, 0, JOB_SLOW_COMPILE_SECS="600"))
    try:
        lease = wait_for_lease(open_store, team_env, holder.pid)
        quick = {"JOB_PAUSE": "open", "JOB_SLOW_COMPILE_SECS": "1", "JOB_LOG_INFO": "1"}
        waiters = [start(env_for(team_env, tmp_path, i, **quick)) for i in (1, 2)]
        for proc in waiters:
            paused(proc)
        resume(*waiters)
        for proc in waiters:  # they load the quick entries, then wait on the holder's
            waiting_on(proc, lease)
        holder.kill()
        results = [finish(p, timeout=120) for p in waiters]
    finally:
        holder.kill()
        holder.wait()
    # Exactly one waiter took the dead holder's lease over and compiled; the others
    # loaded its result; nobody waited out the (default, 5 minute) bound.
    assert compiles(results)[MLP] == 1
    assert total(results, "lease_takeovers") == 1
    assert total(results, "lease_timeouts") == 0


def test_silent_holder_is_taken_over_after_its_ttl(
    team_env: dict[str, str], tmp_path: Path, open_store: OpenStore
) -> None:
    """A holder that stops beating but does not die here (another host's, partitioned).

    Slow: waits out a silent holder's lease TTL.
    """
    # 4 s: the taker renews every TTL/3 while it compiles; on two loaded cores a 2 s TTL
    # lapsed once before its renewal ran, and the second waiter took the lease over too.
    ttl = {"ARTSTORE_LEASE_TTL": "4"}
    holder = start(env_for(team_env, tmp_path, 0, JOB_SLOW_COMPILE_SECS="600", **ttl))
    try:
        wait_for_lease(open_store, team_env, holder.pid)
        holder.send_signal(signal.SIGSTOP)
        waiters = [start(env_for(team_env, tmp_path, i, **ttl)) for i in (1, 2)]
        results = [finish(p, timeout=120) for p in waiters]
    finally:
        holder.kill()
        holder.wait()
    assert compiles(results)[MLP] == 1
    assert total(results, "lease_takeovers") == 1


def test_index_unreachable_while_waiting_waiters_compile(
    team_env: dict[str, str], tmp_path: Path, open_store: OpenStore
) -> None:
    """Slow: waiters wait out their bound against an unreachable index before compiling."""
    url = team_env["ARTSTORE_INDEX"]
    port = int(url.rsplit(":", 1)[1].split("/", 1)[0])
    with FaultProxy(("127.0.0.1", port)) as proxy:
        proxied = url.replace(f":{port}/", f":{proxy.port}/", 1)
        # A 10 s bound, not 3: the proxied index answers while the waiters start, on a
        # loaded machine too (3 s ran out once beside the other worker's programs).
        faulty = {"ARTSTORE_INDEX": proxied, "ARTSTORE_LEASE_TTL": "3", "ARTSTORE_TIMEOUT": "10"}
        holder = start(env_for(team_env, tmp_path, 0, JOB_SLOW_COMPILE_SECS="600", **faulty))
        try:
            lease = wait_for_lease(open_store, team_env, holder.pid)
            waiters = [
                start(env_for(team_env, tmp_path, i, JOB_PAUSE="open", JOB_LOG_INFO="1", **faulty))
                for i in (1, 2)
            ]
            for proc in waiters:
                paused(proc)
            resume(*waiters)
            for proc in waiters:
                waiting_on(proc, lease)
            proxy.set_mode("down")
            results = [finish(p, timeout=120) for p in waiters]
        finally:
            holder.kill()
            holder.wait()
    # The holder could not renew its lease: it let its waiters go, and each compiled
    # (nothing can be stored while the index is down) before its bound (no timeout).
    assert compiles(results)[MLP] == 2
    assert total(results, "lease_timeouts") == 0


def test_a_wait_is_bounded_and_readers_wait_without_a_lease(
    team_env: dict[str, str], tmp_path: Path, open_store: OpenStore
) -> None:
    """Slow: waits out the single-flight bound, the point of the test."""
    holder = start(env_for(team_env, tmp_path, 0, JOB_SLOW_COMPILE_SECS="600"))
    try:
        wait_for_lease(open_store, team_env, holder.pid)
        bounded = start(env_for(team_env, tmp_path, 1, ARTSTORE_LEASE_WAIT="2"))
        reader = start(
            env_for(team_env, tmp_path, 2, ARTSTORE_READ_ONLY="1", ARTSTORE_LEASE_WAIT="2")
        )
        results = [finish(bounded, timeout=120), finish(reader, timeout=120)]
    finally:
        holder.kill()
        holder.wait()
    for result in results:  # both waited for the live holder, up to the bound, then compiled
        assert result["store"].get("lease_waits", 0) >= 1
        assert result["store"].get("lease_timeouts", 0) >= 1
        assert MLP in result["xla_compiles"]
    assert "lease_takeovers" not in results[1]["store"]  # a reader never holds a lease


def test_reader_loads_what_a_writer_compiles(
    team_env: dict[str, str], tmp_path: Path, open_store: OpenStore
) -> None:
    """Slow: a writer's compile slowed on purpose so that the reader waits for it."""
    writer = start(env_for(team_env, tmp_path, 0, JOB_PAUSE="open", JOB_SLOW_COMPILE_SECS="8"))
    patient = {"ARTSTORE_READ_ONLY": "1", "ARTSTORE_LEASE_READER_WAIT": "60"}
    reader = start(env_for(team_env, tmp_path, 1, JOB_PAUSE="open", **patient))
    paused(writer)
    paused(reader)
    resume(writer)
    wait_for_lease(open_store, team_env, writer.pid)  # the writer holds the slow compile's
    resume(reader)
    results = [finish(writer), finish(reader)]
    assert MLP in results[0]["xla_compiles"]
    assert MLP not in results[1]["xla_compiles"]
    assert results[1]["store"].get("lease_loaded", 0) >= 1
    assert results[0]["results"] == results[1]["results"]


def test_off_switch_every_process_compiles(team_env: dict[str, str], tmp_path: Path) -> None:
    off = {"ARTSTORE_SINGLE_FLIGHT": "0", "JOB_PAUSE": "open"}
    procs = [start(env_for(team_env, tmp_path, i, **off)) for i in (0, 1)]
    for proc in procs:
        paused(proc)
    resume(*procs)
    results = [finish(p) for p in procs]
    assert compiles(results)[MLP] == 2
    assert total(results, "lease_waits") == 0


# -- units -------------------------------------------------------------------------
def test_settings_and_where_it_is_on(tmp_path: Path) -> None:
    embedded = config.resolve({"url": str(tmp_path / "s")}, environ={})
    assert embedded.single_flight == "auto" and embedded.lease_wait_secs is None
    assert enabled(embedded)[0]
    team = config.resolve({"url": "s3://bucket/p", "index": "postgresql://u@h/db"}, environ={})
    assert enabled(team) == (True, "on (auto: PostgreSQL index)")
    off = config.resolve({"url": str(tmp_path)}, environ={"ARTSTORE_SINGLE_FLIGHT": "0"})
    assert not enabled(off)[0]
    on = config.resolve({"url": str(tmp_path)}, environ={"ARTSTORE_SINGLE_FLIGHT": "yes"})
    assert on.single_flight == "on"
    with pytest.raises(ConfigError, match="ARTSTORE_SINGLE_FLIGHT: use auto, 1 or 0"):
        config.resolve({"url": str(tmp_path)}, environ={"ARTSTORE_SINGLE_FLIGHT": "maybe"})
    with pytest.raises(ConfigError, match="ARTSTORE_LEASE_TTL"):
        config.resolve({"url": str(tmp_path)}, environ={"ARTSTORE_LEASE_TTL": "0"})
    assert filesystem_type(Path(os.getcwd())) is not None


def test_wait_bound_follows_the_known_compile_time(tmp_path: Path) -> None:
    settings = config.resolve({"url": str(tmp_path)}, environ={})
    assert wait_bound(settings, None) == DEFAULT_WAIT_SECS
    assert wait_bound(settings, 100.0) == 300.0
    assert wait_bound(settings, 0.5) == 30.0  # never shorter than a busy host's jitter
    fixed = config.resolve({"url": str(tmp_path)}, environ={"ARTSTORE_LEASE_WAIT": "7"})
    assert wait_bound(fixed, 100.0) == 7.0


def test_lease_records_are_strict() -> None:
    record = LeaseRecord("host:1", 3, 30.0, hint=2.5)
    assert LeaseRecord.decode(record.encode()) == record
    for bad in (b"", b"[]", b'{"v": 2}', b"x" * 2000, record.encode().replace(b"compiling", b"x")):
        with pytest.raises(CorruptObject):
            LeaseRecord.decode(bad)
