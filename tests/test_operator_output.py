"""What an operator reads (issue 39, item 8): each hint names the real fix, a closed pipe
is no failure, and counts and sizes read as they were meant. The CLI runs in fresh
processes, as a person runs it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import boto3
import pytest
from conftest import FAKE_AWS, REPO, OpenStore, artstore, clean_env, devstack
from otheruser import python_user

from artifactstore.blobstores.s3 import S3BlobStore
from artifactstore.config import host
from artifactstore.errors import StoreUnavailable
from artifactstore.formats.put import Put
from artifactstore.formats.sizes import format_limit, format_size, parse_size
from artifactstore.store import Store


@pytest.mark.parametrize("args", [["stats"], ["ls"], ["stats", "--json"], ["gc", "--dry-run"]])
def test_a_closed_pipe_ends_quietly(args: list[str], tmp_path: Path) -> None:
    """`artstore stats | head`: the reader went away before the command wrote; measured
    before: `artstore: error: BrokenPipeError`, exit 1 (or a traceback at exit)."""
    env = clean_env(ARTSTORE_URL=str(tmp_path / "store"))
    assert artstore("stats", env=env).returncode == 0  # the store exists
    command = [sys.executable, "-m", "artifactstore", *args]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first line is written
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, stderr
    assert stderr == ""


FACTS = {"platform_name": "cpu", "platform_version": "v", "device_kind": "cpu-output"}
FP = host.compute(**FACTS, device_count=1, jax_version="1", jaxlib_version="1")


def _fill(store: Store, n: int) -> int:
    """n entries of incompressible bytes; the bytes their objects hold."""
    for i in range(n):
        key = f"{i:064x}"
        data = os.urandom(3000)
        assert store.put(Put(key, data, FP, f"jit_o{i}", 1.0))
    return store.parts.index.stats().bytes


def test_gc_says_what_waits_for_the_grace_period(
    store_env: dict[str, str], open_store: OpenStore
) -> None:
    """Measured before: "removed 3 entries (...) and 0 objects (0 B freed); 0 B remaining"
    with no word of the objects the grace period keeps, nor of what "remaining" counts."""
    held = _fill(open_store(store_env), 3)
    proc = artstore("gc", "--max-size", "0", env=store_env)  # the default grace: 1 h
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("namespace default: removed 3 entries ("), lines
    assert lines[0].endswith("and 0 objects (0 B freed)"), lines
    waiting = re.fullmatch(
        rf"  3 objects \({re.escape(format_size(held))}\) no longer referenced kept for the "
        r"grace period \(1\.0 h\): a gc from (\S+ \S+) UTC deletes them",
        lines[1],
    )
    assert waiting is not None, lines
    due = datetime.strptime(waiting.group(1), "%Y-%m-%d %H:%M").replace(tzinfo=UTC)
    assert timedelta(minutes=50) < due - datetime.now(UTC) <= timedelta(minutes=61), due
    assert lines[2] == "  the entries left reference 0 B of objects (limit 0 B)", lines
    summary = json.loads(artstore("gc", "--max-size", "0", "--json", env=store_env).stdout)
    assert summary["summary"]["objects_waiting"] == 3, summary
    assert summary["summary"]["objects_waiting_until"] is not None
    done = artstore("gc", "--grace", "0s", env=store_env)  # the grace is over: they go
    assert done.stdout.splitlines()[0].endswith(f"and 3 objects ({format_size(held)} freed)")
    assert "grace period" not in done.stdout, done.stdout


def test_counts_agree_with_their_nouns(store_env: dict[str, str], open_store: OpenStore) -> None:
    """Measured before: "removed 1 entries, 1 objects"."""
    _fill(open_store(store_env), 2)
    proc = artstore("rm", f"{0:064x}", env=store_env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("removed 1 entry, 1 object ("), proc.stdout
    gc = artstore("gc", "--max-size", "0", "--grace", "0s", env=store_env)
    assert gc.stdout.startswith("namespace default: removed 1 entry ("), gc.stdout
    assert "and 1 object (" in gc.stdout.splitlines()[0], gc.stdout


BOUNDS = {
    "10G": "10 GB",
    "1.5TiB": "1.5 TiB",
    "500G": "500 GB",
    "800MB": "800 MB",
    "1024": "1 KiB",
    "0": "0 B",
    "12345": "12.1 KiB",
}  # the last: not round, as measured


@pytest.mark.parametrize(("given", "shown"), BOUNDS.items())
def test_a_bound_shows_as_it_was_given(given: str, shown: str) -> None:
    """What is shown parses back to the bound (but for a size not round in either system)."""
    assert format_limit(parse_size(given)) == shown
    assert parse_size(shown.replace(" ", "")) == parse_size(given) or given == "12345"


def test_the_default_tier_bound_and_a_quota_read_as_given(tmp_path: Path) -> None:
    """Measured before: doctor showed the default bound `10G` as "9.3 GiB"."""
    nowhere = "http://127.0.0.1:9"  # a team store, down: doctor still shows the tier
    env = clean_env(
        ARTSTORE_URL="s3://nowhere/c",
        ARTSTORE_INDEX="postgresql+psycopg://u@" + nowhere.removeprefix("http://") + "/db",
        ARTSTORE_TIMEOUT="1",
        AWS_ENDPOINT_URL_S3=nowhere,
        **FAKE_AWS,
    )
    doctor = artstore("doctor", "--no-device", env=env)
    assert "bound 10 GB)" in doctor.stdout, doctor.stdout
    local = clean_env(ARTSTORE_URL=str(tmp_path / "store"))
    quota = artstore("quota", "set", "default", "500G", env=local)
    assert quota.stdout == "quota of default: 500 GB (500000000000 bytes)\n", quota.stderr
    assert "500 GB" in artstore("quota", "ls", env=local).stdout


# -- S3 credentials: a wrong secret key names the secret, never the key id ------------------
WRONG_SECRET = "wrong-secret-never-shown-4d1c"


@pytest.fixture(scope="module")
def iam_key() -> Iterator[tuple[str, str]]:
    """A moto server that checks signatures, and (its endpoint, an access key id it knows):
    its first two calls go unauthenticated, which make the user and the key."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("INITIAL_NO_AUTH_ACTION_COUNT", "2")
        server = devstack.start_moto()
    try:
        fake = {"aws_access_key_id": "a", "aws_secret_access_key": "b", "region_name": "us-east-1"}
        iam = boto3.client("iam", endpoint_url=server.endpoint, **fake)
        iam.create_user(UserName="operator")
        key = iam.create_access_key(UserName="operator")["AccessKey"]["AccessKeyId"]
        yield server.endpoint, str(key)
    finally:
        server.stop()


