"""Issue 38, point 8: read-only means no writes, on every path (warm included).

Measured before: a leftover ARTSTORE_WARM with ARTSTORE_READ_ONLY=1 stored 4 entries (the
startup hook configured the store in write mode, whatever the environment said). Here, real
JAX programs: the warm case on an embedded store, and a read-only reader that misses on a
team store (moto S3 over HTTP + PostgreSQL) with every would-be write in play (entries,
quick-key records, working sets, leases, identity, manifests): afterwards the bucket holds
nothing new but the reader's hit journals and the index is unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conftest import artstore, bucket_of, clean_env, run_program, s3_client
from sqlalchemy import create_engine, inspect, text

SLOW = {"ARTSTORE_MIN_COMPILE_SECS": "0.5", "JOB_SLOW_COMPILE_SECS": "0.6"}


def entries(env: dict[str, str]) -> list[str]:
    out = artstore("ls", "--json", env=env)
    assert out.returncode == 0, out.stderr
    return sorted(e["key"] for e in json.loads(out.stdout))


def test_a_leftover_warm_variable_stores_nothing_in_a_read_only_process(tmp_path: Path) -> None:
    """Slow: two real JAX programs, then `artstore ls` and `artstore warm` as a user runs them."""
    store = tmp_path / "store"
    env = clean_env(**SLOW, ARTSTORE_URL=str(store))
    first = run_program("job.py", env)
    assert first["store"]["stored"] == 2
    before = entries(env)
    report = tmp_path / "warm-report"
    report.mkdir()
    # What a shell that once ran `artstore warm` leaves: the variable, and the startup hook
    # activating the store (the program does not configure it itself).
    leftover = {"ARTSTORE_WARM": str(report), "ARTSTORE_ACTIVATE": "1", "JOB_NO_STORE": "1"}
    out = run_program("job.py", {**env, **leftover, "ARTSTORE_READ_ONLY": "1", "JOB_VARIANT": "1"})
    said = [ln for ln in out["_stderr"].splitlines() if "ARTSTORE_WARM is ignored" in ln]
    assert len(said) == 1, out["_stderr"]  # the defence ran, and said so once
    assert entries(env) == before  # before the fix: the variant's entries were stored
    assert not list(report.iterdir())  # no warm record either

    refused = artstore("warm", "--", "true", env={**env, "ARTSTORE_READ_ONLY": "1"})
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert "ARTSTORE_READ_ONLY" in refused.stderr and entries(env) == before


def bucket_keys(env: dict[str, str]) -> set[str]:
    bucket, _ = bucket_of(env)
    s3 = s3_client(env)
    keys: set[str] = set()
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        keys.update(obj["Key"] for obj in page.get("Contents", []))
    return keys


def index_rows(env: dict[str, str]) -> dict[str, Any]:
    engine = create_engine(env["ARTSTORE_INDEX"])
    try:
        with engine.connect() as conn:
            return {
                table: conn.execute(text(f'SELECT count(*) FROM "{table}"')).scalar()
                for table in inspect(conn).get_table_names()
            }
    finally:
        engine.dispose()


def test_a_read_only_reader_that_misses_writes_nothing_but_its_journal(
    team_env: dict[str, str], tmp_path: Path
) -> None:
    """Slow: a writer and a reader, real JAX programs, on the team store."""
    writer_env = {**team_env, **SLOW, "ARTSTORE_LOCAL_TIER": str(tmp_path / "w")}
    writer_env["ARTSTORE_PREFETCH"] = "1"  # working sets recorded (auto: off on the CPU)
    writer = run_program("job.py", {**writer_env, "JOB_SMALL_JITS": "1"})
    assert writer["store"]["stored"] == 2
    keys, rows = bucket_keys(team_env), index_rows(team_env)
    assert any("/quick/" in k for k in keys) and any("/workingsets/" in k for k in keys)

    reading = {"ARTSTORE_READ_ONLY": "1", "ARTSTORE_LOCAL_TIER": "off"}
    reader_env = {**writer_env, **reading}
    out = run_program("job.py", {**reader_env, "JOB_VARIANT": "1", "JOB_SMALL_JITS": "1"})
    assert out["store"].get("skipped_read_only", 0) >= 1  # the defence ran: a miss not stored
    new = bucket_keys(team_env) - keys
    assert all("/journals/" in k for k in new), sorted(new)
    assert index_rows(team_env) == rows
