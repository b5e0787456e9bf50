"""`artstore doctor` tells the truth (issue 32): each row says what a program here would do.

Real components only: a SQLite file made corrupt with junk, a store directory this user
may not read and a store it may only read (run as a user the file system binds:
tests/otheruser.py, since tests run as root), PostgreSQL logins without grants or
without their namespace, a server that does not answer. Every run checks that doctor
never aborts, that its exit code says whether programs would use the store as
configured (0 yes, 1 no or degraded), and that its output fits 100 columns.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import devstack
import pytest
from conftest import TEAM_KEY, artstore, clean_env
from otheruser import OtherUser, python_user
from sqlalchemy.engine import make_url
from test_doctor import human_verdict

POLICIES = Path(__file__).resolve().parents[1] / "infra" / "policies"


def _check_run(proc: subprocess.CompletedProcess[str]) -> None:
    """Never an abort: no traceback, no `artstore: error:`, output within 100 columns."""
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    assert "artstore: error" not in proc.stderr, proc.stderr
    assert proc.returncode in (0, 1), proc.stderr


def _doctor(env: dict[str, str], user: OtherUser | None = None) -> tuple[int, dict[str, Any], str]:
    """(exit code, the --json report, the human verdict), both runs agreeing."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        if user is None:
            return artstore("doctor", *args, env=env)
        return user.run([sys.executable, "-m", "artifactstore", "doctor", *args], env=env)

    as_json, human = run("--json"), run()
    for proc in (as_json, human):
        _check_run(proc)
    assert as_json.returncode == human.returncode
    verdict = human_verdict(human.stdout)  # checks the width too
    report = json.loads(as_json.stdout)
    assert report["ok"] is (as_json.returncode == 0)
    return as_json.returncode, report, verdict


def _one_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


# -- a corrupt SQLite index ------------------------------------------------------------
def test_corrupt_sqlite_is_corrupt_and_db_rebuild_fixes_it(store_env: dict[str, str]) -> None:
    assert artstore("db", "upgrade", env=store_env).returncode == 0
    index = Path(store_env["ARTSTORE_URL"]) / "index.db"
    for extra in ("-wal", "-shm"):
        Path(f"{index}{extra}").unlink(missing_ok=True)
    index.write_bytes(b"this is not a database " * 400)

    code, report, verdict = _doctor(store_env)
    row = report["checks"]["index"]
    # Programs load (manifests, the store's own directory: test_doctor_setups) and store nothing.
    assert code == 1 and report["used"] == "read-only"
    assert row["status"] == "fail" and row["kind"] == "corrupt"
    assert "corrupt" in verdict and "`artstore db rebuild`" in verdict
    for wrong in ("unreachable", "database server"):
        assert wrong not in verdict
    for command in (["ls"], ["stats"], ["gc", "--dry-run"], ["db", "check"]):
        proc = artstore(*command, env=store_env)
        text = proc.stdout + proc.stderr
        assert proc.returncode == 1 and "Traceback" not in text, text
        assert "corrupt" in text and "`artstore db rebuild`" in text, command
        assert "database server" not in text and "unreachable" not in text, command

    assert artstore("db", "rebuild", env=store_env).returncode == 0
    code, report, _ = _doctor(store_env)
    assert code == 0 and report["used"] == "read-write"


