"""Shared fixtures: fresh stores, and running JAX programs in fresh processes."""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import forks
import pytest

from artifactstore import config
from artifactstore.config import keyfiles
from artifactstore.store import Store

REPO = Path(__file__).resolve().parents[1]
PROGRAMS = Path(__file__).resolve().parent / "programs"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
# The user cache directory of every process the tests start (local tiers of
# team stores live there): never the real one of whoever runs the tests.
TEST_CACHE = Path(tempfile.mkdtemp(prefix="artstore-tests-cache-"))
atexit.register(shutil.rmtree, TEST_CACHE, ignore_errors=True)
os.environ["XDG_CACHE_HOME"] = str(TEST_CACHE)  # and this process's, for open_tier()
# A developer's ARTSTORE_URL must not activate a store in the test process when it imports
# JAX (artifactstore_startup reads this again then): tests configure stores themselves.
os.environ["ARTSTORE_ACTIVATE"] = "0"


# The writer key of every team store the tests make: team stores require signatures by
# default, and a process trusts its own key, so a test's writers and readers share it
# (tests of trust itself set ARTSTORE_SIGNING_KEY / ARTSTORE_TRUSTED_KEYS over it).
TEAM_KEY, TEAM_PUB = keyfiles.generate("team-tests", TEST_CACHE)
TEAM_SIGNING = {"ARTSTORE_SIGNING_KEY": str(TEAM_KEY)}


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment without any ARTSTORE_* setting, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARTSTORE_")}
    env["JAX_PLATFORMS"] = "cpu"
    env["XDG_CACHE_HOME"] = str(TEST_CACHE)
    env["ARTSTORE_MIN_COMPILE_SECS"] = "0"
    # Test programs configure the store themselves (or, with JOB_NO_STORE, not at all):
    # ARTSTORE_URL alone would activate it in them (artifactstore_startup) unless this.
    env["ARTSTORE_ACTIVATE"] = "0"
    env.update(extra)
    return env


forks.BASE = clean_env()  # what the fork servers start with


# The programs run_program and start_program fork (tests/forks.py): they import JAX first,
# and only then, configured by their environment, the store.
FORKED = ("job.py", "named_job.py", "callbacks.py", "metrics_job.py", "named_rollback.py",
          "plain_jax.py")  # fmt: skip


