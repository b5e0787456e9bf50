"""The one verifier (store.verify): each refusal reason and each entry kind, and the
levels above it: `peek` only reads, `settle` pays what a refusal costs."""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from artifactstore import config
from artifactstore.blobstores.local import LocalBlobStore
from artifactstore.config import host
from artifactstore.errors import CorruptObject, OverLimit
from artifactstore.formats import codec, frames, torchxla
from artifactstore.formats import named as named_format
from artifactstore.formats.fingerprint import Fingerprint
from artifactstore.formats.manifest import Manifest
from artifactstore.formats.put import Put
from artifactstore.formats.signing import SigningKey, TrustedKeys
from artifactstore.store import Store
from artifactstore.store.chain import Found, Missed
from artifactstore.store.read import Looked, Refused
from artifactstore.store.removed import RemovedVersion
from artifactstore.store.tier import LocalTier, TierMiss
from artifactstore.store.verify import (
    EXECUTABLE,
    NAMED,
    REASONS,
    SIGNATURE_REASONS,
    TORCH_XLA,
    Expected,
    Refusal,
    Verified,
    refusal,
    verify,
)

KEY, OTHER = "a1" * 32, "b2" * 32
NS = "ns"


def _fp(platform: str = "cpu") -> Fingerprint:
    return host.compute(platform_name=platform, platform_version="v", device_kind="cpu",
                        device_count=1, jax_version="1", jaxlib_version="1")  # fmt: skip


FP = _fp()


def _keys(name: str = "ci-1") -> tuple[SigningKey, TrustedKeys]:
    private = Ed25519PrivateKey.generate()
    public = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return SigningKey(name, "<test>", private), TrustedKeys(((name, public),))


SIGNER, TRUSTED = _keys()


def _object(
    payload: bytes = b"payload",
    *,
    key: str = KEY,
    module: str = "jit_f",
    signer: SigningKey | None = None,
    meta: bool = True,
    callbacks: int | None = 0,
    fingerprint: str = FP.digest,
) -> codec.Encoded:
    info = codec.ObjectMeta(key=key, module_name=module, compile_secs=1.0,
                            raw_size=len(payload), producer_host="h",
                            fingerprint=FP.to_dict(), callbacks=callbacks)  # fmt: skip
    namespace = NS if signer is not None else None
    return codec.encode(
        payload, fingerprint, info if meta else None, signer=signer, namespace=namespace
    )


def _expect(obj: codec.Encoded | bytes, **kw: object) -> Expected:
    data = obj.data if isinstance(obj, codec.Encoded) else obj
    fields: dict[str, object] = {
        "digest": codec.digest_of(data),
        "fingerprint": FP.digest,
        "namespace": NS,
        "key": KEY,
    }
    return Expected(**{**fields, **kw})  # type: ignore[arg-type]


def _reason(data: bytes, expected: Expected) -> str:
    out = verify(data, expected)
    assert isinstance(out, Refusal), out
    assert out.reason in (*REASONS, "named_removed") and str(out)
    return out.reason


# -- the verifier -------------------------------------------------------------
def test_an_intact_object_yields_its_payload_and_kind() -> None:
    obj = _object(signer=SIGNER)
    out = verify(obj.data, _expect(obj, trusted=TRUSTED, callbacks=0, raw_size=7))
    assert out == Verified(b"payload", EXECUTABLE, codec.read_meta(obj.data))
    # Without trusted keys the signature is not asked for; an object of 0.1 (no metadata).
    assert isinstance(verify(_object().data, _expect(_object())), Verified)
    old = _object(meta=False)
    assert verify(old.data, _expect(old)) == Verified(b"payload", EXECUTABLE, None)


def test_each_damage_is_corrupt_and_only_it_may_cost_the_object() -> None:
    obj = _object()
    assert _reason(obj.data, _expect(obj, digest="0" * 64)) == "corrupt"  # digest
    broken = bytearray(obj.data)
    broken[frames.HEADER_LEN + 6] ^= 0xFF  # the payload frame, the digest made to match
    assert _reason(bytes(broken), _expect(bytes(broken))) == "corrupt"
    assert _reason(obj.data, _expect(obj, raw_size=8)) == "corrupt"  # sizes disagree
    no_envelope = b"not an object"
    assert _reason(no_envelope, _expect(no_envelope)) == "corrupt"
    refused = verify(obj.data, _expect(obj, digest="0" * 64))
    assert isinstance(refused, Refusal) and refused.damaged and not refused.signature