@pytest.mark.parametrize("source", ["env", "profile"])
def test_a_wrong_secret_key_names_the_secret(
    source: str, iam_key: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Measured before: "S3 credentials rejected ... check AWS_ACCESS_KEY_ID/AWS_PROFILE"
    for a known key id signed with a wrong secret."""
    endpoint, key_id = iam_key
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    if source == "env":
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", WRONG_SECRET)
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
        where = "check AWS_SECRET_ACCESS_KEY (the credentials come from the environment)"
    else:
        credentials = tmp_path / "credentials"
        credentials.write_text(
            f"[ops]\naws_access_key_id = {key_id}\naws_secret_access_key = {WRONG_SECRET}\n"
        )
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
        monkeypatch.setenv("AWS_PROFILE", "ops")
        where = "check aws_secret_access_key of profile 'ops' in the shared credentials file"
    store = S3BlobStore("bucket", "c", "default", endpoint, 10.0)
    with pytest.raises(StoreUnavailable) as info:
        store.check()
    line = str(info.value)
    assert "(SignatureDoesNotMatch): the secret key does not match the access key id" in line
    assert where in line and "AWS_ACCESS_KEY_ID" not in line, line
    assert WRONG_SECRET not in line and key_id not in line


# -- infra/devstack.py: the database is the developer's to name ------------------------------
@pytest.mark.parametrize("how", ["argument", "environment"])
def test_devstack_database_can_be_named(how: str, tmp_path: Path, postgres: None) -> None:
    """Measured before: `up` always made `artstore_dev` (two checkouts shared, and each `up`
    dropped, one database); `env` and `down --drop-database` use the one `up` made."""
    name = f"artstore_devtest_{uuid.uuid4().hex[:10]}"
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = clean_env(XDG_RUNTIME_DIR=str(runtime))
    up_args = ["--database", name] if how == "argument" else []
    if how == "environment":
        env["DEVSTACK_DATABASE"] = name

    def devstack_cli(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, str(REPO / "infra" / "devstack.py"), *args]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)

    try:
        up = devstack_cli("up", *up_args)
        assert up.returncode == 0, up.stderr
        index = f"export ARTSTORE_INDEX={devstack.database_url(name)}"
        assert index in up.stdout.splitlines(), up.stdout
        assert f"database {name}" in up.stderr
        assert index in devstack_cli("env").stdout.splitlines()
        assert _database_exists(name)
        env.pop("DEVSTACK_DATABASE", None)  # `down` drops the one `up` made
        down = devstack_cli("down", "--drop-database")
        assert down.returncode == 0 and f"dropped database {name}" in down.stderr, down.stderr
        assert not _database_exists(name)
    finally:
        devstack_cli("down")
        devstack.drop_database(name)


def _database_exists(name: str) -> bool:
    server = ["-h", devstack.HOST, "-p", str(devstack.PG_PORT), "-U", "postgres", "-d", "postgres"]
    query = f"SELECT 1 FROM pg_database WHERE datname = '{name}'"
    command = ["psql", "-X", "-tA", *server, "-c", query]
    proc = subprocess.run(command, capture_output=True, text=True, check=True, timeout=60)
    return proc.stdout.strip() == "1"


# -- a store directory this user may not create -----------------------------------------------
@pytest.mark.parametrize("depth", [["store"], ["a", "b", "store"]])
def test_a_store_it_cannot_create_names_the_directory_that_exists(depth: list[str]) -> None:
    """Measured before: "permission denied: store may not be read ...: `chmod -R a+rX store`",
    a directory that does not exist (and a relative name at that)."""
    user = python_user()  # obeys file permissions (tests run as root)
    scratch = Path(tempfile.mkdtemp(prefix="artstore-locked-"))
    try:
        scratch.chmod(0o755)
        locked = scratch / "locked"
        locked.mkdir(mode=0o555)  # root's, and nobody may write it
        store = locked.joinpath(*depth)
        env = clean_env(ARTSTORE_URL=str(store), XDG_CACHE_HOME=str(scratch / "cache"))
        proc = user.run([sys.executable, "-m", "artifactstore", "ls"], env=env)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        lines = proc.stderr.splitlines()
        assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert f"cannot create {store}: {locked}, the nearest directory that exists" in lines[0]
        assert f"`mkdir -p {store}`" in lines[0] and "chmod" not in lines[0], lines[0]
        assert not (locked / depth[0]).exists()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# -- db check: the index and the object store must be one store ------------------------------
def test_db_check_fails_an_index_paired_with_another_bucket(
    tmp_path: Path, open_store: OpenStore
) -> None:
    """Measured before: `db check` said ok for the real index over a mistyped (empty)
    object store, the pairing on which gc would drop every entry as lost."""
    real = clean_env(ARTSTORE_URL=str(tmp_path / "store"))
    _fill(open_store(real), 2)  # the first writer binds the pair
    index = f"sqlite:///{tmp_path / 'store' / 'index.db'}"
    good = artstore("db", "check", "--json", env=dict(real, ARTSTORE_INDEX=index))
    assert good.returncode == 0, good.stdout + good.stderr
    assert json.loads(good.stdout)["binding"] == "bound"
    wrong = dict(real, ARTSTORE_URL=str(tmp_path / "mistyped"), ARTSTORE_INDEX=index)
    proc = artstore("db", "check", env=wrong)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL" in proc.stdout and "do not belong together" in proc.stdout, proc.stdout
    assert "artstore db bind --force" in proc.stdout


def test_run_of_a_failing_command_blames_the_command(tmp_path: Path) -> None:
    """Measured before: a command that failed before importing JAX (the docs' example from
    the checkout root) got "another interpreter or virtualenv?", which it was not."""
    env = clean_env(ARTSTORE_URL=str(tmp_path / "store"))
    failing = "import sys; sys.exit('no module named example')"
    proc = artstore("run", "--", sys.executable, "-c", failing, env=env)
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.splitlines()[-1]
    assert "the command exited 1 before any Python process of it imported JAX" in last, last
    assert "another interpreter" not in proc.stderr
