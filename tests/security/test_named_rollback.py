"""Issue 38, item 8: a removed or replaced named version cannot come back through a bucket write.

Measured before: after `artstore rm --name t/step@1` and a rebuild of t/step@1 as another
function, putting the old signed objects and manifests back with S3 PutObject alone (no
key, no index) made a trusted reader run the old code ([2.0, 2.0, 2.0, 2.0], source=store).
Each test here failed before removal records (artifactstore/store/removed.py): moto S3
over HTTP, PostgreSQL, signatures required, readers read-only, trusting the writer's key
only, on a fresh node (its own empty tier), in real JAX processes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import TEAM_KEY, TEAM_PUB, artstore, bucket_of, clean_env, run_program, s3_client
from hypothesis import example, given

from artifactstore import config
from artifactstore.formats import named
from artifactstore.formats.put import Put
from artifactstore.store import Store, removed
from security import hostile
from security.hostile import FP, KEY, PAYLOADS

OLD = [2.0, 2.0, 2.0, 2.0]  # ones(4) + 1: the removed function
NEW = [3.0, 3.0, 3.0, 3.0]  # ones(4) * 3: what t/step@1 was rebuilt as
REFUSAL_LINE = "t/step@1 was removed from this store"


def _run(env: dict[str, str], mode: str) -> dict[str, Any]:
    return run_program("named_rollback.py", {**env, "ROLLBACK_MODE": mode})


def _writer(team_env: dict[str, str]) -> dict[str, str]:
    # No tier: what it builds and loads is the bucket's, as on a CI runner.
    return {**team_env, "ARTSTORE_LOCAL_TIER": "off"}


def _reader(team_env: dict[str, str], node: Path) -> dict[str, str]:
    """A read-only reader that requires signatures and trusts the writer's key alone,
    on a fresh node (an empty tier of its own)."""
    env = {k: v for k, v in team_env.items() if k != "ARTSTORE_SIGNING_KEY"}
    return {
        **env,
        "ARTSTORE_TRUSTED_KEYS": str(TEAM_PUB),
        "ARTSTORE_REQUIRE_SIGNATURES": "1",
        "ARTSTORE_READ_ONLY": "1",
        "ARTSTORE_LOCAL_TIER": str(node),
    }


class Bucket:
    """The namespace's objects and manifests, as an attacker with S3 write sees them."""

    def __init__(self, env: dict[str, str]) -> None:
        self.s3 = s3_client(env)
        self.bucket, prefix = bucket_of(env)
        self.base = f"{prefix}/default"

    def snapshot(self) -> dict[str, bytes]:
        """Every signed object and manifest, kept as an attacker keeps them."""
        out = {}
        for folder in ("objects", "keys"):
            listing = self.s3.list_objects_v2(Bucket=self.bucket, Prefix=f"{self.base}/{folder}/")
            for item in listing.get("Contents", []):
                body = self.s3.get_object(Bucket=self.bucket, Key=item["Key"])["Body"].read()
                out[item["Key"]] = body
        assert any("/objects/" in k for k in out) and any("/keys/" in k for k in out), out
        return out

    def plant(self, saved: dict[str, bytes]) -> None:
        """Put them all back with PutObject alone (no key, no index)."""
        for key, body in saved.items():
            self.s3.put_object(Bucket=self.bucket, Key=key, Body=body)

    def removal_records(self) -> list[str]:
        listing = self.s3.list_objects_v2(Bucket=self.bucket, Prefix=f"{self.base}/keys/")
        return [i["Key"] for i in listing.get("Contents", []) if i["Key"].endswith(".removed")]


def _build_and_keep(team_env: dict[str, str], tmp_path: Path) -> tuple[Bucket, dict[str, bytes]]:
    """t/step@1 built as the old function, loaded by a trusted reader, and the bucket's
    signed objects and manifests saved by the attacker."""
    built = _run(_writer(team_env), "old")
    assert built["source"] == "compiled" and built["result"] == OLD, built
    loaded = _run(_reader(team_env, tmp_path / "node-0"), "load")
    assert loaded["source"] == "store" and loaded["result"] == OLD, loaded
    bucket = Bucket(team_env)
    return bucket, bucket.snapshot()


def _rm(team_env: dict[str, str]) -> None:
    out = artstore("rm", "--name", "t/step@1", "--yes", env=team_env)
    assert out.returncode == 0, out.stderr
    assert "removed 2 entries" in out.stdout, out.stdout  # native and portable
    assert "removed for good" in out.stdout and "t/step@1" in out.stdout, out.stdout


def _assert_refused(out: dict[str, Any]) -> None:
    """The reader did not run the old code, and its defence is what stopped it."""
    assert out.get("result") != OLD, out
    assert out["stats"].get("named_removed", 0) >= 1, out  # the refusal, counted
    assert REFUSAL_LINE in out["_stderr"], out["_stderr"][-2000:]  # and said, once