def test_intact_objects_for_another_platform_key_or_trace_are_refused_not_damaged() -> None:
    obj = _object()
    cases = {
        "fingerprint_mismatch": _expect(obj, fingerprint=_fp("gpu").digest),
        "wrong_entry": _expect(obj, key=OTHER),
        "callback_mismatch": _expect(obj, callbacks=2),
        "over_limit": _expect(obj, max_raw_size=3),
    }
    for reason, expected in cases.items():
        out = verify(obj.data, expected)
        assert isinstance(out, Refusal) and out.reason == reason, (reason, out)
        assert not out.damaged and not out.signature


def test_signature_refusals() -> None:
    unsigned = _object()
    assert _reason(unsigned.data, _expect(unsigned, trusted=TRUSTED)) == "unsigned"
    stranger, _ = _keys("stranger")
    foreign = _object(signer=stranger)
    assert _reason(foreign.data, _expect(foreign, trusted=TRUSTED)) == "untrusted_key"
    signed = _object(signer=SIGNER)
    other_ns = _expect(signed, trusted=TRUSTED, namespace="other")
    assert _reason(signed.data, other_ns) == "bad_signature"
    for data, expected in (
        (unsigned.data, _expect(unsigned, trusted=TRUSTED)),
        (signed.data, other_ns),
    ):
        out = verify(data, expected)
        assert isinstance(out, Refusal) and out.signature and not out.damaged
    assert set(SIGNATURE_REASONS) <= set(REASONS)


def test_metadata_required_is_asked_after_damage_and_platform() -> None:
    old = _object(meta=False)
    assert _reason(old.data, _expect(old, with_metadata=True)) == "without_metadata"
    # A damaged or foreign object is named as such, not as one without metadata.
    assert _reason(old.data, _expect(old, with_metadata=True, digest="0" * 64)) == "corrupt"
    foreign = _expect(old, with_metadata=True, fingerprint=_fp("gpu").digest)
    assert _reason(old.data, foreign) == "fingerprint_mismatch"
    with_meta = _object()
    assert isinstance(verify(with_meta.data, _expect(with_meta, with_metadata=True)), Verified)


def _torch_xla_key(name: str) -> str:
    return torchxla.entry_key(FP.digest, name)


def test_torch_xla_files_are_checked_as_their_kind() -> None:
    key = _torch_xla_key("123")
    good = _object(torchxla.frame("123", b"file"), key=key, module=torchxla.module_name("123"))
    out = verify(good.data, _expect(good, key=key))
    assert isinstance(out, Verified) and out.kind == TORCH_XLA
    # Signed and bound to its key, but its frame names another graph's file: placing it
    # would put one graph's executable under another's name.
    swapped = _object(torchxla.frame("456", b"file"), key=key, module=torchxla.module_name("123"))
    assert _reason(swapped.data, _expect(swapped, key=key)) == "malformed"
    unframed = _object(b"raw bytes", key=key, module=torchxla.module_name("123"))
    out = verify(unframed.data, _expect(unframed, key=key))
    assert isinstance(out, Refusal) and out.reason == "malformed" and not out.damaged


def test_named_payloads_are_checked_as_their_kind() -> None:
    payload = named_format.frame({"kind": "native"}, b"body")
    good = _object(payload, module="named:f@1")
    out = verify(good.data, _expect(good))
    assert isinstance(out, Verified) and out.kind == NAMED and out.payload == payload
    bare = _object(b"an executable", module="named:f@1")
    assert _reason(bare.data, _expect(bare)) == "malformed"


def test_refusal_names_each_check_exception() -> None:
    assert refusal(codec.Unsigned("u")).reason == "unsigned"
    assert refusal(OverLimit("o")).reason == "over_limit"
    assert refusal(codec.FingerprintMismatch("f")).reason == "fingerprint_mismatch"
    assert refusal(codec.WrongEntry("w")).reason == "wrong_entry"
    assert refusal(codec.CallbackMismatch("c")).reason == "callback_mismatch"
    assert refusal(CorruptObject("c")).reason == "corrupt"
    removed = refusal(RemovedVersion("gone"))
    assert removed.reason == "named_removed" and not removed.signature and not removed.damaged


# -- the levels: peek reads, settle pays ----------------------------------------
def _store(tmp_path: Path) -> Store:
    return Store.open(config.resolve({"url": str(tmp_path / "s")}, environ={}))


def _objects(root: Path) -> list[Path]:
    return sorted(p for p in (root / "s").rglob("objects/*/*") if p.is_file())