def run_program(
    name: str,
    env: dict[str, str],
    *,
    check: bool = True,
    timeout: float = 300,
    under_run: bool = False,
) -> dict[str, Any]:
    """Run tests/programs/NAME in a process of its own (under `artstore run` if `under_run`;
    FORKED ones forked from one that imported JAX: tests/forks.py); its last stdout line
    as JSON."""
    if under_run:
        cmd = ["run", "--", sys.executable, str(PROGRAMS / name)]
        proc = forks.run("cli", forks.CLI, cmd, env, timeout, fresh=True)
    else:
        proc = program(name, env, timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    lines = proc.stdout.strip().splitlines()
    out: dict[str, Any] = json.loads(lines[-1]) if lines else {}
    out["_stderr"] = proc.stderr
    out["_returncode"] = proc.returncode
    return out


def program(
    name: str, env: dict[str, str], timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """tests/programs/NAME run to its end, its output captured (forked if in FORKED)."""
    target, fresh = _program_target(name)
    return forks.run("jax", target, [], env, timeout, fresh=fresh)


def _program_target(name: str) -> tuple[dict[str, str], bool]:
    """tests/programs/NAME as forks' target, and whether it needs a fresh interpreter."""
    return {"path": str(PROGRAMS / name)}, name not in FORKED


def skip_unless_importable(
    modules: Sequence[str], install: str, env: dict[str, str] | None = None
) -> None:
    """Skip unless `modules` are installed and import together in a fresh interpreter
    (with `env` added): installed is not enough (torchax 0.0.13 fails at import beside
    torch 2.13). `install`: the pip command that installs them."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not installed ({install})")
    probe = subprocess.run(
        [sys.executable, "-c", "import " + ", ".join(modules)],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        pytest.skip(f"{' and '.join(modules)} do not import here: {last}")


JobResults = Callable[[str], list[str]]


@pytest.fixture(scope="session")
def job_results() -> JobResults:
    """What tests/programs/job.py computes without a store, per JOB_VARIANT ("0" unless said):
    what every run through a store must give too. Each variant runs once per test process."""
    computed: dict[str, list[str]] = {}

    def results(variant: str = "0") -> list[str]:
        if variant not in computed:
            env = clean_env(JOB_NO_STORE="1", JOB_VARIANT=variant)
            computed[variant] = run_program("job.py", env)["results"]
        return computed[variant]

    return results


def start_program(name: str, env: dict[str, str], *, stdin: int | None = None) -> forks.Process:
    """Start tests/programs/NAME with its stdout and stderr piped (as text), as Popen would
    (FORKED ones forked, as run_program does)."""
    target, fresh = _program_target(name)
    pipe = subprocess.PIPE
    return forks.popen(
        "jax",
        target,
        [],
        env,
        fresh=fresh,
        stdin=stdin,
        stdout=pipe,
        stderr=pipe,
    )


def artstore(
    *args: str,
    env: dict[str, str] | None = None,
    input: str | None = None,
    cwd: Path | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """Run the CLI as a user would, without a terminal (`input` its stdin, else none), in a
    process of its own (forked from one that imported what it imports: tests/forks.py)."""
    env = env or clean_env()
    return forks.run("cli", forks.CLI, list(args), env, timeout, input=input, cwd=cwd)


def artstore_warm(
    *args: str, env: dict[str, str], tmp_path: Path
) -> tuple[int, dict[str, Any], str]:
    """`artstore warm --report-json FILE ARGS` run from tests/programs (MODULE is found as
    `python -m` finds it): exit code, the report (empty if none), stdout + stderr."""
    report = tmp_path / f"report-{len(list(tmp_path.glob('report-*')))}.json"
    proc = artstore("warm", "--report-json", str(report), *args, env=env, cwd=PROGRAMS, timeout=600)
    assert "Traceback" not in proc.stderr, proc.stderr
    data = json.loads(report.read_text()) if report.exists() else {}
    return proc.returncode, data, proc.stdout + proc.stderr


# `artstore warm MODULE:FUNCTION`'s line per specialization ("warming: 3/5 compiled ..."):
# its log of results, on stderr off a terminal too. Progress of the other long commands
# shows only on a terminal (cli/progress.py), so their stderr off one is only what they say.
WARM_LINE = re.compile(r"warming: \d")


def without_warm_lines(stderr: str) -> str:
    """`stderr` of `artstore warm` less its result lines: what a failure's "one line"
    checks look at."""
    return "".join(line for line in stderr.splitlines(True) if not WARM_LINE.match(line))


@pytest.fixture
def store_env(tmp_path: Path) -> dict[str, str]:
    """Environment for a fresh embedded store (local directory + SQLite) in tmp_path."""
    return clean_env(ARTSTORE_URL=str(tmp_path / "store"))


@pytest.fixture
def cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    return artstore


# -- team store: a moto S3 server over HTTP and the real PostgreSQL ----------
sys.path.insert(0, str(REPO / "infra"))
import devstack  # noqa: E402

FAKE_AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing-secret-never-logged",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "NO_PROXY": "127.0.0.1,localhost",
}


def s3_client(env: dict[str, str]) -> Any:
    """boto3's S3 client on a test environment's S3 server (AWS_ENDPOINT_URL_S3) with its
    credentials (the tests' fake ones for moto): a test's own view of a bucket, around the
    store (to list, plant or damage what is there, as anyone who may write the bucket could)."""
    import boto3  # only the tests that reach the bucket directly pay for the import

    aws = {**FAKE_AWS, **{k: v for k, v in env.items() if k in FAKE_AWS}}
    return boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL_S3"],
        aws_access_key_id=aws["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=aws["AWS_SECRET_ACCESS_KEY"],
        region_name=aws["AWS_DEFAULT_REGION"],
        verify=env.get("AWS_CA_BUNDLE"),  # an HTTPS server's own certificate (RGW's)
    )


def bucket_of(env: dict[str, str]) -> tuple[str, str]:
    """The bucket and the prefix of a team store's ARTSTORE_URL (s3://BUCKET/PREFIX)."""
    bucket, _, prefix = env["ARTSTORE_URL"].removeprefix("s3://").partition("/")
    return bucket, prefix


def _unavailable(what: str, exc: BaseException) -> None:
    message = f"{what} unavailable: {exc}"
    if IN_CI:
        pytest.fail(message)  # CI must run these tests, never skip them
    pytest.skip(message)


def old_client(commit: str, root: Path, *paths: str) -> Path:
    """This repository's `paths` as they were at `commit`, extracted under `root`: an earlier
    client, for the tests that old and new clients share a store (or read a record) during
    a rollout. Its absence (a shallow clone) fails in CI and skips elsewhere."""
    try:
        git = ["git", "-C", str(REPO), "archive", commit, *paths]
        archive = subprocess.run(git, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(root)], input=archive.stdout, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        _unavailable(f"client {commit} (not in this checkout's history)", exc)
    return root


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    try:
        server = devstack.start_moto()
    except Exception as exc:
        _unavailable("moto server", exc)
    try:
        yield server.endpoint
    finally:
        server.stop()


# A test's database is dropped behind it, in a thread: DROP DATABASE waits for a checkpoint
# (0.2-2.4 s each, measured on 2 busy cores), which the next test need not wait for.
_DROPPER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="drop-database")
_DROPPING: list[Future[None]] = []


def drop_later(name: str) -> None:
    """Drop database `name` in the background; the session ends once all are dropped."""
    _DROPPING.append(_DROPPER.submit(devstack.drop_database, name))


@pytest.fixture(scope="session")
def postgres() -> Iterator[None]:
    try:
        devstack.ensure_postgres()
    except Exception as exc:
        _unavailable("PostgreSQL", exc)
    yield
    for dropping in _DROPPING:  # the tests' databases are gone (or the first error is raised)
        dropping.result()


@pytest.fixture
def pg_url(postgres: None, request: pytest.FixtureRequest) -> Iterator[str]:
    name = "artstore_t_" + uuid.uuid4().hex[:12]
    url = devstack.create_database(name)
    try:
        yield url
    finally:
        drop_later(name)


def _team(moto_endpoint: str, index_url: str) -> dict[str, str]:
    bucket = "artstore-" + uuid.uuid4().hex[:12]
    devstack.create_bucket(moto_endpoint, bucket)
    return clean_env(
        ARTSTORE_URL=f"s3://{bucket}/cache",
        ARTSTORE_INDEX=index_url,
        AWS_ENDPOINT_URL_S3=moto_endpoint,
        **FAKE_AWS,
        **TEAM_SIGNING,
    )


@pytest.fixture(scope="session")
def migrated_template(moto_endpoint: str, postgres: None) -> Iterator[str]:
    """A database with the schema applied once by `artstore db upgrade`, as an operator
    would; each team store copies it (CREATE DATABASE ... TEMPLATE) instead of
    migrating again (a second per test; test_rollout and the migration tests migrate)."""
    name = "artstore_tmpl_" + uuid.uuid4().hex[:12]
    up = artstore("db", "upgrade", env=_team(moto_endpoint, devstack.create_database(name)))
    assert up.returncode == 0, up.stderr
    try:
        yield name
    finally:
        drop_later(name)


@pytest.fixture
def team_env(moto_endpoint: str, migrated_template: str) -> Iterator[dict[str, str]]:
    """A fresh bucket and a fresh database at the newest schema."""
    name = "artstore_t_" + uuid.uuid4().hex[:12]
    url = devstack.create_database(name, template=migrated_template)
    try:
        yield _team(moto_endpoint, url)
    finally:
        drop_later(name)


@pytest.fixture(params=["embedded", "team"])
def any_env(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    """Both deployments: local directory + SQLite, and moto S3 + PostgreSQL."""
    if request.param == "embedded":
        return clean_env(ARTSTORE_URL=str(tmp_path / "store"))
    env: dict[str, str] = request.getfixturevalue("team_env")
    return env


OpenStore = Callable[..., Store]


@pytest.fixture
def open_store(monkeypatch: pytest.MonkeyPatch) -> Iterator[OpenStore]:
    """Open a Store in this process on a test environment (AWS settings for boto3 too)."""
    opened: list[Store] = []

    def _open(env: dict[str, str], *, lazy_index: bool = False, **overrides: Any) -> Store:
        """`lazy_index`: as a program's session opens it (the index on first use)."""
        for name, value in env.items():
            if name.startswith("AWS_") or name == "NO_PROXY":
                monkeypatch.setenv(name, value)
        store = Store.open(config.resolve(overrides, environ=env), lazy_index=lazy_index)
        opened.append(store)
        return store

    yield _open
    for store in opened:
        store.close()


# In CI a skipped security test fails; the hostile_record marker (tests/security/ci_rules.py).
# SIGTERM tears the session down as Ctrl-C does (tests/session_signals.py); with no path
# named, the quick subset runs unless --full (tests/quick_subset.py).
# pytester: tests of these rules run a pytest of their own (tests/test_ci_rules.py).
# The S3 servers, moto and Ceph's RADOS Gateway (tests/s3servers.py).
pytest_plugins = ["security.ci_rules", "session_signals", "quick_subset", "pytester", "s3servers"]

# How CI splits the suite (JAX tests on both ends, timing tests serial) and the 15 s rule:
# tests/suite_rules.py.
from suite_rules import (  # noqa: E402
    pytest_addoption,
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_runtest_makereport,
    pytest_runtest_protocol,
    pytest_terminal_summary,
    pytest_unconfigure,
)

__all__ = [
    "pytest_addoption",
    "pytest_collection_modifyitems",
    "pytest_configure",
    "pytest_runtest_makereport",
    "pytest_runtest_protocol",
    "pytest_terminal_summary",
    "pytest_unconfigure",
]