def test_rm_rebuild_then_old_objects_planted_back_never_run(
    team_env: dict[str, str], tmp_path: Path
) -> None:
    """The measured case. Slow: six JAX processes and a CLI call (about 20 s)."""
    bucket, saved = _build_and_keep(team_env, tmp_path)
    _rm(team_env)
    rebuilt = _run(_writer(team_env), "new")  # same name and version, another function
    assert rebuilt["source"] == "compiled" and rebuilt["result"] == NEW, rebuilt
    bucket.plant(saved)  # the old signed objects and manifests, back in the bucket

    loaded = _run(_reader(team_env, tmp_path / "node-1"), "load")
    _assert_refused(loaded)
    assert loaded["error"] == "NamedNotFound" and "refused: named_removed" in loaded["message"]
    # Versions are immutable once published: the rebuild ran, but was not stored.
    assert rebuilt["stats"].get("named_removed_not_stored") == 1, rebuilt
    assert "build it as a new version" in rebuilt["_stderr"]
    # A reader that has the new function runs it: never the planted-back old one.
    with_source = _run(_reader(team_env, tmp_path / "node-2"), "new")
    _assert_refused(with_source)
    assert with_source["source"] == "compiled" and with_source["result"] == NEW


def test_rm_then_old_objects_planted_back_never_run(
    team_env: dict[str, str], tmp_path: Path
) -> None:
    """No rebuild: the removal alone keeps the version out. Slow: five JAX processes and
    three CLI calls (about 20 s)."""
    bucket, saved = _build_and_keep(team_env, tmp_path)
    _rm(team_env)
    bucket.plant(saved)

    loaded = _run(_reader(team_env, tmp_path / "node-1"), "load")
    _assert_refused(loaded)
    assert loaded["error"] == "NamedNotFound"
    assert len(bucket.removal_records()) == 1  # what refused it: one record, beside the keys
    # `pull` does not copy the planted-back version into a node's tier either.
    node = tmp_path / "node-2"
    pulled = artstore("pull", "--json", env=_reader(team_env, node))
    assert pulled.returncode == 0, pulled.stderr
    report = json.loads(pulled.stdout)
    assert report["fetched"] == 0 and report["refused"] >= 1, report
    _assert_refused(_run(_reader(team_env, node), "load"))
    # The removal record is no manifest (listings and `verify` do not see it); what was
    # planted back is: `verify` names the two manifests that have no entry.
    checked = artstore("verify", "--json", env=team_env)
    planted = sorted(k.rsplit("/", 1)[1] for k in saved if "/keys/" in k)
    assert json.loads(checked.stdout)["manifests_without_entry"] == planted, checked.stdout


# -- hostile removal records (no JAX): whatever bytes sit at the name, the version is refused
@pytest.fixture(scope="module")
def named_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    root = tmp_path_factory.mktemp("removal")
    env = clean_env(
        ARTSTORE_URL=str(root / "store"),
        ARTSTORE_SIGNING_KEY=str(TEAM_KEY),
        ARTSTORE_TRUSTED_KEYS=str(TEAM_PUB),
    )
    store = Store.open(config.resolve({}, environ=env))
    store.put(
        Put(
            KEY,
            PAYLOADS[KEY],
            fingerprint=FP,
            module_name="named:t/step@1",
            compile_secs=1.0,
            callbacks=0,
        )
    )
    yield store
    store.close()


@pytest.mark.hostile_record("named removal record")
def test_a_removal_record_refuses_whatever_it_holds(named_store: Store) -> None:
    """A removal record's presence, not its contents, refuses its version: hostile bytes there
    (random, truncated, oversized, nested, another version's record) never raise, never let
    the version load, and each refusal is counted; without the record the entry loads."""
    store, record = named_store, named.removed_name("t/step", "1")
    good = json.loads(named.encode_removed("t/step", "1", 1_700_000_000))
    other = json.loads(named.encode_removed("t/step", "2", 1))

    @given(hostile.records(good, max_bytes=named.MAX_REMOVED_BYTES, others=[other]))
    @example(hostile.DEEP)
    @example(b"")
    def run(data: bytes) -> None:
        assert named.removed_at(data) is None or named.removed_at(data) >= 0  # never raises
        store.parts.blobs.put_record(removed.REMOVED, record, data)
        before = store.parts.counters.snapshot().get("named_removed", 0)
        assert store.get(KEY, FP.digest, callbacks=0) is None
        assert store.parts.counters.snapshot().get("named_removed", 0) == before + 1
        store.parts.blobs.delete_records(removed.REMOVED, [record])
        hit = store.get(KEY, FP.digest, callbacks=0)
        assert hit is not None and hit.payload == PAYLOADS[KEY]

    run()


@given(hostile.names())
@example("a" * 64 + ".removed")
@example("../" + "0" * 61 + ".removed")
def test_removal_record_names_are_a_digest_and_the_suffix_only(name: str) -> None:
    try:
        named.check_removed_name(name)
    except ValueError:
        return
    assert name[:64] == name[:64].lower() and len(name) == 64 + len(".removed")
    assert all(c in "0123456789abcdef" for c in name[:64]) and name.endswith(".removed")