def test_the_store_read_path_peek_writes_nothing(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.put(Put(KEY, b"payload", FP, "m", 1.0, callbacks=0))
    (obj,) = _objects(tmp_path)
    obj.write_bytes(obj.read_bytes()[:-3] + b"xyz")
    before = store.parts.counters.snapshot()
    looked = store.parts.reads.peek(KEY, FP.digest, callbacks=0)
    assert isinstance(looked, Refused) and looked.reason == "corrupt"
    assert looked.refusal is not None and looked.refusal.damaged
    assert obj.exists() and store.parts.index.lookup(KEY) is not None  # nothing quarantined
    assert store.parts.counters.snapshot() == before
    # The store level's price: the damaged object quarantined, its entry dropped.
    assert store.parts.reads.settle(KEY, looked) == Missed("corrupt")
    assert not obj.exists() and store.parts.index.lookup(KEY) is None
    store.close()


def test_a_hit_is_remembered_in_the_tier_only_when_settled(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.put(Put(KEY, b"payload", FP, "m", 1.0, callbacks=0))
    tier = LocalTier(LocalBlobStore(tmp_path / "tier", "default"), owns_objects=True)
    store.parts.tier = tier
    looked = store.parts.reads.peek(KEY, FP.digest, callbacks=0)
    assert isinstance(looked, Looked) and looked.payload == b"payload"
    assert tier.lookup(KEY) is None  # peek remembered nothing
    settled = store.parts.reads.settle(KEY, looked)
    assert isinstance(settled, Found) and settled.payload == b"payload"  # the lookup's result
    assert tier.lookup(KEY) is not None
    store.close()


def test_the_tier_peek_writes_nothing(tmp_path: Path) -> None:
    tier = LocalTier(LocalBlobStore(tmp_path / "tier", "default"), owns_objects=True)
    obj = _object()
    tier.remember(KEY, Manifest.of(_Row(obj)), obj.data)
    (copy,) = sorted(p for p in (tmp_path / "tier").rglob("objects/*/*") if p.is_file())
    copy.write_bytes(copy.read_bytes()[:-3] + b"xyz")
    looked = tier.peek(KEY, FP.digest, callbacks=0)
    assert isinstance(looked, TierMiss) and looked.forget
    assert looked.refusal is not None and looked.refusal.reason == "corrupt"
    assert copy.exists() and tier.lookup(KEY) is not None  # still there after a look
    assert tier.settle(KEY, looked) is None
    assert not copy.exists() and tier.lookup(KEY) is None  # the tier's price: both dropped


def test_a_tier_hit_touches_its_copy_only_when_settled(tmp_path: Path) -> None:
    tier = LocalTier(LocalBlobStore(tmp_path / "tier", "default"), owns_objects=True)
    obj = _object()
    tier.remember(KEY, Manifest.of(_Row(obj)), obj.data)
    (copy,) = sorted(p for p in (tmp_path / "tier").rglob("objects/*/*") if p.is_file())
    os.utime(copy, (1.0, 1.0))
    looked = tier.peek(KEY, FP.digest, callbacks=0)
    assert isinstance(looked, Found) and copy.stat().st_mtime == 1.0
    assert tier.settle(KEY, looked) is looked and copy.stat().st_mtime > 1.0


def test_a_malformed_torch_xla_entry_is_refused_by_the_store_and_by_pull(tmp_path: Path) -> None:
    """Before one verifier, a torch-xla file's frame was checked only by the adapter
    that places it: `artstore pull` and bundles kept a signed entry whose frame names
    another graph. Now every level refuses it (a miss, never quarantined)."""
    store = _store(tmp_path)
    key = _torch_xla_key("123")
    platform = _fp("torch-xla")
    payload = torchxla.frame("456", b"file")
    store.put(Put(key, payload, platform, torchxla.module_name("123"), 1.0, callbacks=0))
    entry = store.parts.index.lookup(key)
    assert entry is not None
    data = store.parts.reads.fetch_object(entry)
    assert data is not None
    checked = store.parts.reads.verify(
        entry, data, platform.digest
    )  # what pull, import and export ask
    assert isinstance(checked, Refusal) and checked.reason == "malformed"
    assert store.get(key, platform.digest, callbacks=0) is None
    assert store.parts.counters.snapshot().get("malformed") == 1
    assert _objects(tmp_path)  # intact bytes: not quarantined
    store.close()


class _Row:
    """An index row's fields for `Manifest.of`, from an encoded object."""

    def __init__(self, obj: codec.Encoded) -> None:
        self.key, self.digest, self.fingerprint = KEY, obj.digest, FP.digest
        self.compile_secs, self.raw_size, self.size = 1.0, obj.raw_size, len(obj.data)
        self.module_name, self.signer = "jit_f", None
