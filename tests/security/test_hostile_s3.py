"""Issue 38 item 3: hostile records planted in a real moto S3 bucket over HTTP.

A team store (moto S3 + PostgreSQL, signatures required, the writer signing with the
team tests' key) holds KEY and OTHER. Each example plants what the S3 writer policy (or,
for journals, the reader policy) lets anyone put, with boto3 as an attacker would, then
drives the reader (`Store.get`, read-only, no tier), the fold, the identity check and
`pull`. Few examples each (every one is several HTTP round trips), derandomized.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import OpenStore, bucket_of, s3_client
from hypothesis import example, given, settings
from hypothesis import strategies as st

from artifactstore import config
from artifactstore.blobstores.base import JOURNALS, MANIFESTS, WORKING_SETS
from artifactstore.bundles.pull import open_puller, pull
from artifactstore.errors import CorruptObject
from artifactstore.formats import codec
from artifactstore.formats.identity import FORMAT as IDENTITY_FORMAT
from artifactstore.formats.manifest import Manifest
from artifactstore.formats.put import Put
from artifactstore.formats.workingset import WorkingSet
from artifactstore.gc.journals import fold_journals
from artifactstore.index.accesses import fold_accesses
from artifactstore.store import Store, identity
from security import hostile
from security.hostile import FP, KEY, OTHER, PAYLOADS

S3_EXAMPLES = settings(max_examples=8)


class Bucket:
    """The team store's bucket as an attacker holding a policy's calls sees it."""

    def __init__(self, env: dict[str, str]) -> None:
        self.bucket, prefix = bucket_of(env)
        self.base = f"{prefix}/default"
        self.client = s3_client(env)

    def put(self, path: str, body: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=f"{self.base}/{path}", Body=body)

    def get(self, path: str) -> bytes:
        body = self.client.get_object(Bucket=self.bucket, Key=f"{self.base}/{path}")["Body"]
        data: bytes = body.read()
        return data


def _team(team_env: dict[str, str], open_store: OpenStore) -> tuple[Store, Store, Bucket]:
    """(the writer, a read-only reader without a tier, the bucket) holding both entries."""
    writer = open_store(team_env, local_tier="off")
    for key, payload in PAYLOADS.items():
        assert writer.put(
            Put(key, payload, fingerprint=FP, module_name="jit_f", compile_secs=1.5, callbacks=0)
        )
    reader = open_store(dict(team_env, ARTSTORE_READ_ONLY="1"), lazy_index=True, local_tier="off")
    return writer, reader, Bucket(team_env)


def _forged(bucket: Bucket, manifest: bytes) -> bytes:
    """The measured attack: OTHER's executable relabelled as KEY's (unsigned: the attacker
    holds no key), and a manifest for KEY naming it; returns that manifest."""
    other = Manifest.decode(manifest, OTHER)
    meta = codec.ObjectMeta(KEY, "jit_f", 1.5, other.raw_size, "h", FP.to_dict(), callbacks=0)
    forged = codec.encode(PAYLOADS[OTHER], FP.digest, meta)
    bucket.put(f"objects/{forged.digest[:2]}/{forged.digest}", forged.data)
    record = Manifest(
        KEY, forged.digest, FP.digest, 1.5, forged.raw_size, len(forged.data), "jit_f", callbacks=0
    )
    return record.encode()


@pytest.mark.hostile_record("manifest", "object")
def test_hostile_manifests_in_s3_never_make_a_wrong_load(
    team_env: dict[str, str], open_store: OpenStore
) -> None:
    _, reader, bucket = _team(team_env, open_store)
    genuine = {key: bucket.get(f"keys/{key}") for key in PAYLOADS}
    good, other = json.loads(genuine[KEY]), json.loads(genuine[OTHER])
    forged = _forged(bucket, genuine[OTHER])

    @S3_EXAMPLES
    @given(hostile.records(good, max_bytes=MANIFESTS.max_bytes, others=[other]))
    @example(forged)
    @example(genuine[OTHER])
    @example(hostile.DEEP)
    def run(data: bytes) -> None:
        bucket.put(f"keys/{KEY}", data)
        counts = reader.parts.counters.snapshot()
        hit = reader.get(KEY, FP.digest, callbacks=0)
        assert hit is None or hit.payload == PAYLOADS[KEY]
        if data == forged:  # refused for its signature, and counted so
            assert hit is None
            after = reader.parts.counters.snapshot()
            assert after.get("unsigned", 0) == counts.get("unsigned", 0) + 1
        try:
            Manifest.decode(data, KEY)
        except CorruptObject:
            after = reader.parts.counters.snapshot()
            assert after.get("bad_manifest", 0) == counts.get("bad_manifest", 0) + 1
        untouched = reader.get(OTHER, FP.digest, callbacks=0)
        assert untouched is not None and untouched.payload == PAYLOADS[OTHER]

    run()
    bucket.put(f"keys/{KEY}", genuine[KEY])  # the property can hold: the genuine one loads
    hit = reader.get(KEY, FP.digest, callbacks=0)
    assert hit is not None and hit.payload == PAYLOADS[KEY]


def _plantable(name: str) -> bool:
    """A record name the attacker can put in moto's bucket: S3 takes up to 1024 bytes (the
    draw keeps under 300) and any character, but moto's server routes a key with a line
    feed nowhere (its PutObject answers 404), so such a draw would fail the harness, not
    the store, and leave its journals for the next example. Any name, line feeds too, is
    split as a listing's is in test_hostile_records' test_quick_key_record."""
    return 0 < len(name.encode()) < 300 and "\n" not in name


@pytest.mark.hostile_record("hit journal", "quick-key record", "working set", "identity")
def test_fold_pull_and_the_identity_check_over_a_hostile_bucket(
    team_env: dict[str, str], open_store: OpenStore, tmp_path: Path
) -> None:
    writer, _, bucket = _team(team_env, open_store)
    journal = {"v": 1, "a": {KEY: [3, 1.7e9]}, "c": {"misses": 1}}
    ws = {"v": 1, "p": "e" * 40, "f": FP.digest, "e": [[KEY, "AAEC", [0], 0]]}
    real_id = bucket.get("identity") if _has(bucket, "identity") else None
    tiers = iter(range(1000))

    @S3_EXAMPLES
    @given(
        hostile.records(journal, max_bytes=JOURNALS.max_bytes),
        hostile.records(ws, max_bytes=WORKING_SETS.max_bytes),
        st.lists(hostile.names().filter(_plantable), max_size=3),
        hostile.records({"format": IDENTITY_FORMAT, "id": "0123456789abcdef"}, max_bytes=4096),
    )
    @example(hostile.DEEP, hostile.DEEP, ["../x", f"{FP.digest}.../x"], hostile.DEEP)
    def run(body: bytes, working_set: bytes, quick_names: list[str], ident: bytes) -> None:
        bucket.put(f"journals/{uuid.uuid4().hex}", body)
        bucket.put(f"journals/{uuid.uuid4().hex}", hostile.dump(journal))
        bucket.put(f"workingsets/{'e' * 40}", working_set)
        for name in quick_names:
            bucket.put(f"quick/{name}", b"{}")
        fold = fold_journals(writer.parts)
        assert fold.journals >= 1 and fold.hits >= 3 and fold.journals + fold.refused == 2

        tier = tmp_path / f"tier{next(tiers)}"
        env = dict(team_env, ARTSTORE_READ_ONLY="1", ARTSTORE_LOCAL_TIER=str(tier))
        puller = open_puller(config.resolve({}, environ=env))
        report = pull(puller, FP.digest, jobs=2)
        assert report.stopped is None and report.fetched == 2, report
        assert all(name.isalnum() for name in puller.tier.quick._loaded())
        for path in (puller.tier.base / WORKING_SETS.folder).glob("*"):
            assert WorkingSet.decode(path.read_bytes(), path.name).fingerprint == FP.digest

        bucket.put("identity", ident)
        found = identity.check(
            writer.parts.blobs, writer.parts.engine, "default", team_env["ARTSTORE_INDEX"]
        )
        if real_id is None or ident != real_id:
            assert found.state != identity.BOUND  # a forged identity binds nothing
        if real_id is not None:
            bucket.put("identity", real_id)

    run()


def _has(bucket: Bucket, path: str) -> bool:
    try:
        bucket.get(path)
    except Exception as exc:  # botocore's NoSuchKey
        return "NoSuchKey" not in str(exc) and _raise(exc)
    return True


def _raise(exc: Exception) -> Any:
    raise exc


def test_a_journal_claiming_future_times_is_clamped_to_its_own_time(
    team_env: dict[str, str], open_store: OpenStore
) -> None:
    """A reader may put a journal (its policy's only write): what it says about when
    entries were used is bounded by when S3 wrote it (LastModified), not by when gc folds
    it. Measured before: a journal dated a day ahead, folded later, made its entry look
    used at the fold's time, newer than every honest hit in between."""
    writer, _, bucket = _team(team_env, open_store)
    name = uuid.uuid4().hex
    ahead = time.time() + 86400
    bucket.put(f"journals/{name}", json.dumps({"v": 1, "a": {KEY: [1, ahead]}}).encode())
    head = bucket.client.head_object(Bucket=bucket.bucket, Key=f"{bucket.base}/journals/{name}")
    written = head["LastModified"].timestamp()
    time.sleep(2.5)  # gc folds later than the journal was put
    assert fold_journals(writer.parts).journals == 1
    fold_accesses(writer.parts.engine, "default")
    entry = writer.parts.index.lookup(KEY)
    assert entry is not None and entry.hits >= 1
    assert entry.last_access.timestamp() <= written + 1, (entry.last_access, written)
