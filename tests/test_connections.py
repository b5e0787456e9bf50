"""A team index's connections: tagged by role, held only while a process writes.

PostgreSQL serves a fixed number of connections to every client of every team; a
cluster of processes that each kept a pool for their whole life would take it down."""

from __future__ import annotations

import time

import psycopg
from conftest import clean_env
from faults.harness import Job
from sqlalchemy import text
from sqlalchemy.engine import make_url

from artifactstore.index import db


def _connections(pg_url: str, app: str) -> int:
    url = make_url(pg_url)
    with psycopg.connect(
        host=url.host, port=url.port, user=url.username, dbname="postgres", autocommit=True
    ) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND datname = %s",
            (app, url.database),
        ).fetchone()
    assert row is not None
    return int(row[0])


def _settles_at(pg_url: str, app: str, want: int, secs: float = 20) -> int:
    """The count once it reaches `want` (a closed connection leaves the server a moment
    later), or the last count seen after `secs`."""
    deadline = time.monotonic() + secs
    while True:
        got = _connections(pg_url, app)
        if got == want or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def test_connections_are_tagged_by_role_and_released_when_idle(pg_url: str) -> None:
    writer = db.open_engine(pg_url, timeout_secs=5)
    reader = db.open_engine(pg_url, timeout_secs=5, read_only=True)
    for engine in (writer, reader):
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    assert _connections(pg_url, "artifactstore-writer") == 1
    assert _connections(pg_url, "artifactstore-reader") == 1
    assert not db.release_idle(writer, 3600)  # used just now: kept for the next write
    assert _connections(pg_url, "artifactstore-writer") == 1
    assert db.release_idle(writer, 0) and db.release_idle(reader, 0)
    assert _settles_at(pg_url, "artifactstore-writer", 0) == 0
    assert _settles_at(pg_url, "artifactstore-reader", 0) == 0
    with writer.connect() as conn:  # the engine still works: a fresh connection
        assert conn.execute(text("SELECT 1")).scalar() == 1


def test_a_writer_that_compiled_and_idles_holds_no_connection(team_env: dict[str, str]) -> None:
    pg_url = team_env["ARTSTORE_INDEX"]
    job = Job(clean_env(**{**team_env, "JOB_PAUSE": "exit", "ARTSTORE_DB_IDLE_SECS": "1"}))
    job.start()
    try:
        result = job.line()
        assert result["store"]["stored"] >= 1, result  # it wrote, through the index
        job.paused("exit")  # alive, as a training job after its compiles would be
        assert _settles_at(pg_url, "artifactstore-writer", 0) == 0
        job.go()
        job.wait()
    finally:
        job.stop()


def test_settings_are_per_transaction_for_pgbouncer_transaction_pooling(pg_url: str) -> None:
    """No session state: under PgBouncer's transaction pooling each transaction may run on
    another server connection, so lock_timeout and a reader's READ ONLY are set in every
    transaction, and the session itself keeps the server's defaults."""
    writer = db.open_engine(pg_url, timeout_secs=3)
    reader = db.open_engine(pg_url, timeout_secs=2, read_only=True)
    try:
        for engine, timeout, read_only in ((writer, "3s", "off"), (reader, "2s", "on")):
            with engine.connect() as conn:
                assert conn.execute(text("SHOW lock_timeout")).scalar() == timeout
                assert conn.execute(text("SHOW transaction_read_only")).scalar() == read_only
            raw = engine.raw_connection()  # the same pooled connection, outside a transaction
            try:
                raw.dbapi_connection.autocommit = True  # type: ignore[union-attr]
                with raw.cursor() as cur:
                    cur.execute("SHOW lock_timeout")
                    assert cur.fetchone() == ("0",)  # the session has nothing of ours
                    cur.execute("SHOW default_transaction_read_only")
                    assert cur.fetchone() == ("off",)
            finally:
                raw.dbapi_connection.autocommit = False  # type: ignore[union-attr]
                raw.close()
    finally:
        writer.dispose()
        reader.dispose()
