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
# A named entry's payload is a named frame (the verifier refuses any other as `malformed`).
STORED = named.frame({"kind": "native"}, PAYLOADS[KEY])


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
    # The removal record is no manifest, but `verify` and `ls --removed` show it: signed
    # by the key that removed the version, so obeyed. What was planted back is a problem:
    # `verify` names the two manifests that have no entry.
    checked = json.loads(artstore("verify", "--json", env=team_env).stdout)
    planted = sorted(k.rsplit("/", 1)[1] for k in saved if "/keys/" in k)
    assert checked["manifests_without_entry"] == planted, checked
    assert (checked["removals"], checked["removals_ignored"]) == (["t/step@1"], []), checked
    [row] = json.loads(artstore("ls", "--removed", "--json", env=team_env).stdout)
    assert (row["ref"], row["obeyed"], row["signer"]) == ("t/step@1", True, "team-tests"), row


# -- removal records where signatures are required: a trusted key's only ------------
def test_a_removal_record_planted_without_the_key_is_reported_not_obeyed(
    team_env: dict[str, str], tmp_path: Path
) -> None:
    """A bucket writer without the key plants t/step@1's removal record before CI builds
    it. Failed before: CI's build was not stored (`named_removed_not_stored`), readers got
    NamedNotFound, and neither `ls` nor any command showed or withdrew the record. Now it
    is ignored (said once), listed, a `verify` finding, and the gc role withdraws it.
    Slow: two JAX processes and six CLI calls (about 15 s)."""
    bucket = Bucket(team_env)
    record = f"{bucket.base}/keys/{named.removed_name('t/step', '1')}"
    forged = named.encode_removed("t/step", "1", 1_700_000_000)  # well formed, unsigned
    bucket.s3.put_object(Bucket=bucket.bucket, Key=record, Body=forged)

    built = _run(_writer(team_env), "old")
    assert built["source"] == "compiled" and built["result"] == OLD, built
    assert "named_removed_not_stored" not in built["stats"], built
    assert built["stats"]["stored"] == 2, built  # native and portable: both stored
    assert built["stats"]["named_removal_ignored"] >= 1, built
    ignored = "ignoring the removal record of t/step@1 (unsigned)"
    assert built["_stderr"].count(ignored) == 1, built["_stderr"][-2000:]
    loaded = _run(_reader(team_env, tmp_path / "node-0"), "load")
    assert loaded["source"] == "store" and loaded["result"] == OLD, loaded
    assert loaded["stats"]["named_removal_ignored"] >= 1, loaded
    assert loaded["_stderr"].count(ignored) == 1, loaded["_stderr"][-2000:]

    [row] = json.loads(artstore("ls", "--removed", "--json", env=team_env).stdout)
    assert (row["ref"], row["obeyed"], row["why_ignored"]) == ("t/step@1", False, "unsigned")
    checked = artstore("verify", "--json", env=team_env)
    assert checked.returncode == 1, checked.stderr
    assert json.loads(checked.stdout)["removals_ignored"] == ["t/step@1 (unsigned)"]
    shown = artstore("verify", env=team_env).stdout
    assert (
        "removal records ignored (withdraw: `artstore rm --removal`): 1\n  t/step@1 (unsigned)"
        in shown
    )

    asked = artstore("rm", "--removal", "t/step@1", env=team_env)  # no terminal, no --yes
    assert asked.returncode == 2 and "pass --yes" in asked.stderr, asked.stderr
    assert bucket.removal_records() == [record]
    gone = artstore("rm", "--removal", "t/step@1", "--yes", env=team_env)
    assert gone.returncode == 0 and "withdrew the removal record of t/step@1" in gone.stdout
    assert bucket.removal_records() == []
    assert artstore("ls", "--removed", env=team_env).stdout.strip() == "no removal records"
    again = artstore("rm", "--removal", "t/step@1", "--yes", env=team_env)
    assert again.returncode == 1 and "no removal record for 't/step@1'" in again.stderr
    assert artstore("verify", env=team_env).returncode == 0


def test_rm_name_without_a_signing_key_changes_nothing(team_env: dict[str, str]) -> None:
    """Where signatures are required readers obey only a signed removal record, so `rm
    --name` without ARTSTORE_SIGNING_KEY refuses before removing anything (else the
    version would be gone, and could be planted back). Slow: a JAX process and two CLI
    calls (about 15 s)."""
    built = _run(_writer(team_env), "old")
    assert built["stats"]["stored"] == 2, built  # native and portable
    keyless = {k: v for k, v in team_env.items() if k != "ARTSTORE_SIGNING_KEY"}
    out = artstore("rm", "--name", "t/step@1", "--yes", env=keyless)
    assert out.returncode == 1 and "set ARTSTORE_SIGNING_KEY" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    assert len(json.loads(artstore("ls", "--named", "--json", env=team_env).stdout)) == 2
    assert Bucket(team_env).removal_records() == []


