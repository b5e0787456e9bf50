"""Issue 38.4: store identity for writer programs, `doctor`, `db bind --force`, `verify --repair`.

Measured on main (moto S3 + PostgreSQL): a writer program with a mistyped but existing
bucket and the team index got no warning and re-pointed 5 team index entries at objects
in the wrong bucket; every later gc refused and the documented `verify --repair` dropped
them (readers lost 5 of 7 entries). Its `doctor` said `binding FAIL` but exited 0.
`db bind --force` (which the mismatch error suggests) then `verify --repair` against an
empty bucket emptied the index, and `bind --force` wrote an identity into that bucket.
Each test here failed before the change; each negative one also shows its defence ran.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from pathlib import Path

import pytest
from conftest import OpenStore, artstore, clean_env, run_program, s3_client
from sqlalchemy import create_engine, text

from artifactstore.config import host
from artifactstore.formats.put import Put
from artifactstore.runtime.summary import Summary

MISMATCH = "do not belong together"
FP = host.compute(
    platform_name="cpu",
    platform_version="v",
    device_kind="cpu-a",
    device_count=1,
    jax_version="1",
    jaxlib_version="0.9.1",
)


def _wrong_bucket(env: dict[str, str]) -> dict[str, str]:
    """`env` with ARTSTORE_URL mistyped: another bucket that exists, empty."""
    bucket = "artstore-wrong-" + uuid.uuid4().hex[:8]
    s3_client(env).create_bucket(Bucket=bucket)
    return {**env, "ARTSTORE_URL": f"s3://{bucket}/cache"}


def _listing(env: dict[str, str]) -> list[str]:
    bucket = env["ARTSTORE_URL"].split("/")[2]
    pages = s3_client(env).get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def _rows(env: dict[str, str]) -> list[tuple[str, str]]:
    """(key, digest) of every entry in the index: what readers are led to."""
    engine = create_engine(env["ARTSTORE_INDEX"])
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT key, digest FROM entries ORDER BY key"))
            return [(str(k), str(d)) for k, d in rows]
    finally:
        engine.dispose()


def _fill(env: dict[str, str], open_store: OpenStore, n: int = 6) -> list[tuple[str, str]]:
    """`n` entries stored in `env`'s store by a writer in this process; its rows."""
    store = open_store(env)
    for i in range(n):
        key, payload = f"{i + 1:02x}" * 32, os.urandom(600 + i)
        assert store.put(Put(key, payload, fingerprint=FP, module_name=f"jit_{i}", compile_secs=1))
    return _rows(env)


def _index_shown(env: dict[str, str]) -> str:
    """The index as a line may name it: host and database, never the password."""
    return env["ARTSTORE_INDEX"].rsplit("@", 1)[1]


# -- (a) the measured case: a writer program on a second, existing bucket -------------
def test_writer_program_on_another_bucket_stores_nothing_and_says_so(
    team_env: dict[str, str],
) -> None:
    """Slow: five JAX processes (a writer, two on the wrong bucket, a reader) and gc."""
    first = run_program("job.py", team_env)
    assert first["store"]["stored"] >= 2
    before, bucket_before = _rows(team_env), _listing(team_env)
    assert before

    wrong = _wrong_bucket(team_env)
    # A new variant too: keys the index does not hold (a put), beside ones it does.
    for variant in ("0", "0.25"):
        out = run_program("job.py", {**wrong, "JOB_VARIANT": variant})
        assert out["_returncode"] == 0
        assert out["store"].get("stored", 0) == 0
        assert out["store"]["store_mismatch"] >= 1  # the defence ran: counted
        summary = Summary.of([out["store"]]).render()  # what `artstore run` would say
        assert "misses" in summary and "stored nothing" in summary, summary
        if variant == "0":
            assert out["results"] == first["results"]  # compiled, correct
        said = [line for line in out["_stderr"].splitlines() if MISMATCH in line]
        assert len(said) == 1, out["_stderr"]
        assert wrong["ARTSTORE_URL"] in said[0] and _index_shown(team_env) in said[0]
        assert "testing-secret" not in out["_stderr"] and "password" not in said[0]
    # Nothing re-pointed, nothing added; nothing written into the wrong bucket but its hit
    # journals (what a reader writes too): no compile lease either, for the team's writers
    # to wait on while this one compiles what it cannot store.
    assert _rows(team_env) == before
    assert not [k for k in _listing(wrong) if "/journals/" not in k]
    assert _listing(team_env) == bucket_before or all(
        "/journals/" in k for k in set(_listing(team_env)) - set(bucket_before)
    )
    # Readers still get every entry; gc and verify find nothing wrong.
    reader = run_program("job.py", {**team_env, "ARTSTORE_READ_ONLY": "1"})
    assert reader["xla_compiles"] == [] and reader["results"] == first["results"]
    gc = artstore("gc", env=team_env)
    assert gc.returncode == 0, gc.stderr
    verify = artstore("verify", "--json", env=team_env)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert _rows(team_env) == before


