"""Manifests: an entry's record beside its objects, so that a lookup needs no database."""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import FAKE_AWS, OpenStore, artstore, devstack
from sqlalchemy import delete

from artifactstore.blobstores import BlobStore, LocalBlobStore, ReadOnlyBlobStore
from artifactstore.blobstores.s3 import S3BlobStore
from artifactstore.config.host import compute
from artifactstore.errors import CorruptObject, ReadOnlyError
from artifactstore.formats.fingerprint import Fingerprint
from artifactstore.formats.manifest import MAX_MANIFEST_BYTES, Manifest
from artifactstore.formats.put import Put
from artifactstore.index.models import Entry
from artifactstore.index.repo import NewEntry
from artifactstore.store import Store

KEY = "0123456789abcdef" * 4
M = Manifest(key=KEY, digest="d" * 64, fingerprint="f" * 64, compile_secs=1.5, raw_size=100,
             size=40, module_name="jit_f", callbacks=2, signer="ci")  # fmt: skip


def test_roundtrip_and_the_names_a_tier_reads() -> None:
    data = M.encode()
    assert Manifest.decode(data, KEY) == M
    raw = json.loads(data)
    assert (raw["d"], raw["f"], raw["c"]) == ("d" * 64, "f" * 64, 1.5)  # as a tier key file


@pytest.mark.parametrize(
    "change",
    [
        {"v": 2},  # a newer format: not understood, so not used
        {"k": "1" * 64},  # copied from another key
        {"d": "D" * 64},
        {"d": "d" * 63},
        {"f": None},
        {"c": float("nan")},
        {"c": True},
        {"r": -1},
        {"s": 2**64},
        {"r": 1.5},
        {"cb": "2"},
        {"m": 7},
    ],
)
def test_anything_else_is_corrupt(change: dict[str, object]) -> None:
    raw = {**json.loads(M.encode()), **change}
    with pytest.raises(CorruptObject):
        Manifest.decode(json.dumps(raw).encode(), KEY)


@pytest.mark.parametrize("data", [b"", b"[]", b"\xff", b"{}", b" " * (MAX_MANIFEST_BYTES + 1)])
def test_garbage_is_corrupt(data: bytes) -> None:
    with pytest.raises(CorruptObject):
        Manifest.decode(data, KEY)


@pytest.fixture(params=["local", "s3"])
def blobs(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BlobStore]:
    if request.param == "local":
        yield LocalBlobStore(tmp_path, "ns")
        return
    endpoint = request.getfixturevalue("moto_endpoint")
    bucket = "artstore-" + uuid.uuid4().hex[:12]
    devstack.create_bucket(endpoint, bucket)
    mp = request.getfixturevalue("monkeypatch")
    for name, value in FAKE_AWS.items():
        mp.setenv(name, value)
    yield S3BlobStore(bucket, "cache", "ns", endpoint, 5.0)


def test_publish_replace_list_and_withdraw(blobs: BlobStore) -> None:
    keys = [f"{i:064x}" for i in range(5)]
    assert blobs.get_manifest(keys[0]) is None
    for key in keys:
        blobs.put_manifest(key, b"first")
    blobs.put_manifest(keys[0], b"second")  # a republication replaces it whole
    assert blobs.get_manifest(keys[0]) == b"second"
    assert sorted(blobs.iter_manifest_keys()) == keys
    assert list(blobs.iter_blobs()) == []  # manifests are not objects
    blobs.delete_manifests([keys[0], keys[1], "9" * 64])  # absent ones are fine
    assert sorted(blobs.iter_manifest_keys()) == keys[2:]
    with pytest.raises(ValueError):
        blobs.put_manifest("../escape", b"x")
    ro = ReadOnlyBlobStore(blobs)
    assert ro.get_manifest(keys[2]) == b"first"
    with pytest.raises(ReadOnlyError):
        ro.put_manifest(keys[2], b"x")
    with pytest.raises(ReadOnlyError):
        ro.delete_manifests([keys[2]])


