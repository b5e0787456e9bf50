"""Readers at cluster scale: the read path needs the bucket only (issue 16).

A database server serves about a hundred connections to every client of every team;
a cluster of readers must cost it none, and readers' hits still reach LRU through
hit journals that `artstore fold` / `artstore gc` apply.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from conftest import PROGRAMS, OpenStore, artstore, clean_env, devstack, run_program
from faultproxy import FaultProxy
from faults.harness import Job
from sqlalchemy.engine import make_url

from artifactstore.config.host import compute
from artifactstore.formats.fingerprint import Fingerprint
from artifactstore.formats.put import Put

CLOSED_INDEX = "postgresql+psycopg://postgres:pw-s3cret@127.0.0.1:1/closed"
# Lightweight readers started at once (each a process with its own store and boto3
# client, ~30 MB): the 200 unless a smaller machine says otherwise.
N_READERS = int(os.environ.get("ARTSTORE_TEST_READERS", "200"))


def _connections(pg_url: str) -> int:
    """Client connections to the test's database, counted by the server."""
    url = make_url(pg_url)
    with psycopg.connect(host=url.host, port=url.port, user=url.username, dbname="postgres",
                         autocommit=True) as conn:  # fmt: skip
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (url.database,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def _stats(env: dict[str, str]) -> dict[str, int]:
    out = artstore("stats", "--json", env=env)
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


def test_jax_readers_need_only_the_bucket(team_env: dict[str, str], tmp_path: Path) -> None:
    """Real JAX readers load every entry with the index URL at a closed port, hold no
    connection while alive on the real index, and their hits reach `stats` after gc."""
    writer = run_program("job.py", team_env)
    stored = writer["store"]["stored"]
    assert stored == len(writer["xla_compiles"]) > 0
    reader_env = dict(team_env, ARTSTORE_READ_ONLY="1", ARTSTORE_LOCAL_TIER="off")
    closed = run_program("job.py", dict(reader_env, ARTSTORE_INDEX=CLOSED_INDEX))
    assert closed["xla_compiles"] == [] and closed["results"] == writer["results"]
    assert closed["store"]["hits"] == stored and "artifactstore" not in closed["_stderr"]

    # On the real index: alive (as a training job after its compiles), no connection.
    pg_url = team_env["ARTSTORE_INDEX"]
    jobs = [Job(clean_env(**dict(reader_env, JOB_PAUSE="exit"))).start() for _ in range(2)]
    try:
        for job in jobs:
            out = job.line()
            assert out["xla_compiles"] == [] and out["store"]["hits"] == stored, out
            job.paused("exit")
        assert _connections(pg_url) == 0
        for job in jobs:
            job.go()
            job.wait()
    finally:
        for job in jobs:
            job.stop()
    before = _stats(team_env)["hits"]
    gc = artstore("gc", "--grace", "1h", env=team_env)
    assert gc.returncode == 0 and "folded 3 hit journals" in gc.stdout, gc.stdout + gc.stderr
    assert _stats(team_env)["hits"] == before + 3 * stored


def test_a_warm_process_contacts_nothing_remote(team_env: dict[str, str], tmp_path: Path) -> None:
    """With its tier warm, an ordinary program (with jits too quick to store) makes no
    request to S3 or PostgreSQL, counted by proxies in front of both servers, and
    imports none of SQLAlchemy, boto3 or psycopg."""
    moto_port = int(team_env["AWS_ENDPOINT_URL_S3"].rsplit(":", 1)[1])
    s3 = FaultProxy(("127.0.0.1", moto_port)).start()
    pg = FaultProxy(("127.0.0.1", devstack.PG_PORT)).start()
    try:
        index = team_env["ARTSTORE_INDEX"].replace(f":{devstack.PG_PORT}/", f":{pg.port}/", 1)
        env = dict(team_env, AWS_ENDPOINT_URL_S3=s3.endpoint, ARTSTORE_INDEX=index,
                   ARTSTORE_LOCAL_TIER=str(tmp_path / "tier"), ARTSTORE_MIN_COMPILE_SECS="1",
                   JOB_SLOW_COMPILE_SECS="1.2", JOB_SMALL_JITS="1")  # fmt: skip
        cold = run_program("job.py", env)
        assert cold["store"]["stored"] == 2 and s3.connections > 0 and pg.connections > 0
        seen = (s3.connections, pg.connections)
        warm = run_program("job.py", env)
        assert warm["results"] == cold["results"] and warm["store"]["tier_hits"] == 2
        # The trivial jits too: kept in this host's tier by the cold process, loaded here.
        assert warm["store"]["quick_loads"] == len(cold["xla_compiles"]) - 2
        assert warm["xla_compiles"] == []
        assert (s3.connections, pg.connections) == seen, "a warm process reached a server"
        assert warm["imported"] == [] and "artifactstore" not in warm["_stderr"]
    finally:
        s3.stop()
        pg.stop()


def _fp() -> Fingerprint:
    return compute(platform_name="cpu", platform_version="v", device_kind="cpu",
                   device_count=1, jax_version="1", jaxlib_version="1")  # fmt: skip


@pytest.mark.serial
def test_many_lightweight_readers_no_failures_no_connections(
    team_env: dict[str, str], open_store: OpenStore, tmp_path: Path
) -> None:
    """N_READERS processes look up every entry at once and stay alive: none fails, the
    database sees no connection, and `artstore fold` applies every one's hits.

    Slow: 200 reader processes against one bucket, the point of the test. Serial: beside
    another xdist worker they starve its tests (a 1 s `artstore quota ls` took 45-70 s;
    at `nice -n 19` still 50 s for another test), so CI runs this one alone.
    """
    writer = open_store(team_env, local_tier="off")
    keys = [f"{i:064x}" for i in range(3)]
    for i, key in enumerate(keys):
        assert writer.put(
            Put(key, os.urandom(4096), fingerprint=_fp(), module_name=f"jit_f{i}", compile_secs=1.0)
        )
    keys_file = tmp_path / "keys"
    keys_file.write_text("".join(f"{k} {_fp().digest}\n" for k in keys))
    # moto is one Python process on the same 2 cores as the readers: answering all of
    # them at once takes longer than the default bound, which is for outages.
    env = clean_env(**dict(team_env, ARTSTORE_READ_ONLY="1", ARTSTORE_LOCAL_TIER="off",
                           ARTSTORE_TIMEOUT="120"))  # fmt: skip
    pg_url = team_env["ARTSTORE_INDEX"]
    writer.close()
    proc = subprocess.Popen(
        [sys.executable, str(PROGRAMS / "readers.py"), str(N_READERS), str(keys_file)],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    try:
        ready = json.loads(proc.stdout.readline())
        assert ready["ready"] == N_READERS and ready["failures"] == [], ready
        assert ready["hits"] == N_READERS * len(keys) and ready["index_opened"] == 0
        assert _connections(pg_url) == 0  # all of them alive, none connected
        proc.stdin.close()
        exited = json.loads(proc.stdout.readline())
        assert exited["exited"] == N_READERS, exited  # 3: a journal not flushed
        assert proc.wait(timeout=300) == 0
    finally:
        proc.kill()
    folded = artstore("fold", "--json", env=team_env)
    assert folded.returncode == 0, folded.stderr
    report = json.loads(folded.stdout)
    assert report["journals_folded"] == N_READERS and report["hits"] == N_READERS * len(keys)
    entries = json.loads(artstore("ls", "--json", env=team_env).stdout)
    assert {e["key"]: e["hits"] for e in entries} == {k: N_READERS for k in keys}
