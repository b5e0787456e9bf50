"""Issue 29.8: a store identity binds the object store to its index, and guard rails.

Measured before: `ARTSTORE_URL=s3://<wrong, empty bucket>/... artstore gc --max-size 500G`
removed every entry of the real index ("2 of them had lost their object"), exit 0;
`echo n | artstore rm --all` removed the whole namespace. Each test here failed before
the identity object, the `identities` table, gc's --allow-missing and rm's --yes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from conftest import OpenStore, artstore, clean_env, old_client, s3_client

from artifactstore.config import host
from artifactstore.formats.put import Put
from artifactstore.index import db
from artifactstore.index.identity import bound_id
from artifactstore.store import Store

FP = host.compute(platform_name="cpu", platform_version="v", device_kind="cpu-a",
                  device_count=1, jax_version="1", jaxlib_version="0.9.1")  # fmt: skip
KEYS = [f"{i:02x}" * 32 for i in range(1, 11)]
MISMATCH = "do not belong together"
# The last commit at schema 0004 (before the store identity): the previous client.
SCHEMA_0004_COMMIT = "bfcdfb6395815e3adf64bd674193c3b134fd338d"


def _fill(store: Store, n: int) -> None:
    for i, key in enumerate(KEYS[:n]):
        assert store.put(
            Put(key, os.urandom(600 + i), fingerprint=FP, module_name=f"jit_{i}", compile_secs=1.0)
        )


def _entries(store: Store) -> int:
    return store.parts.index.stats().entries


def _team(env: dict[str, str]) -> bool:
    return env["ARTSTORE_URL"].startswith("s3://")


def _wrong_bucket(env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """`env` with ARTSTORE_URL mistyped: another, empty bucket (or directory)."""
    if _team(env):
        bucket = "artstore-wrong-" + uuid.uuid4().hex[:8]
        s3_client(env).create_bucket(Bucket=bucket)
        return {**env, "ARTSTORE_URL": f"s3://{bucket}/cache"}
    (tmp_path / "wrong").mkdir()
    return {**env, "ARTSTORE_URL": str(tmp_path / "wrong")}


def _with_index(env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """The embedded store keeps its index inside the directory; name it explicitly, so
    that a mistyped directory still finds the real index (as a team's does)."""
    if _team(env):
        return env
    return {**env, "ARTSTORE_INDEX": f"sqlite:///{tmp_path / 'index.db'}"}


def _identity_object(env: dict[str, str], namespace: str = "default") -> bytes | None:
    url = env["ARTSTORE_URL"]
    if url.startswith("s3://"):
        bucket, prefix = url.removeprefix("s3://").split("/", 1)
        try:
            body: bytes = (
                s3_client(env)
                .get_object(Bucket=bucket, Key=f"{prefix}/{namespace}/identity")["Body"]
                .read()
            )
        except s3_client(env).exceptions.NoSuchKey:
            return None
        return body
    path = Path(url) / namespace / "identity"
    return path.read_bytes() if path.exists() else None


def _delete_objects(store: Store, digests: list[str]) -> None:
    """Delete objects by hand, behind the store's back, as an operator might."""
    for digest in digests:
        assert store.parts.blobs.delete(digest)


def _one_line_refusal(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


# -- the measured case: a wrong, empty bucket in front of the real index -------------
def test_gc_on_a_wrong_empty_bucket_refuses_and_leaves_the_index(
    any_env: dict[str, str], tmp_path: Path, open_store: OpenStore
) -> None:
    env = _with_index(any_env, tmp_path)
    store = open_store(env)
    _fill(store, 2)
    assert _identity_object(env) is not None  # the first writer made it
    wrong = _wrong_bucket(env, tmp_path)
    gc = artstore("gc", "--max-size", "500G", env=wrong)
    bucket_shown = wrong["ARTSTORE_URL"].rstrip("/")
    _one_line_refusal(gc, MISMATCH, bucket_shown, "artstore db bind")
    index_shown = env.get("ARTSTORE_INDEX", "")
    if "@" in index_shown:  # a password would be redacted; the host and database shown
        index_shown = index_shown.rsplit("@", 1)[1]
    assert index_shown in gc.stderr
    assert _entries(store) == 2
    assert _identity_object(wrong) is None  # nothing written into the wrong bucket
    # The right bucket still works.
    assert artstore("gc", "--max-size", "500G", env=env).returncode == 0
    assert _entries(store) == 2


@pytest.mark.parametrize(
    "command",
    [
        ["gc"],
        ["fold"],
        ["rm", KEYS[0][:12]],
        ["rm", "--all", "--yes"],
        ["sign"],
        ["import", "BUNDLE"],
        ["db", "rebuild"],
        ["verify", "--repair"],
    ],
    ids=lambda c: " ".join(c),
)
def test_each_destructive_command_refuses_on_a_mismatch(
    command: list[str], team_env: dict[str, str], tmp_path: Path, open_store: OpenStore
) -> None:
    store = open_store(team_env)
    _fill(store, 3)
    bundle = tmp_path / "b.tar"
    if "BUNDLE" in command:
        assert artstore("export", str(bundle), "--all", env=team_env).returncode == 0
        command = [str(bundle) if c == "BUNDLE" else c for c in command]
    wrong = _wrong_bucket(team_env, tmp_path)
    if command == ["sign"]:
        assert artstore("keygen", "k2", "--dir", str(tmp_path)).returncode == 0
        wrong["ARTSTORE_SIGNING_KEY"] = str(tmp_path / "k2.key")
        wrong["ARTSTORE_TRUSTED_KEYS"] = str(tmp_path / "k2.pub")
    proc = artstore(*command, env=wrong)
    _one_line_refusal(proc, MISMATCH, wrong["ARTSTORE_URL"])
    assert _entries(store) == 3
    assert _identity_object(wrong) is None
    # Also a bucket that belongs to another index: both identities, different ids.
    other = open_store({**wrong, "ARTSTORE_INDEX": f"sqlite:///{tmp_path / 'other.db'}"})
    _fill(other, 1)
    assert _identity_object(wrong) is not None
    proc = artstore(*command, env=wrong)
    _one_line_refusal(proc, MISMATCH, "the index is bound to store")
    assert _entries(store) == 3


def test_doctor_shows_the_binding(team_env: dict[str, str], tmp_path: Path,
                                  open_store: OpenStore) -> None:  # fmt: skip
    def binding(env: dict[str, str]) -> str:
        out = json.loads(artstore("doctor", "--json", env=env).stdout)
        state: str = out["checks"]["binding"]["state"]
        return state

    assert binding(team_env) == "not yet bound"
    _fill(open_store(team_env), 1)
    assert binding(team_env) == "bound"
    assert binding(_wrong_bucket(team_env, tmp_path)) == "MISMATCH"


# -- stores of older clients: no identity anywhere ----------------------------------
def _forget_identity(store: Store, env: dict[str, str]) -> None:
    """What a store written by the previous version looks like: no identity anywhere."""
    from sqlalchemy import text

    with store.parts.engine.begin() as conn:
        conn.execute(text("DELETE FROM identities"))
    url = env["ARTSTORE_URL"]
    if url.startswith("s3://"):
        bucket, prefix = url.removeprefix("s3://").split("/", 1)
        s3_client(env).delete_object(Bucket=bucket, Key=f"{prefix}/default/identity")
    else:
        (Path(url) / "default" / "identity").unlink()
    assert _identity_object(env) is None and bound_id(store.parts.engine, "default") is None


def test_an_unbound_store_keeps_working_and_is_bound(
    any_env: dict[str, str], tmp_path: Path, open_store: OpenStore
) -> None:
    env = _with_index(any_env, tmp_path)
    store = open_store(env)
    _fill(store, 3)
    _forget_identity(store, env)
    # A wrong bucket does not look like this index's: refused, not bound.
    wrong = _wrong_bucket(env, tmp_path)
    _one_line_refusal(artstore("gc", env=wrong), MISMATCH, "newest entries")
    assert _identity_object(wrong) is None and bound_id(store.parts.engine, "default") is None
    # The right one does: gc runs and binds them.
    gc = artstore("gc", env=env)
    assert gc.returncode == 0, gc.stderr
    assert _entries(store) == 3
    found = _identity_object(env)
    assert found is not None
    assert bound_id(store.parts.engine, "default") == json.loads(found)["id"]
    # From now on the wrong bucket is a plain mismatch.
    _one_line_refusal(artstore("gc", env=wrong), MISMATCH, "has no identity")


# -- gc with most objects gone -----------------------------------------------------
def test_gc_refuses_to_drop_most_entries_without_allow_missing(
    any_env: dict[str, str], open_store: OpenStore
) -> None:
    store = open_store(any_env)
    _fill(store, 10)
    gone = [e.digest for e in store.parts.index.iter_entries()][:8]
    _delete_objects(store, gone)
    for args in (["gc"], ["gc", "--dry-run"], ["gc", "--max-size", "500G"]):
        _one_line_refusal(artstore(*args, env=any_env), "--allow-missing", "8")
        assert _entries(store) == 10
    ok = artstore("gc", "--allow-missing", env=any_env)
    assert ok.returncode == 0, ok.stderr
    assert _entries(store) == 2


def test_gc_still_drops_a_few_lost_objects(any_env: dict[str, str], open_store: OpenStore) -> None:
    store = open_store(any_env)
    _fill(store, 10)
    _delete_objects(store, [e.digest for e in store.parts.index.iter_entries()][:1])
    ok = artstore("gc", env=any_env)
    assert ok.returncode == 0, ok.stderr
    assert _entries(store) == 9


# -- rm of several entries needs a person's yes ----------------------------------------
def _rm(env: dict[str, str], *args: str, stdin: str = "n\n") -> subprocess.CompletedProcess[str]:
    return artstore("rm", *args, env=env, input=stdin)


def test_rm_without_a_terminal_removes_nothing_without_yes(
    any_env: dict[str, str], open_store: OpenStore
) -> None:
    store = open_store(any_env)
    _fill(store, 3)
    for args in (["--all"], [KEYS[0][:12], KEYS[1][:12]]):
        _one_line_refusal(_rm(any_env, *args), "--yes", "no terminal")
        assert _entries(store) == 3
    # A prefix that matches several entries removes several: the same question.
    for n in (1, 2):
        assert store.put(
            Put(
                "ab" * 31 + f"{n:02x}",
                os.urandom(500),
                fingerprint=FP,
                module_name="jit_p",
                compile_secs=1.0,
            )
        )
    _one_line_refusal(_rm(any_env, "abababab"), "2 entries", "--yes")
    assert _entries(store) == 5
    assert _rm(any_env, "abababab", "--yes").returncode == 0
    assert _entries(store) == 3
    one = _rm(any_env, KEYS[0][:12])  # one entry: as before, no question
    assert one.returncode == 0, one.stderr
    assert _entries(store) == 2
    every = _rm(any_env, "--all", "--yes")
    assert every.returncode == 0, every.stderr
    assert _entries(store) == 0


# -- migration 0004 -> 0005, with data written by the previous client --------------
@pytest.fixture(scope="module")
def schema_0004_client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("artifactstore-0004")
    return old_client(SCHEMA_0004_COMMIT, root, "artifactstore", "migrations", "pyproject.toml")


OLD_WORKLOAD = """
import os
from artifactstore import config
from artifactstore import fingerprint  # the previous release's layout
from artifactstore.store import Store
fp = fingerprint.compute(platform_name="cpu", platform_version="v", device_kind="cpu-a",
                         device_count=1, jax_version="1", jaxlib_version="0.9.1")
store = Store.open(config.resolve({}))
for i in range(3):
    store.put(f"{i + 1:02x}" * 32, os.urandom(700), fingerprint=fp, module_name="jit_a",
              compile_secs=2.0)
store.close()
import artifactstore.index.db as db
print(db.SCHEMA_HEAD)
"""


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_migration_0005_binds_a_store_written_at_0004(
    backend: str, schema_0004_client: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    env = clean_env(ARTSTORE_URL=str(tmp_path / "store"), ARTSTORE_LOCAL_TIER="off",
                    ARTSTORE_INDEX=f"sqlite:///{tmp_path / 'index.db'}")  # fmt: skip
    if backend == "postgresql":
        env["ARTSTORE_INDEX"] = request.getfixturevalue("pg_url")
    (tmp_path / "store").mkdir()
    old = {**env, "PYTHONPATH": str(schema_0004_client)}
    up = artstore("db", "upgrade", "0004", env=env)
    assert up.returncode == 0 and "0004" in up.stdout, up.stderr
    wrote = subprocess.run([sys.executable, "-c", OLD_WORKLOAD], env=old, capture_output=True,
                           text=True, check=False, cwd=tmp_path)  # fmt: skip
    assert wrote.returncode == 0, wrote.stderr
    assert wrote.stdout.split() == ["0004"]  # really the previous client
    assert _identity_object(env) is None
    up = artstore("db", "upgrade", env=env)
    assert up.returncode == 0 and "0005" in up.stdout, up.stderr
    engine = db.open_engine(env["ARTSTORE_INDEX"])
    try:
        assert db.schema_status(engine).current == "0005"
        assert bound_id(engine, "default") is None  # nothing bound by the migration
        gc = artstore("gc", env=env)  # the first command of this version binds them
        assert gc.returncode == 0, gc.stderr
        found = _identity_object(env)
        assert found is not None and bound_id(engine, "default") == json.loads(found)["id"]
        ls = artstore("ls", "--json", env=env)
        assert ls.returncode == 0 and len(json.loads(ls.stdout)) == 3, ls.stderr
    finally:
        engine.dispose()