def test_an_oversized_manifest_is_read_only_up_to_the_bound(blobs: BlobStore) -> None:
    blobs.put_manifest(KEY, b"x" * (MAX_MANIFEST_BYTES * 4))
    data = blobs.get_manifest(KEY)
    assert data is not None and len(data) == MAX_MANIFEST_BYTES + 1
    with pytest.raises(CorruptObject):
        Manifest.decode(data, KEY)


# -- the store publishes, follows and withdraws them ---------------------------
def _fp() -> Fingerprint:
    return compute(platform_name="cpu", platform_version="v", device_kind="cpu",
                   device_count=1, jax_version="1", jaxlib_version="1")  # fmt: skip


def _put(store: Store, i: int) -> str:
    key = f"{i:064x}"
    assert store.put(Put(key, bytes([i]) * 64, _fp(), f"m{i}", 1))
    return key


def _manifest(store: Store, key: str) -> Manifest | None:
    data = store.parts.blobs.get_manifest(key)
    return None if data is None else Manifest.decode(data, key)


def test_put_publishes_and_removals_withdraw(
    any_env: dict[str, str], open_store: OpenStore
) -> None:
    store = open_store(any_env, local_tier="off")
    a, b, c = (_put(store, i) for i in (1, 2, 3))
    row = store.parts.index.lookup(a)
    published = _manifest(store, a)
    assert row is not None and published is not None
    assert (published.digest, published.fingerprint, published.raw_size, published.size) == (
        row.digest, row.fingerprint, row.raw_size, row.size)  # fmt: skip
    # (The whole key: these keys share their first 12 characters, and a prefix that
    # matches several entries needs --yes.)
    assert artstore("rm", a, env=any_env).returncode == 0
    assert _manifest(store, a) is None and _manifest(store, b) is not None
    gc = artstore("gc", "--max-size", "0", "--grace", "0", env=any_env)
    assert gc.returncode == 0, gc.stderr
    assert (
        list(store.parts.blobs.iter_manifest_keys()) == [] and store.parts.index.lookup(b) is None
    )
    _put(store, 4)
    assert artstore("rm", "--all", "--yes", env=any_env).returncode == 0
    assert list(store.parts.blobs.iter_manifest_keys()) == [] and c


