"""Issue 38 item 3: hostile records of every kind through their decoders.

Each test draws hostile bytes for one kind (tests/security/hostile.py: random, truncated,
oversized, nested, flipped, adversarially valid) and feeds them to the function every such
byte goes through first (artifactstore.blobstores.base.UNTRUSTED_KINDS). The property:
the documented refusal (CorruptObject, ValueError, BundleError, None) or a value within
the kind's invariants, never another exception and never a value that names something
other than what was asked for. The real paths (reader, gc, fold, pull, import, tier) are
in test_hostile_paths.py and test_hostile_tier.py.
"""

from __future__ import annotations

import json
import string

import pytest
import zstandard
from conftest import TEAM_PUB
from hypothesis import example, given
from hypothesis import strategies as st

from artifactstore.config import keyfiles
from artifactstore.errors import CorruptObject, OverLimit
from artifactstore.formats import codec, identity, named, quick
from artifactstore.formats.bundle import BundleError, member_digest, parse_manifest
from artifactstore.formats.journal import MAX_JOURNAL_BYTES, Journal
from artifactstore.formats.lease import MAX_LEASE_BYTES, LeaseRecord
from artifactstore.formats.manifest import MAX_MANIFEST_BYTES, Manifest
from artifactstore.formats.workingset import (
    MAX_HINT_BYTES,
    MAX_OPTIONS_BYTES,
    MAX_WORKING_SET_BYTES,
    MAX_WORKING_SET_KEYS,
    Hint,
    WorkingEntry,
    WorkingSet,
)
from artifactstore.index.accesses import clean_touches
from artifactstore.named import container
from artifactstore.store import removed
from security import hostile

FP, KEY, OTHER, SIGNER = hostile.FP, hostile.KEY, hostile.OTHER, hostile.SIGNER
PROGRAM = "c" * 40
HEX = set(string.hexdigits.lower())
TRUSTED = keyfiles.load_trusted_keys(str(TEAM_PUB))
PAYLOAD = b"the executable stored for KEY" * 8


def _manifest(key: str, digest: str) -> dict[str, object]:
    return {
        "v": 1,
        "d": digest,
        "f": FP.digest,
        "c": 1.5,
        "k": key,
        "r": 232,
        "s": 400,
        "m": "jit_f",
        "cb": 0,
        "sg": "team-tests",
    }


GOOD_MANIFEST = _manifest(KEY, "a" * 64)
OTHER_MANIFEST = _manifest(OTHER, "b" * 64)


@pytest.mark.hostile_record("manifest")
@given(hostile.records(GOOD_MANIFEST, max_bytes=MAX_MANIFEST_BYTES, others=[OTHER_MANIFEST]))
@example(hostile.DEEP)
@example(hostile.DEEP_FIELD)
@example(hostile.HUGE_NUMBER)
def test_manifest(data: bytes) -> None:
    try:
        found = Manifest.decode(data, KEY)
    except CorruptObject:
        return
    assert found.key == KEY  # never another entry's record
    assert set(found.digest) <= HEX and len(found.digest) == 64
    assert found.raw_size >= 0 and found.size >= 0 and 0 <= found.compile_secs < 1e9


@pytest.mark.hostile_record("quick-key record")
@given(hostile.names(), hostile.records({"v": 1, "c": 0.01}, max_bytes=quick.MAX_QUICK_BYTES))
@example("../x", hostile.DEEP)
@example("a" * 64 + ".../x", hostile.HUGE_NUMBER)
def test_quick_key_record(name: str, body: bytes) -> None:
    try:
        fingerprint, key = quick.split_quick_name(name)
    except ValueError:
        pass
    else:  # both become parts of names: letters and digits only
        assert fingerprint.isalnum() and key.isalnum() and len(key) <= 128
    try:
        secs = quick.decode(body)
    except CorruptObject:
        return
    assert 0 <= secs < 1e9


GOOD_JOURNAL = {
    "v": 1,
    "a": {KEY: [3, 1.7e9]},
    "c": {"misses": 2},
    "u": [["2026-01-01", FP.digest, {"hits": 3}]],
}


@pytest.mark.hostile_record("hit journal")
@given(hostile.records(GOOD_JOURNAL, max_bytes=MAX_JOURNAL_BYTES))
@example(hostile.DEEP)
@example(hostile.DEEP_FIELD)
@example(hostile.HUGE_NUMBER)
def test_hit_journal(data: bytes) -> None:
    try:
        journal = Journal.decode(data)
    except CorruptObject:
        return
    touches = clean_touches(journal.accesses)  # the fold's checks and clamps
    assert all(n >= 0 for n, _ in touches.values())


def _working_set(version: int = 1) -> dict[str, object]:
    row: list[object] = [KEY, "AAEC", [0, 1], 0] + (["jit"] if version > 1 else [])
    return {"v": version, "p": PROGRAM, "f": FP.digest, "e": [row]}


GENUINE_ENTRIES = (WorkingEntry(KEY, b"\x00\x01\x02", (0, 1), 0),)
SIGNED_SET = WorkingSet(PROGRAM, FP.digest, GENUINE_ENTRIES).encode(SIGNER, "default")


