"""The team store: moto S3 over HTTP + the real PostgreSQL, shared by many processes."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from conftest import (
    FAKE_AWS,
    TEAM_SIGNING,
    JobResults,
    artstore,
    bucket_of,
    clean_env,
    devstack,
    run_program,
    s3_client,
)
from sqlalchemy import create_engine, text

TABLES = ("entries", "objects", "counters", "fingerprints")


def _bucket_listing(env: dict[str, str]) -> list[tuple[str, str, int]]:
    bucket, _ = bucket_of(env)
    s3 = s3_client(env)
    out = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        out += [(o["Key"], o["ETag"], o["Size"]) for o in page.get("Contents", [])]
    return sorted(out)


def _index_dump(env: dict[str, str]) -> dict[str, list[Any]]:
    engine = create_engine(env["ARTSTORE_INDEX"])
    with engine.connect() as conn:
        dump = {t: sorted(map(repr, conn.execute(text(f"SELECT * FROM {t}")))) for t in TABLES}
    engine.dispose()
    return dump


def test_read_only_reader_hits_and_writes_nothing(
    team_env: dict[str, str], job_results: JobResults
) -> None:
    writer = run_program("job.py", team_env)
    listing, index = _bucket_listing(team_env), _index_dump(team_env)
    assert listing and index["entries"]

    reader_env = dict(team_env, ARTSTORE_READ_ONLY="1")
    hit = run_program("job.py", reader_env)
    assert hit["xla_compiles"] == [] and hit["results"] == writer["results"]
    assert hit["store"]["hits"] == len(writer["xla_compiles"])
    miss = run_program("job.py", dict(reader_env, JOB_VARIANT="0.5"))  # a new program
    assert miss["xla_compiles"] and miss["store"].get("stored", 0) == 0
    assert miss["store"]["skipped_read_only"] >= 1

    # Byte for byte (same keys, ETags, sizes) but for the readers' hit journals, which
    # are the index's to fold: the index itself is untouched until then.
    after = _bucket_listing(team_env)
    journals = [k for k, _, _ in after if k.startswith("cache/default/journals/")]
    assert len(journals) >= 2 and [i for i in after if i[0] not in journals] == [
        i for i in listing if i[0] not in journals
    ]
    assert _index_dump(team_env) == index
    folded = json.loads(artstore("fold", "--json", env=team_env).stdout)
    assert folded["journals_folded"] == len(journals) and folded["hits"] >= hit["store"]["hits"]
    assert not [k for k, _, _ in _bucket_listing(team_env) if "/journals/" in k]
    assert miss["results"] == job_results("0.5")


def test_namespaces_are_isolated(team_env: dict[str, str]) -> None:
    a = dict(team_env, ARTSTORE_NAMESPACE="team-a")
    b = dict(team_env, ARTSTORE_NAMESPACE="team-b")
    first = run_program("job.py", a)
    other = run_program("job.py", b)
    assert other["store"].get("hits", 0) == 0  # team-b never reads team-a's entries
    assert len(other["xla_compiles"]) == len(first["xla_compiles"])
    again = run_program("job.py", a)
    assert again["xla_compiles"] == []
    keys = [k for k, _, _ in _bucket_listing(team_env)]
    assert any(k.startswith("cache/team-a/objects/") for k in keys)
    assert any(k.startswith("cache/team-b/objects/") for k in keys)
    ls_a = json.loads(artstore("ls", "--json", env=a).stdout)
    ls_b = json.loads(artstore("ls", "--json", env=b).stdout)
    assert {e["namespace"] for e in ls_a} == {"team-a"} and {e["namespace"] for e in ls_b} == {
        "team-b"
    }
    removed = artstore("rm", "--all", "--yes", env=b)
    assert removed.returncode == 0, removed.stderr
    assert json.loads(artstore("ls", "--json", env=a).stdout) == ls_a
    assert not any(k.startswith("cache/team-b/objects/") for k, _, _ in _bucket_listing(b))


def test_schema_mismatch_names_the_fix(moto_endpoint: str, pg_url: str) -> None:
    bucket = "artstore-" + uuid.uuid4().hex[:12]
    devstack.create_bucket(moto_endpoint, bucket)
    env = clean_env(ARTSTORE_URL=f"s3://{bucket}/c", ARTSTORE_INDEX=pg_url,
                    AWS_ENDPOINT_URL_S3=moto_endpoint, **FAKE_AWS, **TEAM_SIGNING)  # fmt: skip
    cli = artstore("ls", env=env)
    assert cli.returncode == 1 and "run `artstore db upgrade`" in cli.stderr
    assert len(cli.stderr.strip().splitlines()) == 1
    job = run_program("job.py", env)
    # Lookups need only the bucket (manifests); the first put finds the schema behind.
    assert job["xla_compiles"] and job["store"].get("stored", 0) == 0
    lines = [line for line in job["_stderr"].splitlines() if "artifactstore" in line]
    assert len(lines) == 1 and "artstore db upgrade" in lines[0]
    assert artstore("db", "upgrade", env=env).returncode == 0
    assert artstore("ls", env=env).returncode == 0


def _auth_moto() -> Any:
    """A second moto server that enforces IAM authentication: every key is unknown."""
    import os

    old = os.environ.get("INITIAL_NO_AUTH_ACTION_COUNT")
    os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = "0"
    try:
        return devstack.start_moto()
    finally:
        if old is None:
            del os.environ["INITIAL_NO_AUTH_ACTION_COUNT"]
        else:
            os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = old


@pytest.mark.parametrize(
    "failure", ["missing-bucket", "malformed-url", "unreachable-endpoint", "wrong-credentials",
                "unreachable-database"],
)  # fmt: skip
def test_store_failures_degrade_to_compiling(
    failure: str, team_env: dict[str, str], moto_endpoint: str, job_results: JobResults
) -> None:
    # Each failure is refused at once (closed port, bad name, bad key); the other backend
    # is the real one, which must not be cut short by load (issue 39, item 9).
    env = dict(team_env, ARTSTORE_TIMEOUT="30")
    server = None
    if failure == "missing-bucket":
        env["ARTSTORE_URL"] = "s3://no-such-bucket-here/cache"
    elif failure == "malformed-url":
        env["ARTSTORE_URL"] = "s3://Bad_Bucket!/cache"
    elif failure == "unreachable-endpoint":
        env["AWS_ENDPOINT_URL_S3"] = "http://127.0.0.1:1"
    elif failure == "wrong-credentials":
        server = _auth_moto()
        env["AWS_ENDPOINT_URL_S3"] = server.endpoint
    else:
        env["ARTSTORE_INDEX"] = "postgresql+psycopg://postgres:pw-s3cret@127.0.0.1:1/nope"
    try:
        job = run_program("job.py", env, timeout=180)
        assert job["results"] == job_results("0")
        assert job["xla_compiles"]
        lines = [line for line in job["_stderr"].splitlines() if "artifactstore" in line]
        assert len(lines) == 1, job["_stderr"]
        if failure == "unreachable-database":
            # Lookups never ask the index (manifests in the bucket): only storing needs it.
            # The first compile lease finds it down: the index's breaker says so, once.
            assert "index unavailable" in lines[0] and "not storing in it" in lines[0]
            assert "s3cret" not in job["_stderr"]
        else:
            assert "compiling without" in lines[0]
        if failure not in ("malformed-url", "unreachable-database"):  # see above
            assert "object store unavailable" in lines[0]  # the breaker of the one that failed
        # verify reads every object: it needs both backends (stats needs only the index).
        cli = artstore("verify", env=env)
        assert cli.returncode != 0
        assert len(cli.stderr.strip().splitlines()) == 1, cli.stderr
        assert "Traceback" not in cli.stderr
        for secret in (FAKE_AWS["AWS_SECRET_ACCESS_KEY"], "pw-s3cret"):
            assert secret not in job["_stderr"] and secret not in cli.stderr
    finally:
        if server is not None:
            server.stop()


def test_index_only_commands_work_with_the_object_store_down(team_env: dict[str, str]) -> None:
    """An operator can still look (ls, stats, quotas) while S3 is down."""
    run_program("job.py", team_env)
    # S3 at a closed port fails at once; the index is the real one: no short bound on it.
    down = dict(team_env, AWS_ENDPOINT_URL_S3="http://127.0.0.1:1", ARTSTORE_TIMEOUT="30")
    assert artstore("quota", "set", "default", "1G", env=down).returncode == 0
    for command in (["ls", "--json"], ["stats", "--json"], ["quota", "ls", "--json"]):
        proc = artstore(*command, env=down)
        assert proc.returncode == 0, (command, proc.stderr)
        assert json.loads(proc.stdout)
    dry = artstore("gc", "--dry-run", "--max-size", "0", env=down)  # decides from the index
    assert dry.returncode == 0, dry.stderr
    assert "would remove" in dry.stdout and "not cross-checked" in dry.stdout, dry.stdout
    assert artstore("verify", env=down).returncode == 1  # this one reads the objects
    assert artstore("gc", env=down).returncode == 1  # a real gc needs both


def test_uploads_queued_at_exit_are_stored(team_env: dict[str, str]) -> None:
    """The exit flush must upload through boto3 before Python stops its thread pools."""
    a = run_program("job.py", dict(team_env, JOB_SKIP_FLUSH="1"))
    assert "artifactstore" not in a["_stderr"], a["_stderr"]
    entries = json.loads(artstore("ls", "--json", env=team_env).stdout)
    assert len(entries) == len(a["xla_compiles"])
    b = run_program("job.py", team_env)
    assert b["xla_compiles"] == []