# -- permissions: a store this user may not read, and one it may only read -------------
@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory every user may reach (pytest's tmp_path is under a mode-700 one)."""
    base = Path(tempfile.mkdtemp(prefix="artstore-doctor-"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        for path in [base, *base.rglob("*")]:
            if path.is_dir() and not path.is_symlink():
                path.chmod(0o755)
        shutil.rmtree(base, ignore_errors=True)


def _user_env(base: Path, user: OtherUser, **extra: str) -> dict[str, str]:
    cache = base / f"cache-{uuid.uuid4().hex[:6]}"
    cache.mkdir(mode=0o755)
    os.chown(cache, user.uid, user.uid)
    return clean_env(XDG_CACHE_HOME=str(cache), HOME=str(cache),
                     PYTHONDONTWRITEBYTECODE="1", **extra)  # fmt: skip


def _made_store(base: Path) -> Path:
    store = base / "store"
    env = clean_env(ARTSTORE_URL=str(store), ARTSTORE_GROUP_READABLE="1")
    assert artstore("db", "upgrade", env=env).returncode == 0
    (store / "default").mkdir(exist_ok=True)
    return store


def test_unreadable_store_directory_is_a_row_not_an_abort(shared: Path) -> None:
    user = python_user()
    store = _made_store(shared)
    store.chmod(0o000)
    env = _user_env(shared, user, ARTSTORE_URL=str(store))

    code, report, verdict = _doctor(env, user)
    checks = report["checks"]
    assert code == 1 and report["used"] == "no"
    assert checks["object_store"]["status"] == "fail"
    assert "permission denied" in checks["object_store"]["detail"]
    assert checks["index"]["status"] == "fail" and checks["index"]["kind"] == "permission"
    assert "permission denied" in verdict and f"`chmod -R a+rX {store}`" in verdict
    assert "unreachable" not in verdict and "corrupt" not in verdict

    line = _one_line(user.run([sys.executable, "-m", "artifactstore", "ls"], env=env))
    assert "permission denied" in line and "chmod" in line and "PermissionError" not in line


def _read_only_tree(root: Path) -> None:
    for path in sorted(root.rglob("*"), reverse=True):
        path.chmod(0o555 if path.is_dir() else 0o444)
    root.chmod(0o555)


def test_read_only_store_is_used_read_only(shared: Path) -> None:
    user = python_user()
    store = _made_store(shared)
    # A store, not an empty directory: its identity, as its first writer makes it (a reader
    # of a namespace that never held an entry loads nothing, and is told so).
    bound = artstore(
        "db", "bind", env=clean_env(ARTSTORE_URL=str(store), ARTSTORE_GROUP_READABLE="1")
    )
    assert bound.returncode == 0, bound.stderr
    _read_only_tree(store)

    env = _user_env(shared, user, ARTSTORE_URL=str(store))
    code, report, verdict = _doctor(env, user)
    checks = report["checks"]
    assert code == 1, verdict  # used, but not as configured: every write refused
    assert report["used"] == "read-only"
    assert checks["object_store"]["status"] == "warn" and checks["index"]["status"] == "ok"
    access = checks["access"]
    assert access["status"] == "warn" and access["degrades"] is True
    assert access["loads"] is True and access["stores"] is False
    assert "every write is refused" in verdict and "ARTSTORE_READ_ONLY=1" in verdict
    assert "not used" not in verdict

    reader = _user_env(shared, user, ARTSTORE_URL=str(store), ARTSTORE_READ_ONLY="1")
    code, report, verdict = _doctor(reader, user)
    assert code == 0 and report["used"] == "read-only", verdict
    assert report["checks"]["access"]["status"] == "ok"
    assert verdict.endswith("(read-only)")


# -- PostgreSQL: unreachable, a login without grants, a namespace never granted ---------
def test_unreachable_postgres_names_the_server_not_rebuild(tmp_path: Path) -> None:
    env = clean_env(ARTSTORE_URL=str(tmp_path / "s"), ARTSTORE_TIMEOUT="2",
                    ARTSTORE_INDEX="postgresql+psycopg://postgres@127.0.0.1:9/x")  # fmt: skip
    code, report, verdict = _doctor(env)
    assert code == 1 and report["checks"]["index"]["kind"] == "unreachable"
    assert "`pg_isready -h 127.0.0.1 -p 9`" in verdict and "rebuild" not in verdict

    check = artstore("db", "check", env=env)
    assert check.returncode == 1 and "Traceback" not in check.stderr
    assert "does not answer" in check.stdout and "pg_isready" in check.stdout
    assert "db rebuild" not in check.stdout + check.stderr
    line = _one_line(artstore("stats", env=env))
    assert "does not answer" in line and "pg_isready" in line


def _psql(dbname: str, *args: str) -> None:
    proc = subprocess.run(
        ["psql", "-X", "-q", "-h", devstack.HOST, "-p", str(devstack.PG_PORT), "-U", "postgres",
         "-v", "ON_ERROR_STOP=1", "-d", dbname, *args],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr


@pytest.fixture
def login(pg_url: str) -> Iterator[str]:
    """A login of its own (roles are cluster-wide: dropped at the end, with its namespace's)."""
    name = "artstore_tdoc_" + uuid.uuid4().hex[:10]
    _psql("postgres", "-c", f'CREATE ROLE "{name}" LOGIN')
    try:
        yield name
    finally:
        devstack.drop_database(str(make_url(pg_url).database))
        devstack.drop_roles(name, f"artstore_ns_{name}")


def _as(pg_url: str, login: str) -> str:
    return make_url(pg_url).set(username=login).render_as_string(hide_password=False)


def test_login_without_grants_is_told_which_grant(pg_url: str, login: str, tmp_path: Path) -> None:
    admin = clean_env(ARTSTORE_URL=str(tmp_path / "s"), ARTSTORE_INDEX=pg_url)
    assert artstore("db", "upgrade", env=admin).returncode == 0
    env = dict(admin, ARTSTORE_INDEX=_as(pg_url, login))

    code, report, verdict = _doctor(env)
    assert code == 1 and report["checks"]["index"]["kind"] == "missing_grant"
    assert f"role {login} lacks SELECT" in verdict and "postgres-roles.sql`" in verdict
    line = _one_line(artstore("ls", env=env))  # a read: never "use a role that may"
    assert f"role {login} lacks SELECT on table" in line and "refused this read" in line
    assert "postgres-roles.sql" in line and "use a role that may" not in line


def test_writer_whose_namespace_was_never_granted(pg_url: str, login: str, tmp_path: Path) -> None:
    admin = clean_env(ARTSTORE_URL=str(tmp_path / "s"), ARTSTORE_INDEX=pg_url)
    assert artstore("db", "upgrade", env=admin).returncode == 0
    database = str(make_url(pg_url).database)
    _psql(database, "-f", str(POLICIES / "postgres-roles.sql"))
    _psql(database, "-c", f'GRANT artstore_writer TO "{login}"')
    ns = login  # a namespace of its own: granted to nobody else
    env = dict(admin, ARTSTORE_INDEX=_as(pg_url, login), ARTSTORE_NAMESPACE=ns)

    code, report, verdict = _doctor(env)
    access = report["checks"]["access"]
    assert code == 1 and report["used"] == "read-only", verdict
    assert access["status"] == "warn" and access["degrades"] is True
    assert f"role {login} is not granted namespace {ns}" in verdict
    assert "every write is refused" in verdict
    assert f"-v namespace={ns} -v role={login} -f infra/policies/grant-namespace.sql" in verdict

    _psql(database, "-v", f"namespace={ns}", "-v", f"role={login}",
          "-f", str(POLICIES / "grant-namespace.sql"))  # fmt: skip
    code, report, verdict = _doctor(env)
    assert code == 0 and report["used"] == "read-write", verdict
    assert report["checks"]["access"]["detail"] == f"loads and stores entries of namespace {ns}"


# -- trust mode ------------------------------------------------------------------------
def test_trust_mode_says_which_keys_and_whether_required(store_env: dict[str, str]) -> None:
    nothing = dict(store_env, ARTSTORE_REQUIRE_SIGNATURES="1")
    code, report, verdict = _doctor(nothing)
    signing = report["checks"]["signing"]
    assert code == 1 and signing["degrades"] is True, verdict  # loads nothing: degraded
    assert signing["require_signatures"] is True and signing["trusted_keys"] == []
    assert "loads nothing" in verdict and "`artstore keygen`" in verdict

    signed = dict(nothing, ARTSTORE_SIGNING_KEY=str(TEAM_KEY))
    code, report, verdict = _doctor(signed)
    signing = report["checks"]["signing"]
    assert code == 0 and signing["status"] == "ok", verdict
    assert signing["signing_key"] == "team-tests" and signing["trusted_keys"] == ["team-tests"]
    assert "signatures required: loads only entries signed by team-tests" in signing["detail"]

    code, report, _ = _doctor(store_env)  # a directory store: signatures not required
    assert code == 0 and report["checks"]["signing"]["trusted_keys"] is None
    assert "signatures not required" in report["checks"]["signing"]["detail"]
