"""`artstore doctor` on working, broken and unhookable set-ups, in fresh processes."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import FAKE_AWS, artstore, clean_env, devstack
from sqlalchemy.engine import make_url

from artifactstore.index import db

PASSWORD = "s3cr3t-pw"


def human_verdict(stdout: str) -> str:
    """The human output's verdict, its wrapped lines joined (the table and the verdict
    fit 100 columns: long ones wrap, indented)."""
    lines = stdout.rstrip().splitlines()
    assert all(len(line) <= 100 for line in lines), stdout
    start = max(i for i, line in enumerate(lines) if line.startswith("verdict: "))
    return " ".join(line.strip() for line in lines[start:])


def _doctor(env: dict[str, str], *args: str) -> tuple[int, dict[str, Any], str]:
    """(exit code, the --json report, the human output's verdict), from two runs."""
    as_json = artstore(*args, "doctor", "--json", env=env)
    human = artstore(*args, "doctor", env=env)
    for proc in (as_json, human):
        assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
        assert proc.returncode == as_json.returncode, (as_json.stderr, human.stdout)
    for secret in (FAKE_AWS["AWS_SECRET_ACCESS_KEY"], PASSWORD):
        assert secret not in as_json.stdout + as_json.stderr + human.stdout + human.stderr
    verdict = human_verdict(human.stdout)
    report = json.loads(as_json.stdout)
    # Wrapping may split a long word (a path): the same text, less its spaces.
    assert verdict.replace(" ", "") == f"verdict: {report['verdict']}".replace(" ", "")
    return as_json.returncode, report, verdict


def test_embedded_store_is_used_and_nothing_is_created(store_env: dict[str, str]) -> None:
    store = Path(store_env["ARTSTORE_URL"])
    # ARTSTORE_URL alone activates the store in programs, never in `artstore` itself.
    activated = {k: v for k, v in store_env.items() if k != "ARTSTORE_ACTIVATE"}
    code, report, _ = _doctor(activated)
    assert code == 0 and report["checks"]["activation"]["active"] is True
    assert report["checks"]["activation"]["hook"].endswith("artifactstore_startup.pth")
    assert not store.exists()
    code, report, verdict = _doctor(store_env)  # ARTSTORE_ACTIVATE=0
    assert report["checks"]["activation"]["active"] is False
    assert report["checks"]["activation"]["detail"].startswith("off: ")
    assert code == 0 and report["ok"] is True, report["verdict"]
    assert "the store would be used" in verdict
    assert "first use" in report["checks"]["index"]["detail"]
    assert not store.exists()  # a diagnosis creates no directory and no index

    assert artstore("db", "upgrade", env=store_env).returncode == 0
    code, report, _ = _doctor(store_env)
    checks = report["checks"]
    assert code == 0 and report["ok"] is True
    assert checks["hook"]["status"] == "ok" and checks["hook"]["detail"].startswith("yes (")
    assert checks["index"]["schema"] == "current" and checks["index"]["revision"] == db.SCHEMA_HEAD
    assert checks["object_store"]["status"] == "ok"
    assert checks["local_tier"]["path"] == str(store / "default")
    fingerprint = checks["fingerprint"]
    assert fingerprint["platform"] == "cpu" and len(fingerprint["digest"]) == 64


def _with_password(url: str) -> str:
    """PostgreSQL here trusts local connections: the password is ignored, yet must be masked."""
    return make_url(url).set(password=PASSWORD).render_as_string(hide_password=False)


def test_team_store_answers_and_secrets_stay_hidden(team_env: dict[str, str]) -> None:
    env = dict(team_env, ARTSTORE_INDEX=_with_password(team_env["ARTSTORE_INDEX"]))
    code, report, verdict = _doctor(env)
    checks = report["checks"]
    assert code == 0 and report["ok"] is True, report["verdict"]
    assert checks["object_store"]["status"] == "ok"
    assert checks["object_store"]["url"] == env["ARTSTORE_URL"]
    assert checks["index"]["status"] == "ok" and checks["index"]["schema"] == "current"
    assert "***" in checks["index"]["url"] and "the store would be used" in verdict


def test_a_wrong_but_existing_prefix_is_said_and_no_row_claims_otherwise(
    team_env: dict[str, str],
) -> None:
    """ARTSTORE_URL one word off the team's (the bucket exists, the prefix was never
    used). A writer there: the binding refuses its writes, so the access row does not say
    it stores. A reader there loads nothing: doctor says the prefix never held an entry,
    exit 1. The team's own prefix, as a reader, is the control: exit 0.

    Slow: about 20 s on 2 busy cores; five `artstore` processes, four of them doctor's.
    """
    bound = artstore("db", "bind", env=team_env)  # the team's store: bucket and index one
    assert bound.returncode == 0, bound.stderr
    wrong = dict(team_env, ARTSTORE_URL=team_env["ARTSTORE_URL"] + "-typo")
    proc = artstore("doctor", "--json", env=wrong)
    checks = json.loads(proc.stdout)["checks"]
    assert proc.returncode == 1 and checks["binding"]["state"] == "MISMATCH", proc.stdout
    assert checks["access"]["status"] == "warn" and checks["access"]["stores"] is False
    assert "every write is refused" in checks["access"]["detail"], checks["access"]
    assert "never held an entry" in checks["object_store"]["detail"]

    code, report, _ = _doctor(dict(wrong, ARTSTORE_READ_ONLY="1"))
    never = (
        f"{wrong['ARTSTORE_URL']}/default has never held an entry (no store identity, no "
        "manifests): check ARTSTORE_URL"
    )
    assert code == 1 and never in report["verdict"], report["verdict"]
    assert report["checks"]["access"]["status"] == "warn", report["checks"]["access"]
    proc = artstore("doctor", "--json", env=dict(team_env, ARTSTORE_READ_ONLY="1"))
    assert proc.returncode == 0 and "never held" not in proc.stdout, proc.stdout


MISMATCH = """
import sys
from jax._src import compiler
def compile_or_get_cached(backend, module, devs, opts):  # a future JAX's signature
    raise AssertionError("never called")
compiler.compile_or_get_cached = compile_or_get_cached
from artifactstore.cli import main
sys.argv = ["artstore", *sys.argv[1:]]
main()
"""


def test_unhookable_jax_names_the_missing_internal(store_env: dict[str, str]) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", MISMATCH, "doctor", *args], env=store_env,
                              capture_output=True, text=True, timeout=300, check=False)  # fmt: skip

    as_json, human = run("--json"), run()
    assert as_json.returncode == 1 and human.returncode == 1, human.stderr
    report = json.loads(as_json.stdout)
    hook = report["checks"]["hook"]
    assert hook["status"] == "fail" and hook["detail"].startswith("no: ")
    assert "compile_or_get_cached" in hook["detail"]
    assert report["checks"]["object_store"]["status"] == "ok"
    verdict = human_verdict(human.stdout)
    assert "internals missing" in verdict and "compile_or_get_cached" in verdict
    assert "upgrade artifactstore (`pip install -U artifactstore`) or pin jax" in verdict
    assert "Traceback" not in human.stderr + as_json.stderr


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers: a hung server."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield sock.getsockname()[1]


