"""Issue 38 item 3: hostile records planted in a store, driven through the real paths.

A local store (directory + SQLite) signed by the team tests' key, whose readers trust
only that key, holds two entries; each example plants hostile bytes where anyone who may
write the store's directory (or bucket) could, then runs the path that reads them:
`Store.get` (manifests, objects), `fold_journals` (hit journals), `collect` (gc over every
folder), the identity check every writer and command makes, and `pull` (quick keys,
working sets, manifests into a tier). Properties: no exception but the documented
refusal, never a payload other than the one stored for the key asked, and each defence
is seen to run (its counter moves). The same through moto S3: test_hostile_s3.py.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from conftest import TEAM_KEY, TEAM_PUB, clean_env
from hypothesis import example, given, settings
from hypothesis import strategies as st

from artifactstore import config
from artifactstore.blobstores.base import IDENTITY, JOURNALS, LEASES, MANIFESTS, QUICK, WORKING_SETS
from artifactstore.bundles.pull import open_puller, pull
from artifactstore.errors import CorruptObject
from artifactstore.formats.identity import FORMAT as IDENTITY_FORMAT
from artifactstore.formats.identity import decode as decode_identity
from artifactstore.formats.lease import LeaseRecord
from artifactstore.formats.manifest import Manifest
from artifactstore.formats.put import Put
from artifactstore.formats.workingset import WorkingSet
from artifactstore.gc.collect import collect
from artifactstore.gc.journals import fold_journals
from artifactstore.gc.policy import Policy
from artifactstore.store import Store, identity
from security import hostile
from security.hostile import FP, KEY, OTHER, PAYLOADS

TRUST = {"ARTSTORE_SIGNING_KEY": str(TEAM_KEY), "ARTSTORE_TRUSTED_KEYS": str(TEAM_PUB)}


class Planted:
    """A local store holding KEY and OTHER, and what they are as stored (to restore)."""

    def __init__(self, root: Path) -> None:
        self.env = clean_env(ARTSTORE_URL=str(root / "store"), **TRUST)
        self.store = Store.open(config.resolve({}, environ=self.env))
        self.objects: dict[str, bytes] = {}
        self.manifests: dict[str, bytes] = {}
        for key, payload in PAYLOADS.items():
            self.store.put(Put(key, payload, FP, "jit_f", 1.5, 0))
            data = self.store.parts.blobs.get_manifest(key)
            assert data is not None
            self.manifests[key] = data
            digest = Manifest.decode(data, key).digest
            self.objects[digest] = self.store.parts.blobs.get(digest) or b""

    def restore(self) -> None:
        """Both entries as stored: objects, manifests and index rows (a refused object
        is quarantined and its row dropped)."""
        for digest, data in self.objects.items():
            self.store.parts.blobs.delete(digest)
            self.store.parts.blobs.put(digest, data)
        for key, data in self.manifests.items():
            if self.store.parts.index.lookup(key) is None:
                self._put(key)
            self.store.parts.blobs.put_manifest(key, data)

    def _put(self, key: str) -> None:
        self.store.put(Put(key, PAYLOADS[key], FP, "jit_f", 1.5, 0))

    def folder(self, kind_dir: str) -> Path:
        path = Path(self.store.parts.blobs.base) / kind_dir  # type: ignore[attr-defined]
        path.mkdir(parents=True, exist_ok=True)
        return path

    def loads_only_what_was_stored(self) -> None:
        for key, payload in PAYLOADS.items():
            hit = self.store.get(key, FP.digest, callbacks=0)
            assert hit is None or hit.payload == payload, f"a wrong load for {key[:8]}"


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Planted]:
    found = Planted(tmp_path_factory.mktemp("hostile"))
    yield found
    found.store.close()


def _manifest(planted: Planted, key: str) -> dict[str, object]:
    return dict(json.loads(planted.manifests[key]))


@pytest.mark.hostile_record("manifest")
def test_a_hostile_manifest_is_a_miss_or_the_stored_payload(planted: Planted) -> None:
    good, other = _manifest(planted, KEY), _manifest(planted, OTHER)

    @given(hostile.records(good, max_bytes=MANIFESTS.max_bytes, others=[other]))
    @example(planted.manifests[OTHER])  # another entry's manifest under KEY's name
    @example(hostile.DEEP)
    def run(data: bytes) -> None:
        planted.restore()
        planted.store.parts.blobs.put_manifest(KEY, data)
        before = planted.store.parts.counters.snapshot().get("bad_manifest", 0)
        hit = planted.store.get(KEY, FP.digest, callbacks=0)
        assert hit is None or hit.payload == PAYLOADS[KEY]
        try:
            Manifest.decode(data, KEY)
            refused = False
        except CorruptObject:
            refused = True
        after = planted.store.parts.counters.snapshot().get("bad_manifest", 0)
        assert after == before + refused  # the defence ran exactly when it had to
        planted.loads_only_what_was_stored()

    run()


def _mutate(args: tuple[bytes, int, int, bytes]) -> bytes:
    data, at, cut, tail = args
    at %= max(1, len(data))
    return data[:at] + tail + data[at + cut :]


@pytest.mark.hostile_record("object")
def test_a_hostile_object_is_a_miss_never_another_payload(planted: Planted) -> None:
    good = Manifest.decode(planted.manifests[KEY], KEY).digest
    originals = list(planted.objects.values())
    forged = hostile.signed(KEY, b"forged", namespace="elsewhere").data  # another namespace's

    @given(
        st.one_of(
            st.tuples(
                st.sampled_from(originals),
                st.integers(0, 10**6),
                st.integers(0, 64),
                st.binary(max_size=32),
            ).map(_mutate),
            st.sampled_from([*originals, forged, b"", planted.objects[good] + b"\0"]),
        )
    )
    def run(data: bytes) -> None:
        planted.restore()
        path = Path(planted.store.parts.blobs.base) / "objects" / good[:2] / good  # type: ignore[attr-defined]
        path.write_bytes(data)
        counts = planted.store.parts.counters.snapshot()
        hit = planted.store.get(KEY, FP.digest, callbacks=0)
        assert hit is None or hit.payload == PAYLOADS[KEY]
        if data != planted.objects[good]:  # refused, and counted as a refusal
            assert hit is None
            assert sum(planted.store.parts.counters.snapshot().values()) > sum(counts.values())

    run()


@pytest.mark.hostile_record("hit journal")
def test_hostile_journals_fold_or_are_set_aside(planted: Planted) -> None:
    good = {"v": 1, "a": {KEY: [3, 1.7e9]}, "c": {"misses": 1}}

    @given(
        st.lists(hostile.records(good, max_bytes=JOURNALS.max_bytes), min_size=1, max_size=3),
        st.lists(hostile.names().filter(_file_name), max_size=2),
    )
    @example([hostile.DEEP, hostile.HUGE_NUMBER], ["../x"])
    def run(bodies: list[bytes], names: list[str]) -> None:
        folder = planted.folder(JOURNALS.directory)
        for body in bodies:
            (folder / uuid.uuid4().hex).write_bytes(body)
        for name in names:
            (folder / name).write_bytes(b"{}")
        (folder / uuid.uuid4().hex).write_bytes(hostile.dump(good))
        result = fold_journals(planted.store.parts)
        assert result.journals >= 1 and result.hits >= 3  # the genuine journal folded
        assert result.journals + result.refused == len(bodies) + 1
        left = {p.name for p in folder.iterdir()}
        assert not any(JOURNALS.listed(n) and len(n) == 32 for n in left), left
        for name in left:
            (folder / name).unlink()

    run()


def _file_name(name: str) -> bool:
    """A name a file can have (what a listing of a bucket could show, as a file)."""
    ok = bool(name) and name not in (".", "..") and "/" not in name and "\0" not in name
    return ok and len(name.encode("utf-8", "surrogatepass")) <= 200 and name.isprintable()


@pytest.mark.hostile_record("identity")
@settings(max_examples=20)
@given(data=hostile.records({"format": IDENTITY_FORMAT, "id": "0123456789abcdef"}, max_bytes=4096))
@example(data=hostile.DEEP)
def test_a_hostile_identity_is_a_mismatch_never_replaced(
    data: bytes, tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = tmp_path_factory.mktemp("identity")
    env = clean_env(ARTSTORE_URL=str(root / "store"), **TRUST)
    store = Store.open(config.resolve({}, environ=env))
    try:
        path = Path(store.parts.blobs.base) / IDENTITY  # type: ignore[attr-defined]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        found = identity.check(
            store.parts.blobs, store.parts.engine, store.parts.namespace, env["ARTSTORE_URL"]
        )
        try:
            decode_identity(data)
        except ValueError:
            assert found.state == identity.MISMATCH  # said, never an exception
            with pytest.raises(identity.StoreMismatch):
                store.parts.writes.gate.require()
        assert path.read_bytes() == data  # never replaced
    finally:
        store.close()


@pytest.mark.hostile_record("quick-key record", "working set", "lease record")
def test_gc_over_hostile_records_in_every_folder(planted: Planted) -> None:
    """Slow-ish: each example runs a whole gc; few examples."""
    ws = {"v": 1, "p": "c" * 40, "f": FP.digest, "e": [[KEY, "AAEC", [0], 0]]}

    @settings(max_examples=10)
    @given(
        hostile.records(ws, max_bytes=WORKING_SETS.max_bytes),
        hostile.records(
            {"v": 1, "holder": "h:1", "beat": 1, "ttl": 1.0, "state": "compiling"},
            max_bytes=LEASES.max_bytes,
        ),
        st.lists(hostile.names().filter(_file_name), max_size=3),
    )
    def run(working_set: bytes, lease: bytes, quick_names: list[str]) -> None:
        planted.restore()
        planted.store.parts.blobs.put_record(WORKING_SETS, "c" * 40, working_set)
        planted.store.parts.blobs.put_record(LEASES, KEY, lease)
        quick = planted.folder(QUICK.directory)
        for name in [*quick_names, f"{FP.digest}.{KEY}", f"{FP.digest}.{'q' * 64}"]:
            (quick / name).write_bytes(b'{"v":1,"c":0.01}')
        report = collect(planted.store, Policy(grace_secs=0))
        assert report.quick_records_removed >= 1  # KEY has an entry: its record went
        assert (quick / f"{FP.digest}.{'q' * 64}").exists()  # a quick key still quick
        for key, payload in PAYLOADS.items():  # gc kept both entries
            hit = planted.store.get(key, FP.digest, callbacks=0)
            assert hit is not None and hit.payload == payload

    run()


@pytest.mark.hostile_record("quick-key record", "working set", "manifest")
def test_pull_keeps_only_what_verifies(
    planted: Planted, tmp_path_factory: pytest.TempPathFactory
) -> None:
    ws = {"v": 1, "p": "d" * 40, "f": FP.digest, "e": [[KEY, "AAEC", [0], 0]]}
    good, other = _manifest(planted, KEY), _manifest(planted, OTHER)

    @settings(max_examples=15)
    @given(
        hostile.records(ws, max_bytes=WORKING_SETS.max_bytes),
        hostile.records(good, max_bytes=MANIFESTS.max_bytes, others=[other]),
        st.lists(hostile.names().filter(_file_name), max_size=3),
    )
    @example(hostile.DEEP, planted.manifests[OTHER], ["../x", f"{FP.digest}..{KEY}"])
    def run(working_set: bytes, manifest: bytes, quick_names: list[str]) -> None:
        planted.restore()
        planted.store.parts.blobs.put_record(WORKING_SETS, "d" * 40, working_set)
        planted.store.parts.blobs.put_manifest(KEY, manifest)
        quick = planted.folder(QUICK.directory)
        for name in quick_names:
            (quick / name).write_bytes(b"{}")
        tier_dir = tmp_path_factory.mktemp("pulled")
        settings_ = config.resolve(
            {}, environ=dict(planted.env, ARTSTORE_READ_ONLY="1", ARTSTORE_LOCAL_TIER=str(tier_dir))
        )
        puller = open_puller(settings_)
        report = pull(puller, FP.digest, jobs=2)
        assert report.stopped is None and report.failed == 0
        assert report.fetched + report.bad_manifests + report.corrupt + report.refused >= 1
        for name in puller.tier.quick._loaded():  # only keys that name files safely
            assert name.isalnum()
        for path in (puller.tier.base / WORKING_SETS.folder).glob("*"):
            assert WorkingSet.decode(path.read_bytes(), path.name).fingerprint == FP.digest
        hit = puller.tier.get(OTHER, FP.digest, callbacks=0)  # the untouched entry was kept
        assert hit is not None and hit.payload == PAYLOADS[OTHER]
        mine = puller.tier.get(KEY, FP.digest, callbacks=0)
        assert mine is None or mine.payload == PAYLOADS[KEY]
        for name in quick_names:
            (quick / name).unlink(missing_ok=True)

    run()


@pytest.mark.hostile_record("lease record")
def test_a_hostile_lease_record_costs_a_reader_at_most_its_own_short_wait(
    planted: Planted,
) -> None:
    """A read-only reader that missed a key reads its lease record: whatever the record
    says (a beat, a TTL of 1e300, a live holder), the wait ends within the reader's own
    ARTSTORE_LEASE_READER_WAIT, and a malformed record is counted as refused."""
    env = dict(planted.env, ARTSTORE_READ_ONLY="1", ARTSTORE_LEASE_READER_WAIT="0.3")
    reader = Store.open(config.resolve({"local_tier": "off"}, environ=env), lazy_index=True)
    missing = "m" * 64
    good = {
        "v": 1,
        "holder": f"{os.uname().nodename}:{os.getpid()}",
        "beat": 1,
        "ttl": 1e300,
        "state": "compiling",
        "hint": 1e300,
    }

    @settings(max_examples=10, deadline=timedelta(seconds=5))  # 0.3 s, and its polls
    @given(hostile.records(good, max_bytes=LEASES.max_bytes))
    @example(hostile.dump(good))  # a live holder (this very process), never beating
    @example(hostile.DEEP)
    def run(data: bytes) -> None:
        planted.store.parts.blobs.put_record(LEASES, missing, data)
        assert reader.get(missing, FP.digest) is None  # a miss: now it looks for a lease
        assert reader.flight is not None
        before = reader.parts.counters.snapshot().get("bad_lease_records", 0)
        assert reader.flight.turn(missing, lambda: None) == (None, None)
        try:
            LeaseRecord.decode(data)
        except CorruptObject:
            assert reader.parts.counters.snapshot().get("bad_lease_records", 0) == before + 1

    try:
        run()
    finally:
        reader.close()
        planted.store.parts.blobs.delete_records(LEASES, [missing])
