"""The team set-up end to end on Ceph's RADOS Gateway (issue 49): CI's 'RGW tests' phase.

The same flow the moto tests cover, on a real S3 server over HTTPS, as a team runs one
(tests/s3servers.py: one RGW per session, `devstack up --s3 rgw`), and the real PostgreSQL:
a signing writer stores, read-only readers trusting its key load without compiling and
write nothing but their hit journals, `fold`, `verify`, `pull` into a node's tier that then
serves with the store down, `gc`, and several writers at once compiling each key once
under leases.
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import rgw
from conftest import (
    TEAM_PUB,
    JobResults,
    artstore,
    artstore_warm,
    bucket_of,
    clean_env,
    run_program,
    s3_client,
)
from s3servers import S3Server
from test_single_flight import compiles, env_for, finish, start, total
from test_warm_counts import WARM_SCRIPT

pytestmark = [pytest.mark.rgw, pytest.mark.slow]


def _json(*args: str, env: dict[str, str]) -> dict[str, Any]:
    proc = artstore(*args, "--json", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def _keys(env: dict[str, str]) -> list[str]:
    bucket, _ = bucket_of(env)
    pages = s3_client(env).get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def _reader(env: dict[str, str], **extra: str) -> dict[str, str]:
    """A read-only reader trusting the team's key, holding no signing key."""
    reader = {k: v for k, v in env.items() if k != "ARTSTORE_SIGNING_KEY"}
    return {**reader, "ARTSTORE_READ_ONLY": "1", "ARTSTORE_TRUSTED_KEYS": str(TEAM_PUB),
            "ARTSTORE_LOCAL_TIER": "off", **extra}  # fmt: skip


def test_signed_writer_readers_fold_verify_pull_and_gc_on_rgw(
    rgw_team_env: dict[str, str], job_results: JobResults, tmp_path: Path
) -> None:
    """Slow: five JAX processes and eight commands on RGW (about 60 s)."""
    env = rgw_team_env
    writer = run_program("job.py", {**env, "ARTSTORE_LOCAL_TIER": "off"})
    stored = writer["store"]["stored"]
    assert stored >= 10 and writer["results"] == job_results()
    # Over HTTPS RGW 16.2 refuses boto3's streamed checksums: said once, then stored without.
    assert writer["_stderr"].count("refused boto3's streamed upload checksums") == 1
    before = _keys(env)
    assert "cache/default/identity" in before

    for _ in range(2):  # two readers: every entry loaded, nothing compiled
        hit = run_program("job.py", _reader(env))
        assert hit["xla_compiles"] == [] and hit["store"]["hits"] == stored, hit["store"]
        assert hit["results"] == writer["results"]
    after = _keys(env)
    journals = [k for k in after if "/journals/" in k]
    assert len(journals) == 2 and [k for k in after if k not in journals] == before

    folded = _json("fold", env=env)
    assert folded["journals_folded"] == 2 and folded["hits"] >= 2 * stored
    verified = artstore("verify", env=env)
    assert verified.returncode == 0 and "signed by: team-tests" in verified.stdout, (
        verified.stdout + verified.stderr
    )

    node = _reader(env, ARTSTORE_LOCAL_TIER=str(tmp_path / "tier"))
    pulled = _json("pull", env=node)
    assert pulled["fetched"] == stored and pulled["failed"] == 0, pulled
    down = dict(node, AWS_ENDPOINT_URL_S3="http://127.0.0.1:9", ARTSTORE_TIMEOUT="2")
    offline = run_program("job.py", down)  # the store unreachable: the pulled tier serves
    assert offline["xla_compiles"] == [] and offline["results"] == writer["results"]

    gone = _json("gc", "--max-size", "0", "--grace", "0s", env=env)
    assert len([r for r in gone["removed"] if r["kind"] == "entry"]) == stored, gone
    assert not [k for k in _keys(env) if "/objects/" in k]
    again = run_program("job.py", _reader(env))
    assert again["store"].get("hits", 0) == 0 and again["results"] == writer["results"]


def test_several_writers_compile_each_key_once_on_rgw(
    rgw_team_env: dict[str, str], tmp_path: Path
) -> None:
    """Slow: four JAX processes started at once, waiting on each other's leases."""
    reference = run_program("job.py", clean_env(JOB_NO_STORE="1"))
    one_run = collections.Counter(reference["xla_compiles"])
    procs = [start(env_for(rgw_team_env, tmp_path, i)) for i in range(4)]
    results = [finish(p) for p in procs]
    assert compiles(results) == one_run  # each key compiled once across the four
    assert all(r["results"] == reference["results"] for r in results)
    assert total(results, "lease_waits") >= 1 and total(results, "lease_timeouts") == 0
    assert total(results, "stored") == sum(one_run.values())


def test_warm_on_a_bucket_at_its_quota_says_quota_on_rgw(
    rgw_team_env: dict[str, str], rgw_tls_server: S3Server, tmp_path: Path
) -> None:
    """Slow: two warms of a JAX program. A Ceph bucket quota (`radosgw-admin quota`) the
    store has filled: RGW refuses every new object (403 QuotaExceeded), so what the second
    warm compiled is not stored, for `quota`; the S3 line names the quota and the fix, and
    the job fails (exit 1), nothing counted added."""
    env = {**rgw_team_env, "ARTSTORE_LOCAL_TIER": "off"}
    code, first, output = artstore_warm(
        "--", sys.executable, WARM_SCRIPT, env=env, tmp_path=tmp_path
    )
    assert code == 0 and first["added"] > 0, output
    bucket, _ = bucket_of(env)
    admin = (Path(rgw_tls_server.extra["conf"]), "radosgw-admin")
    rgw.run_tool(*admin, "quota", "set", "--quota-scope=bucket", f"--bucket={bucket}",
                 f"--max-objects={len(_keys(env))}")  # fmt: skip
    rgw.run_tool(*admin, "quota", "enable", "--quota-scope=bucket", f"--bucket={bucket}")

    command = ("--", sys.executable, WARM_SCRIPT, "--variant", "2")  # new keys
    code, report, output = artstore_warm(*command, env=env, tmp_path=tmp_path)
    assert code == 1, output
    compiled = len(json.loads(output.splitlines()[0])["xla_compiles"])
    assert compiled >= 1 and report["not_stored"] == {"quota": compiled}, report
    assert report["added"] == 0, report  # (a key both variants share is present: loaded)
    [line] = [p for p in report["problems"] if "compiled but not stored" in p]
    assert "a quota of the object store or database refused them" in line, line
    assert "is over its quota (QuotaExceeded)" in output and "artstore gc --max-size" in output