# A closed port refuses at once; a silent server costs each check its bound, which only the
# serial phase times (tests/suite_rules.py).
@pytest.mark.parametrize(
    "failure",
    [
        "s3-closed",
        pytest.param("s3-silent", marks=pytest.mark.serial),
        "db-closed",
        pytest.param("db-silent", marks=pytest.mark.serial),
    ],
)
def test_unreachable_part_is_named_quickly(
    failure: str, team_env: dict[str, str], request: pytest.FixtureRequest
) -> None:
    # A silent server waits out the bound (serial: 3 s); a closed port is refused at once,
    # and there the real other backend gets a bound that load cannot run out.
    silent = failure.endswith("silent")
    env = dict(team_env, ARTSTORE_TIMEOUT="3" if silent else "30")
    port = request.getfixturevalue("silent_port") if silent else 9
    if failure.startswith("s3"):
        env["AWS_ENDPOINT_URL_S3"] = f"http://127.0.0.1:{port}"
        failing, working, needle = "object_store", "index", "object store"
    else:
        env["ARTSTORE_INDEX"] = f"postgresql+psycopg://postgres:{PASSWORD}@127.0.0.1:{port}/x"
        failing, working, needle = "index", "object_store", "index"
    started = time.monotonic()
    code, report, verdict = _doctor(env)
    if silent:  # serial: two runs, each check bounded by 3 s
        assert time.monotonic() - started < 90
    assert code == 1 and report["ok"] is False
    assert report["checks"][failing]["status"] == "fail"
    assert report["checks"][working]["status"] == "ok"
    if failing == "index":  # loads never ask a database server: a writer only stores nothing
        assert report["used"] == "read-only" and "nothing is stored: index" in verdict, verdict
    else:
        assert verdict.startswith("verdict: the store is not used: ") and needle in verdict
    if failure == "s3-silent":  # boto3 alone would retry for 3 x 3 s
        assert "did not answer within 3 s" in verdict


def test_schema_not_upgraded_says_db_upgrade(moto_endpoint: str, pg_url: str) -> None:
    bucket = "artstore-" + uuid.uuid4().hex[:12]
    devstack.create_bucket(moto_endpoint, bucket)
    env = clean_env(ARTSTORE_URL=f"s3://{bucket}/c", ARTSTORE_INDEX=pg_url,
                    AWS_ENDPOINT_URL_S3=moto_endpoint, **FAKE_AWS)  # fmt: skip
    code, report, verdict = _doctor(env)
    assert code == 1 and report["checks"]["index"]["schema"] == "empty"
    assert report["checks"]["index"]["needs_upgrade"] is True
    assert "run `artstore db upgrade`" in verdict


def test_invalid_configuration_is_a_failed_check(tmp_path: Path) -> None:
    env = clean_env(ARTSTORE_URL=str(tmp_path / "s"))
    code, report, verdict = _doctor(env, "--index", f"mysql://u:{PASSWORD}@h/db")
    assert code == 1 and report["checks"]["config"]["status"] == "fail"
    assert report["checks"]["index"]["status"] == "skip"
    assert "configuration invalid: unsupported index database 'mysql'" in verdict