# -- hostile removal records (no JAX) ----------------------------------------------
def _named_store(root: Path, **keys: str) -> Store:
    store = Store.open(config.resolve({}, environ=clean_env(ARTSTORE_URL=str(root), **keys)))
    store.put(
        Put(
            KEY,
            STORED,
            fingerprint=FP,
            module_name="named:t/step@1",
            compile_secs=1.0,
            callbacks=0,
        )
    )
    return store


@pytest.fixture(scope="module")
def named_stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Store, Store]]:
    """t/step@1 in a store without signatures, and in one that requires them."""
    root = tmp_path_factory.mktemp("removal")
    signed = {"ARTSTORE_SIGNING_KEY": str(TEAM_KEY), "ARTSTORE_TRUSTED_KEYS": str(TEAM_PUB)}
    stores = (_named_store(root / "open"), _named_store(root / "signed", **signed))
    yield stores
    for store in stores:
        store.close()


def _refused(store: Store, data: bytes) -> bool:
    """Whether t/step@1 is refused with `data` as its removal record (each refusal or
    ignored record counted); the entry loads again once the record is gone."""
    record = named.removed_name("t/step", "1")
    store.parts.blobs.put_record(removed.REMOVED, record, data)
    before = store.parts.counters.snapshot()
    hit = store.get(KEY, FP.digest, callbacks=0)
    after = store.parts.counters.snapshot()
    store.parts.blobs.delete_records(removed.REMOVED, [record])
    back = store.get(KEY, FP.digest, callbacks=0)
    assert back is not None and back.payload == STORED
    counted = "named_removed" if hit is None else "named_removal_ignored"
    assert after.get(counted, 0) == before.get(counted, 0) + 1, (counted, after)
    assert hit is None or hit.payload == STORED
    return hit is None


@pytest.mark.hostile_record("named removal record")
def test_a_removal_record_refuses_where_it_is_obeyed_only(
    named_stores: tuple[Store, Store],
) -> None:
    """Without signatures a removal record's presence refuses its version, whatever it
    holds; where signatures are required only one a trusted key signed for this namespace
    and this version does, and any other bytes (random, truncated, oversized, nested,
    another version's record, a signed record altered or moved) are ignored and counted.
    Never an exception, never another entry's bytes."""
    open_store, signed_store = named_stores
    signer = signed_store.parts.settings.signing_key
    good = named.encode_removed("t/step", "1", 1_700_000_000, signer, "default")
    other = named.encode_removed("t/step", "2", 1, signer, "default")
    elsewhere = named.encode_removed("t/step", "1", 1, signer, "another-team")
    record = named.removed_name("t/step", "1")

    @given(hostile.records(json.loads(good), max_bytes=named.MAX_REMOVED_BYTES,
                           others=[json.loads(other), json.loads(elsewhere)]))  # fmt: skip
    @example(hostile.DEEP)
    @example(b"")
    @example(good)
    @example(other)
    @example(elsewhere)
    @example(named.encode_removed("t/step", "1", 1))  # well formed, unsigned
    def run(data: bytes) -> None:
        assert _refused(open_store, data)
        found = named.decode_removed(record, data)
        obeyed = found.refusal(signed_store.parts.settings.trusted_keys, "default") is None
        assert _refused(signed_store, data) == obeyed
        if obeyed:  # a trusted key signed this version's removal, in this namespace
            assert (found.name, found.version, found.signature is not None) == ("t/step", "1", True)

    run()
    assert _refused(signed_store, good) and not _refused(signed_store, other)
    assert not _refused(signed_store, elsewhere)


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


def test_a_removal_record_in_glacier_is_a_miss_for_its_version_only(
    team_env: dict[str, str], tmp_path: Path
) -> None:
    """A removal record S3 will not serve (storage class GLACIER: InvalidObjectState, an
    answer about that one object) refuses its version, and the store stays in use: the
    next named entry in the same process still loads from it. Measured before: the answer
    opened the object-store breaker and the good entry was lost (NamedNotFound) for 60 s."""
    for name in ("t/step", "t/good"):
        built = _run({**_writer(team_env), "ROLLBACK_NAME": name}, "old")
        assert built["source"] == "compiled", built
    bucket = Bucket(team_env)
    record = f"{bucket.base}/keys/{named.removed_name('t/step', '1')}"
    body = named.encode_removed("t/step", "1", 1_700_000_000)
    bucket.s3.put_object(Bucket=bucket.bucket, Key=record, Body=body, StorageClass="GLACIER")

    env = {**_reader(team_env, tmp_path / "node"), "ROLLBACK_FIRST": "t/step"}
    out = _run({**env, "ROLLBACK_NAME": "t/good"}, "load")
    assert out["first"] == "NamedNotFound", out  # the version stays refused
    assert out.get("source") == "store" and out["result"] == OLD, out  # the store answers
    assert "unavailable" not in out["_stderr"], out["_stderr"][-2000:]  # no breaker line
    assert "InvalidObjectState" in out["_stderr"], out["_stderr"][-2000:]  # said, once