def test_a_gc_between_row_and_manifest_leaves_no_manifest_behind(
    any_env: dict[str, str], open_store: OpenStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gc evicts the row just inserted, finds no manifest to withdraw and deletes the
    object (`--grace 0`); the writer then publishes. Its re-check withdraws the manifest,
    which would otherwise lead every reader to a deleted object."""
    store = open_store(any_env, local_tier="off")
    publish, digests = store.parts.writes.publish, []

    def gc_first(entry: NewEntry, **kw: int | None) -> bool:
        digests.append(entry.digest)
        gc = artstore("gc", "--max-size", "0", "--grace", "0", env=any_env)
        assert gc.returncode == 0, gc.stderr
        return publish(entry, **kw)

    monkeypatch.setattr(store.parts.writes, "publish", gc_first)
    key = _put(store, 8)
    assert store.parts.index.lookup(key) is None and not store.parts.blobs.exists(digests[0])
    assert _manifest(store, key) is None
    assert store.parts.counters.snapshot()["manifest_withdrawn"] == 1
    reader = open_store(any_env, local_tier="off")
    assert reader.get(key, _fp().digest) is None
    assert reader.parts.counters.snapshot().get("missing_object", 0) == 0


def test_lookup_follows_the_manifest_without_the_index_row(
    any_env: dict[str, str], open_store: OpenStore
) -> None:
    store = open_store(any_env, local_tier="off")
    key = _put(store, 5)
    with store.parts.engine.begin() as conn:
        conn.execute(delete(Entry))  # the index no longer knows it
    reader = open_store(dict(any_env, ARTSTORE_READ_ONLY="1"), local_tier="off")
    hit = reader.get(key, _fp().digest)
    assert hit is not None and hit.payload == bytes([5]) * 64
    assert isinstance(hit.entry, Manifest) and hit.entry.module_name == "m5"


def test_a_forged_or_stale_manifest_is_a_miss_never_a_wrong_load(
    any_env: dict[str, str], open_store: OpenStore
) -> None:
    store = open_store(any_env, local_tier="off")
    a, b = _put(store, 6), _put(store, 7)
    ma, mb = _manifest(store, a), _manifest(store, b)
    assert ma is not None and mb is not None
    # a's manifest sent to b's (intact, genuine) object: the object is bound to b.
    store.parts.blobs.put_manifest(a, dataclasses.replace(mb, key=a).encode())
    reader = open_store(any_env, local_tier="off")
    assert reader.get(a, _fp().digest) is None
    assert reader.parts.counters.snapshot()["wrong_entry"] == 1
    # A manifest naming an object that does not exist: a miss; the entry's row stays.
    store.parts.blobs.put_manifest(a, dataclasses.replace(ma, digest="0" * 64).encode())
    assert reader.get(a, _fp().digest) is None
    assert reader.parts.counters.snapshot()["missing_object"] == 1
    assert store.parts.index.lookup(a) is not None
    # A damaged one is ignored. A SQLite index (a file) still leads to the right object;
    # a database server is never asked on the read path: a miss, until a writer that
    # compiles the key finds its row and publishes the manifest again.
    store.parts.blobs.put_manifest(a, b"{garbage")
    hit = reader.get(a, _fp().digest)
    assert reader.parts.counters.snapshot()["bad_manifest"] == 1
    if store.parts.settings.index_is_server:
        assert hit is None
        assert not store.put(Put(a, bytes([6]) * 64, _fp(), "m6", 1))
        assert store.parts.counters.snapshot()["manifest_republished"] == 1
        hit = reader.get(a, _fp().digest)
    assert hit is not None and hit.payload == bytes([6]) * 64


def test_verify_reconciles_manifests_and_repairs(
    any_env: dict[str, str], open_store: OpenStore
) -> None:
    store = open_store(any_env, local_tier="off")
    a, b, c = (_put(store, i) for i in (8, 9, 10))
    store.parts.blobs.delete_manifests([a])  # lost (a writer killed before publishing)
    store.parts.blobs.put_manifest(b, b"{damaged")
    ghost = f"{11:064x}"
    store.parts.blobs.put_manifest(ghost, dataclasses.replace(
        _manifest(store, c), key=ghost).encode())  # type: ignore[type-var]  # fmt: skip
    report = json.loads(artstore("verify", "--json", env=any_env).stdout)
    assert report["ok"] is False
    assert report["manifests_missing"] == sorted([a, b])
    assert report["manifests_without_entry"] == [ghost]
    repaired = artstore("verify", "--repair", env=any_env)
    assert "entries without manifest: 2" in repaired.stdout
    again = json.loads(artstore("verify", "--json", env=any_env).stdout)
    assert again["ok"] is True, again
    assert sorted(store.parts.blobs.iter_manifest_keys()) == sorted([a, b, c])


def test_tier_key_files_are_the_published_manifests(
    team_env: dict[str, str], open_store: OpenStore, tmp_path: Path
) -> None:
    """One record format: a tier's key file is the manifest the store published, checked
    as strictly when read (a writer's tier at put, a reader's at its first load)."""
    store = open_store(team_env, local_tier=str(tmp_path / "writer-tier"))
    key = _put(store, 12)
    published = _manifest(store, key)
    reader = open_store(dict(team_env, ARTSTORE_READ_ONLY="1"), lazy_index=True,
                        local_tier=str(tmp_path / "reader-tier"))  # fmt: skip
    assert reader.get(key, _fp().digest) is not None
    for tier in (store.parts.tier, reader.parts.tier):
        assert tier is not None
        assert Manifest.decode(tier._key_path(key).read_bytes(), key) == published
    assert reader.parts.tier is not None and reader.parts.tier.get(key, _fp().digest) is not None
    reader.parts.tier._key_path(key).write_bytes(M.encode())  # another key's record: refused
    assert reader.parts.tier.get(key, _fp().digest) is None
    assert not reader.parts.tier._key_path(key).exists()  # and forgotten