def test_a_refused_writer_holds_no_compile_lease(
    team_env: dict[str, str], open_store: OpenStore
) -> None:
    """Once its write gate refused it (its bucket is not its index's), a writer takes no
    compile lease: the team's writers would wait on it for a result that never arrives,
    and its record would go into the wrong bucket. The gate decides at its first write,
    in the background, so the check never waits on the compile path."""
    _fill(team_env, open_store, n=1)  # the team's pair, bound
    wrong = _wrong_bucket(team_env)
    stray = open_store(wrong)
    first = Put("cd" * 32, b"x" * 600, fingerprint=FP, module_name="jit_a", compile_secs=1)
    assert stray.put(first) is False  # its first write: refused, the gate decided
    key = "ab" * 32
    assert stray.get(key, FP.digest) is None  # a miss: nothing stored under the key
    assert stray.flight is not None
    assert stray.flight.turn(key, lambda: None) == (None, None)  # compile, hold nothing
    team = open_store(team_env)
    assert team.flight is not None
    taken = team.flight.try_hold(key)  # the team's writer is not kept waiting
    assert taken is not None
    taken.release(stored=True)
    team.flight.drain(30)
    assert [k for k in _listing(wrong) if "/leases/" in k] == []


def test_a_lease_taken_before_the_refusal_is_let_go_and_its_record_deleted(
    team_env: dict[str, str], open_store: OpenStore
) -> None:
    """A lease a writer took (and announced, into its bucket) before its first write was
    refused is let go at its next renewal, and its record deleted, not left behind."""
    _fill(team_env, open_store, n=1)
    wrong = _wrong_bucket(team_env)
    stray = open_store(wrong)
    key = "ef" * 32
    assert stray.get(key, FP.digest) is None
    assert stray.flight is not None
    loaded, held = stray.flight.turn(key, lambda: None)  # the gate has not decided yet
    assert loaded is None and held is not None
    stray.flight.drain(30)
    assert [k for k in _listing(wrong) if "/leases/" in k]  # announced
    first = Put("cd" * 32, b"x" * 600, fingerprint=FP, module_name="jit_a", compile_secs=1)
    assert stray.put(first) is False  # refused: the gate decided
    stray.flight._beat()  # its next renewal
    assert [k for k in _listing(wrong) if "/leases/" in k] == []
    team = open_store(team_env)
    assert team.flight is not None
    taken = team.flight.try_hold(key)
    assert taken is not None
    taken.release(stored=True)
    team.flight.drain(30)
    held.release(stored=False)  # its compile ends: nothing more is written
    stray.flight.drain(30)
    assert [k for k in _listing(wrong) if "/leases/" in k] == []