@pytest.mark.hostile_record("working set")
@given(
    st.one_of(
        st.sampled_from([1, 2]).flatmap(
            lambda v: hostile.records(_working_set(v), max_bytes=MAX_WORKING_SET_BYTES)
        ),
        hostile.records(json.loads(SIGNED_SET), max_bytes=MAX_WORKING_SET_BYTES),
    )
)
@example(hostile.DEEP)
@example(hostile.DEEP_FIELD)
@example(hostile.HUGE_NUMBER)
@example(SIGNED_SET)
def test_working_set(data: bytes) -> None:
    """Decoded within its bounds, and followed (where signatures are required) only as
    the trusted writer signed it: no altered set passes `refusal`."""
    try:
        found = WorkingSet.decode(data, PROGRAM)
    except CorruptObject:
        return
    assert found.program == PROGRAM and len(found.entries) <= MAX_WORKING_SET_KEYS
    for entry in found.entries:
        assert entry.key.isalnum() and len(entry.options) <= MAX_OPTIONS_BYTES
        assert entry.kind in ("jit", "named") and entry.callbacks >= 0
        assert all(type(d) is int and d >= 0 for d in entry.devices)
    if found.refusal(TRUSTED, "default") is None:
        assert found.entries == GENUINE_ENTRIES and found.fingerprint == FP.digest
    assert found.refusal(TRUSTED, "elsewhere") is not None  # signed for one namespace only


@pytest.mark.hostile_record("working set hint")
@given(hostile.records({"v": 1, "f": FP.digest, "pl": "cpu"}, max_bytes=MAX_HINT_BYTES))
@example(hostile.DEEP)
@example(hostile.DEEP_FIELD)
@example(hostile.HUGE_NUMBER)
def test_working_set_hint(data: bytes) -> None:
    try:
        hint = Hint.decode(data)
    except CorruptObject:
        return
    assert hint.platform.isascii() and len(hint.platform) <= 32 and len(hint.fingerprint) == 64


GOOD_LEASE = {"v": 1, "holder": "host:1", "beat": 3, "ttl": 30.0, "state": "compiling", "hint": 2.0}


@pytest.mark.hostile_record("lease record")
@given(hostile.records(GOOD_LEASE, max_bytes=MAX_LEASE_BYTES))
@example(hostile.DEEP)
@example(hostile.DEEP_FIELD)
@example(hostile.HUGE_NUMBER)
def test_lease_record(data: bytes) -> None:
    try:
        record = LeaseRecord.decode(data)
    except CorruptObject:
        return
    assert record.state in ("compiling", "abandoned") and 0 <= record.beat < 2**63
    assert record.ttl > 0 and record.ttl != float("inf") and len(record.holder) <= 255


@pytest.mark.hostile_record("identity")
@given(hostile.records({"format": identity.FORMAT, "id": "0123456789abcdef"}, max_bytes=4096))
@example(hostile.DEEP)
@example(hostile.DEEP_FIELD)
@example(hostile.HUGE_NUMBER)
def test_identity(data: bytes) -> None:
    try:
        store_id = identity.decode(data)
    except ValueError:  # the pair is then a MISMATCH: nothing is written or deleted
        return
    assert store_id.isalnum() and 8 <= len(store_id) <= 64


def _record(key: str, digest: str) -> dict[str, object]:
    return {
        "key": key,
        "namespace": "default",
        "module_name": "jit_f",
        "fingerprint": FP.to_dict(),
        "fingerprint_digest": FP.digest,
        "digest": digest,
        "size": 400,
        "raw_size": 232,
        "compile_secs": 1.5,
        "callbacks": 0,
        "producer_host": "h",
        "signer": None,
        "signature": None,
    }


GOOD_BUNDLE = {
    "format": "artifactstore-bundle",
    "version": 1,
    "created": "2026-01-01",
    "artifactstore": "0.4",
    "namespace": "default",
    "entries": [_record(KEY, "a" * 64)],
}


@pytest.mark.hostile_record("bundle manifest")
@given(
    st.one_of(
        hostile.records(GOOD_BUNDLE, max_bytes=65536),
        hostile.altered(_record(KEY, "a" * 64), [_record(OTHER, "b" * 64)]).map(
            lambda r: hostile.dump(dict(GOOD_BUNDLE, entries=[r, r]))
        ),
    )
)
@example(hostile.DEEP)
@example(hostile.DEEP_FIELD)
@example(hostile.HUGE_NUMBER)
def test_bundle_manifest(data: bytes) -> None:
    try:
        found = parse_manifest(data)
    except BundleError:
        return
    assert len({r.key for r in found.records}) == len(found.records)
    for record in found.records:
        assert record.platform().digest == record.fingerprint_digest


@pytest.mark.hostile_record("bundle member")
@given(hostile.names().map(lambda n: "objects/" + n) | hostile.names())
def test_bundle_member_name(name: str) -> None:
    digest = member_digest(name)
    assert digest is None or (len(digest) == 64 and set(digest) <= HEX)


def _header() -> dict[str, object]:
    sig = {"tree": "*", "leaves": [{"shape": [2], "dtype": "float32", "sharding": None}]}
    return {
        "kind": "native",
        "name": "t/step",
        "version": "1",
        "inputs": sig,
        "outputs": sig,
        "jax_version": "0.12",
        "devices": [0],
        "platform": "cpu",
    }


@pytest.mark.hostile_record("named payload header")
@given(
    st.one_of(
        hostile.records(_header(), max_bytes=4096).map(lambda h: named.frame({}, b"")[:-2] + h),
        hostile.altered(_header()).map(lambda h: named.frame(h, b"body")),
        hostile.nested().map(lambda h: named.MAGIC + bytes([1]) + len(h).to_bytes(4, "big") + h),
        st.binary(max_size=64).map(lambda b: named.MAGIC + b),
    )
)
@example(named.MAGIC + bytes([1]) + len(hostile.DEEP).to_bytes(4, "big") + hostile.DEEP)
def test_named_payload_header(payload: bytes) -> None:
    try:
        header, _ = named.unframe(payload)
    except CorruptObject:
        return
    devices = named.native_devices(header)
    assert devices is None or all(type(d) is int and d >= 0 for d in devices)
    try:
        container.parse_header(header)
    except CorruptObject:
        pass


@pytest.mark.hostile_record("named removal record")
@given(
    hostile.names(),
    hostile.records({"v": 1, "name": "t/step", "version": "1", "removed": 1.7e9}, max_bytes=1024),
)
@example("0" * 64 + ".removed/../x", hostile.DEEP)
def test_named_removal_record(name: str, data: bytes) -> None:
    """Its name is checked as a record name; its body only dates a message: any bytes
    give a time or none, and the message is one line either way."""
    try:
        named.check_removed_name(name)
    except ValueError:
        pass
    else:
        assert name.removesuffix(".removed").isalnum()
    when = named.removed_at(data)
    assert when is None or (type(when) is int and when >= 0)
    line = removed.describe("t/step", "1", data)
    assert "\n" not in line and line.startswith("t/step@1 was removed")


def _signed(key: str, payload: bytes) -> bytes:
    meta = codec.ObjectMeta(key, "jit_f", 1.5, len(payload), "h", FP.to_dict(), callbacks=0)
    return codec.encode(payload, FP.digest, meta, signer=SIGNER, namespace="default").data


GOOD_OBJECT = _signed(KEY, PAYLOAD)
OTHER_OBJECT = _signed(OTHER, b"another entry's executable" * 8)
UNSIGNED = codec.encode(
    b"forged" * 40,
    FP.digest,
    codec.ObjectMeta(KEY, "jit_f", 1.5, 240, "h", FP.to_dict(), callbacks=0),
).data


def _mutate(args: tuple[bytes, int, int, bytes]) -> bytes:
    data, at, cut, tail = args
    at %= len(data)
    return data[:at] + tail + data[at + cut :]


@pytest.mark.hostile_record("object")
@given(
    st.one_of(
        st.tuples(
            st.sampled_from([GOOD_OBJECT, OTHER_OBJECT, UNSIGNED]),
            st.integers(0, 10**6),
            st.integers(0, 64),
            st.binary(max_size=48),
        ).map(_mutate),
        st.sampled_from([OTHER_OBJECT, UNSIGNED, GOOD_OBJECT + b"\0", GOOD_OBJECT[:-1]]),
        st.binary(max_size=256).map(
            lambda b: codec.MAGIC + bytes([1]) + bytes.fromhex(FP.digest) + b
        ),
        st.integers(1, 2**40).map(
            lambda n: (
                codec.MAGIC
                + bytes([1])
                + bytes.fromhex(FP.digest)
                + zstandard.ZstdCompressor().compress(b"x")[:4]
                + n.to_bytes(8, "little")
            )
        ),
    )
)
def test_object(data: bytes) -> None:
    """Asked for KEY with its record's sizes and trusted keys, as every reader asks: only
    the object stored for KEY, signed by a trusted key, ever decodes, and only to its
    payload, whatever digest the record that led here named."""
    try:
        payload = codec.decode(
            data,
            digest=codec.digest_of(data),
            fingerprint=FP.digest,
            key=KEY,
            callbacks=0,
            raw_size=len(PAYLOAD),
            max_raw_size=1 << 20,
            trusted=TRUSTED,
            namespace="default",
        )
    except (CorruptObject, OverLimit):
        return
    assert payload == PAYLOAD


def test_the_properties_can_fail() -> None:
    """The properties above are not vacuous: the genuine object decodes, the genuine
    signed working set is followed."""
    got = codec.decode(
        GOOD_OBJECT,
        digest=codec.digest_of(GOOD_OBJECT),
        fingerprint=FP.digest,
        key=KEY,
        trusted=TRUSTED,
        namespace="default",
    )
    assert got == PAYLOAD
    assert json.loads(Manifest(KEY, "a" * 64, FP.digest, 1, 1, 1, "m").encode())["k"] == KEY
    signed = WorkingSet.decode(SIGNED_SET, PROGRAM)
    assert signed.refusal(TRUSTED, "default") is None and signed.entries == GENUINE_ENTRIES