# -- (b) doctor --------------------------------------------------------------------
def test_doctor_exits_nonzero_on_a_binding_failure(
    team_env: dict[str, str], open_store: OpenStore
) -> None:
    _fill(team_env, open_store, 1)
    wrong = _wrong_bucket(team_env)
    proc = artstore("doctor", "--json", env=wrong)
    assert proc.returncode != 0, proc.stdout
    report = json.loads(proc.stdout)
    assert report["checks"]["binding"]["state"] == "MISMATCH"
    assert not report["ok"]
    assert "writes are refused" in report["verdict"], report["verdict"]
    assert wrong["ARTSTORE_URL"] in report["verdict"]
    shown = artstore("doctor", env=wrong)
    assert shown.returncode != 0 and "writes are refused" in shown.stdout


# -- (c) db bind --force -----------------------------------------------------------
def test_bind_force_on_an_empty_bucket_refuses_without_allow_missing(
    team_env: dict[str, str], open_store: OpenStore
) -> None:
    n = len(_fill(team_env, open_store))
    wrong = _wrong_bucket(team_env)
    proc = artstore("db", "bind", "--force", env=wrong)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert f"0 of the newest {n} entries have their object in" in proc.stdout + proc.stderr
    assert "--allow-missing" in proc.stderr
    assert _listing(wrong) == []  # no identity written into the wrong bucket
    # The right bucket: the count says all, and it binds.
    right = artstore("db", "bind", "--force", env=team_env)
    assert right.returncode == 0, right.stderr
    assert f"{n} of the newest {n} entries have their object in" in right.stdout
    # With the flag, a person's decision: bound, and said.
    forced = artstore("db", "bind", "--force", "--allow-missing", env=wrong)
    assert forced.returncode == 0, forced.stderr
    assert f"0 of the newest {n}" in forced.stdout
    assert [k for k in _listing(wrong) if k.endswith("/identity")]


# -- (d) verify --repair -----------------------------------------------------------
def test_verify_repair_on_an_empty_bucket_keeps_the_index(
    team_env: dict[str, str], open_store: OpenStore
) -> None:
    before = _fill(team_env, open_store)  # 6 entries, as measured
    wrong = _wrong_bucket(team_env)
    # As measured: a person binds the wrong bucket (with the flag), then repairs.
    assert artstore("db", "bind", "--force", "--allow-missing", env=wrong).returncode == 0
    proc = artstore("verify", "--repair", env=wrong)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert "--allow-missing" in line and f"{len(before)} of {len(before)}" in line, line
    assert _rows(team_env) == before
    dropped = artstore("verify", "--repair", "--allow-missing", env=wrong)
    assert dropped.returncode == 0, dropped.stderr
    assert _rows(team_env) == []


# -- the same in a SQLite index, where a lookup also asks the index ------------------
def test_writer_on_another_directory_drops_and_stores_nothing(
    tmp_path: Path, open_store: OpenStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A SQLite index answers lookups too: an entry whose object is "gone" in the wrong
    directory would be dropped from the real index by the first lookup; it is not."""
    index = f"sqlite:///{tmp_path / 'index.db'}"
    right = clean_env(
        ARTSTORE_URL=str(tmp_path / "right"), ARTSTORE_INDEX=index, ARTSTORE_LOCAL_TIER="off"
    )
    before = _fill(right, open_store, 3)
    (tmp_path / "wrong").mkdir()
    wrong = open_store({**right, "ARTSTORE_URL": str(tmp_path / "wrong")})
    with caplog.at_level(logging.WARNING, logger="artifactstore"):
        assert wrong.get(before[0][0], FP.digest) is None  # a miss: its object is not here
        assert not wrong.put(
            Put("ee" * 32, b"x" * 700, fingerprint=FP, module_name="jit_new", compile_secs=1)
        )
    counts = wrong.counters.snapshot()
    assert counts["missing_object"] == 1 and counts["store_mismatch"] == 2, counts
    said = [r.getMessage() for r in caplog.records if MISMATCH in r.getMessage()]
    assert len(said) == 1 and str(tmp_path / "wrong") in said[0], said
    assert _rows(right) == before  # nothing dropped, nothing added
    assert not (tmp_path / "wrong" / "default" / "identity").exists()
