"""The object envelope: what bytes in the object store look like.

An object is `MAGIC | version | fingerprint digest (32 bytes) | zstd(payload)
[| metadata frame]` and is named by the sha256 of all of it. The fingerprint
inside the object lets a reader refuse an executable built for another platform
even if the index row that led to it is wrong, before a single byte reaches JAX.

The metadata frame (written since 0.2; optional, so older objects stay valid)
names the entry the object was stored for: its key, module, compile time and
full fingerprint. It binds the object to its key (a reader asking for another
key refuses it, so swapped index rows cannot make a program load another
program) and lets `artstore db rebuild` recreate a lost index from the objects
alone. It is a zstd *skippable frame* after the payload's frame, so readers
that predate it (which decompress one frame and ignore what follows) still
read these objects: no envelope version bump, old and new clients share a store.
Its body is JSON, followed by its length and `META_MAGIC`, so it is found from
the end without parsing the payload.

The signature frame (optional; see `artifactstore.formats.signing`) is a second skippable
frame after the metadata frame, found from the end by its own footer (`SIG_MAGIC`).
Its body is JSON {"k": key name, "s": base64 Ed25519 signature} over
`signing.message(...)`, which covers the sha256 of every byte before the frame (the
*content digest*) and the entry's namespace, key, fingerprint, callback count and raw
size. The object is still named by the sha256 of all its bytes. Readers with trusted
keys verify it before inflating anything; readers without ignore it, and so do
readers that predate it (0.1 reads one frame; 0.2 finds no metadata footer at the
end and reads the payload frame).

Where each frame starts and ends (header, footers, zstd) is `formats.frames`; this
module says what they mean and checks them.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import zstandard

from artifactstore.errors import CorruptObject, OverLimit
from artifactstore.formats.frames import (
    FORMAT_VERSION,
    HEADER_LEN,
    MAGIC,
    META_MAGIC,
    META_VERSION,
    SIG_MAGIC,
    bounds,
    compressor,
    declared_size,
    decompressor,
    envelope_fingerprint,
    signature_bounds,
    skippable,
    split_signature,
)
from artifactstore.formats.frames import digests as frame_digests
from artifactstore.formats.sizes import format_limit, format_size

if TYPE_CHECKING:
    from artifactstore.formats.signing import SigningKey, TrustedKeys

__all__ = [
    "BadSignature",
    "CallbackMismatch",
    "CorruptObject",
    "FingerprintMismatch",
    "OverLimit",
    "SignatureRefused",
    "Unsigned",
    "UntrustedKey",
    "WrongEntry",
    "envelope_fingerprint",
    "split_signature",
]


def digest_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


_DIGEST_RE = re.compile(r"[0-9a-f]{64}")


def check_digest(digest: str) -> str:
    """`digest` if it is what `digest_of` returns for some bytes; else ValueError."""
    if not isinstance(digest, str) or not _DIGEST_RE.fullmatch(digest):
        raise ValueError(f"not a sha256 hex digest: {str(digest)[:80]!r}")
    return digest


@dataclass(frozen=True)
class Encoded:
    data: bytes
    digest: str
    raw_size: int
    signer: str | None = None  # the signing key's name, for the index
    signature: str | None = None  # base64


@dataclass(frozen=True)
class Signature:
    signer: str
    signature: bytes

    @property
    def b64(self) -> str:
        return base64.b64encode(self.signature).decode()


@dataclass(frozen=True)
class ObjectMeta:
    """The entry an object was stored for (see the module docstring)."""

    key: str
    module_name: str
    compile_secs: float
    raw_size: int
    producer_host: str
    fingerprint: dict[str, Any]  # Fingerprint.to_dict(): the index's platform columns
    # How many host callbacks the executable calls by index (0: none); None where the
    # writer did not say (objects of 0.2.0 and before). Checked against the loading
    # trace's before deserializing: too few callbacks crash natively on execute.
    callbacks: int | None = None

    def to_bytes(self) -> bytes:
        body: dict[str, Any] = {
            "v": META_VERSION,
            "key": self.key,
            "module": self.module_name,
            "compile_secs": self.compile_secs,
            "raw_size": self.raw_size,
            "host": self.producer_host,
            "fingerprint": self.fingerprint,
        }
        if self.callbacks is not None:
            body["callbacks"] = self.callbacks
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> ObjectMeta:
        try:
            body = json.loads(raw)
            return cls(
                key=str(body["key"]),
                module_name=str(body["module"]),
                compile_secs=float(body["compile_secs"]),
                raw_size=int(body["raw_size"]),
                producer_host=str(body["host"]),
                fingerprint=dict(body["fingerprint"]),
                callbacks=None if body.get("callbacks") is None else int(body["callbacks"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptObject(f"object metadata is unreadable: {exc}") from None


def encode(
    payload: bytes,
    fingerprint_digest: str,
    meta: ObjectMeta | None = None,
    *,
    signer: SigningKey | None = None,
    namespace: str | None = None,
) -> Encoded:
    """The object for `payload`; signed by `signer` for `namespace` when given (which
    needs `meta`: the signature covers the entry it names)."""
    fp = bytes.fromhex(fingerprint_digest)
    if len(fp) != 32:
        raise ValueError("fingerprint digest must be a sha256 hex digest")
    if signer is not None and namespace is None:
        raise ValueError("signing needs the namespace the entry is stored in")
    data = MAGIC + bytes([FORMAT_VERSION]) + fp + compressor().compress(payload)
    if meta is not None:
        data += skippable(meta.to_bytes(), META_MAGIC)
    if signer is not None:
        assert namespace is not None
        return sign(data, signer, namespace)
    return Encoded(data=data, digest=digest_of(data), raw_size=len(payload))


def _signed_message(
    unsigned: bytes | memoryview,
    meta: ObjectMeta,
    namespace: str,
    content_digest: str | None = None,
) -> bytes:
    from artifactstore.formats.signing import message

    return message(
        namespace=namespace,
        key=meta.key,
        content_digest=content_digest or hashlib.sha256(unsigned).hexdigest(),
        fingerprint_digest=bytes(unsigned[len(MAGIC) + 1 : HEADER_LEN]).hex(),
        callbacks=meta.callbacks,
        raw_size=meta.raw_size,
    )


def sign(data: bytes, signer: SigningKey, namespace: str) -> Encoded:
    """`data` (an object, signed or not) with a signature by `signer` for `namespace`
    in place of any it had. The object must carry its metadata. One sha256 pass."""
    _, meta_body, end = bounds(data)
    if meta_body is None or not data.startswith(MAGIC) or len(data) < HEADER_LEN:
        raise CorruptObject("only objects that carry their entry's metadata can be signed")
    meta = ObjectMeta.from_bytes(meta_body)
    unsigned = memoryview(data)[:end]
    h = hashlib.sha256(unsigned)
    signed = _signed_message(unsigned, meta, namespace, h.hexdigest())
    sig = Signature(signer.name, signer.sign(signed))
    body = json.dumps({"k": sig.signer, "s": sig.b64}, sort_keys=True).encode()
    tail = skippable(body, SIG_MAGIC)
    h.update(tail)
    out = data + tail if end == len(data) else bytes(unsigned) + tail
    return Encoded(out, h.hexdigest(), meta.raw_size, signer=sig.signer, signature=sig.b64)


def _parse_signature(body: bytes) -> Signature | None:
    try:
        raw = json.loads(body)
        name, b64 = raw["k"], raw["s"]
        if not isinstance(name, str) or not isinstance(b64, str):
            return None
        sig = base64.b64decode(b64, validate=True)
    except (ValueError, KeyError, TypeError):
        return None
    return Signature(name[:64], sig)


def read_signature(data: bytes) -> Signature | None:
    """Who signed `data` (not checked: see `check_signature`); None if unsigned or unreadable."""
    _, body = split_signature(data)
    return None if body is None else _parse_signature(body)


def check_signature(
    data: bytes,
    trusted: TrustedKeys,
    namespace: str,
    *,
    key: str | None = None,
    digests: tuple[str, str] | None = None,
) -> Signature:
    """The signature of `data` by one of `trusted` for `namespace` (and `key`), or raise
    `Unsigned`, `UntrustedKey` or `BadSignature`. Reads no payload. `digests`: (the
    object's digest, the digest of its bytes before the signature frame) where the
    caller has them (`decode` hashes the object once for both)."""
    end, body = signature_bounds(data)
    if digests is None:
        digests = frame_digests(data, end)
    short, content = digests[0][:12], digests[1]
    if body is None:
        raise Unsigned(f"object {short} is unsigned")
    sig = _parse_signature(body)
    if sig is None:
        raise BadSignature(f"object {short} has an unreadable signature")
    if not trusted.knows(sig.signer):
        raise UntrustedKey(f"object {short} is signed by key {sig.signer!r}, which is not trusted")
    _, meta_body, _ = bounds(data)
    if meta_body is None:
        raise BadSignature(f"object {short} is signed but carries no entry metadata")
    meta = ObjectMeta.from_bytes(meta_body)
    if key is not None and meta.key != key:
        raise WrongEntry(f"object {short} was stored for key {meta.key[:12]}, not {key[:12]}")
    signed = _signed_message(memoryview(data)[:end], meta, namespace, content)
    if not trusted.verify(sig.signer, sig.signature, signed):
        if trusted.lists_secret(sig.signer, sig.signature, signed):
            raise SecretKeyListed(
                f"ARTSTORE_TRUSTED_KEYS lists key {sig.signer!r} as its secret key (a .key "
                f"file's contents), not its public key: list {sig.signer}.pub instead, and "
                "rotate the key (it was exposed wherever that setting was)"
            )
        raise BadSignature(
            f"object {short} has a bad signature by key {sig.signer!r} "
            f"(altered, or signed for another namespace than {namespace!r})"
        )
    return sig


def read_meta(data: bytes) -> ObjectMeta | None:
    """The entry `data` was stored for; None for objects that predate metadata."""
    _, body, _ = bounds(data)
    return None if body is None else ObjectMeta.from_bytes(body)


@dataclass(frozen=True)
class Expected:
    """What an object's bytes must be: the object `digest` of entry `key`, for `fingerprint`;
    signed by one of `trusted` for `namespace` and key (None: unchecked); for `callbacks`
    host callbacks; inflating to `raw_size` (the record's), at most `max_raw_size` (this
    reader's bound); `with_metadata`: naming an entry (store.verify checks that one)."""

    digest: str
    fingerprint: str
    namespace: str | None = None
    key: str | None = None
    trusted: TrustedKeys | None = None
    callbacks: int | None = None
    raw_size: int | None = None
    max_raw_size: int | None = None
    with_metadata: bool = False


def decode(data: bytes, **checks: Any) -> bytes:
    """The payload alone, `Expected`'s fields as keywords (for tests and benches; the
    package decodes through its one verifier, store.verify)."""
    payload, _ = decode_entry(data, Expected(**checks))
    return payload


def decode_entry(data: bytes, expected: Expected) -> tuple[bytes, ObjectMeta | None]:
    """Verify digest, envelope, fingerprint, signature and entry, then decompress: (the
    payload, the object's metadata; None for objects that predate it). The payload frame
    must declare its size, agreeing with the metadata and `expected.raw_size` before
    anything is inflated; decompression never produces more than it declares.

    Raises `CorruptObject` for damaged bytes (or sizes that disagree), or one of its kinds:
    `FingerprintMismatch` (another platform), `WrongEntry` (another key), `CallbackMismatch`,
    `OverLimit`, and `SignatureRefused` (never quarantined: another reader may trust that
    key; checked before anything is decompressed).
    """
    short, key, trusted = expected.digest[:12], expected.key, expected.trusted
    frame_end, body, digests = _check_envelope(
        data, expected.digest, expected.fingerprint, signed=trusted is not None
    )
    meta = None if body is None else ObjectMeta.from_bytes(body)
    if key is not None and meta is not None and meta.key != key:
        raise WrongEntry(f"object {short} was stored for key {meta.key[:12]}, not {key[:12]}")
    if trusted is not None:
        if expected.namespace is None:
            raise ValueError("checking signatures needs the namespace the entry came from")
        check_signature(data, trusted, expected.namespace, key=key, digests=digests)
    callbacks = expected.callbacks
    if callbacks is not None and meta is not None and meta.callbacks not in (None, callbacks):
        raise CallbackMismatch(
            f"object {short} expects {meta.callbacks} host callback(s), "
            f"this program provides {callbacks}"
        )
    frame = memoryview(data)[HEADER_LEN:frame_end]
    declared = _checked_size(frame, short, meta, expected.raw_size, expected.max_raw_size)
    try:
        # The output buffer is the declared size: a frame holding more fails here.
        payload = decompressor().decompress(frame, max_output_size=declared)
    except zstandard.ZstdError as exc:
        raise CorruptObject(f"object {short} does not decompress: {exc}") from None
    if len(payload) != declared:
        raise CorruptObject(f"object {short} declares {declared} bytes, holds {len(payload)}")
    return payload, meta


def _check_envelope(
    data: bytes, expected_digest: str, fingerprint_digest: str, *, signed: bool
) -> tuple[int, bytes | None, tuple[str, str] | None]:
    """The digest, the envelope and its fingerprint, checked before anything is parsed:
    (where the frame ends, the metadata's bytes, the digests a signature check reuses)."""
    short = expected_digest[:12]
    frame_end, body, unsigned_end = bounds(data)
    if signed:  # one pass for the object's digest and the signed content's
        actual, content = frame_digests(data, unsigned_end)
    else:
        actual, content = digest_of(data), None
    if actual != expected_digest:
        raise CorruptObject(f"object {short} has digest {actual[:12]}")
    if len(data) < HEADER_LEN or not data.startswith(MAGIC):
        raise CorruptObject(f"object {short} has no artifactstore envelope")
    if data[len(MAGIC)] != FORMAT_VERSION:
        raise CorruptObject(f"object {short} has envelope version {data[len(MAGIC)]}")
    stored_fp = data[len(MAGIC) + 1 : HEADER_LEN].hex()
    if stored_fp != fingerprint_digest:
        raise FingerprintMismatch(
            f"object {short} was built for fingerprint {stored_fp[:12]}, "
            f"this host is {fingerprint_digest[:12]}"
        )
    return frame_end, body, None if content is None else (actual, content)


def _checked_size(
    frame: memoryview,
    short: str,
    meta: ObjectMeta | None,
    expected_raw_size: int | None,
    max_raw_size: int | None,
) -> int:
    """The executable's size as its frame declares it, once the object's metadata and
    its entry agree and it is within this reader's bound: nothing is inflated before."""
    declared = declared_size(frame, short)
    recorded = None if meta is None else meta.raw_size
    for what, size in (("its metadata", recorded), ("its entry", expected_raw_size)):
        if size is not None and size != declared:
            raise CorruptObject(
                f"object {short} declares a {declared}-byte executable, {what} says {size}"
            )
    if max_raw_size is not None and declared > max_raw_size:
        raise OverLimit(
            f"object {short} holds a {format_size(declared)} executable, over this "
            f"reader's limit of {format_limit(max_raw_size)} (ARTSTORE_MAX_EXECUTABLE_SIZE)"
        )
    return declared


class FingerprintMismatch(CorruptObject):
    """Intact bytes whose envelope names another platform."""


class WrongEntry(CorruptObject):
    """Intact bytes stored for another key: the index row (or tier key file) that led
    here is wrong, not the object, so it is refused but never quarantined."""


class CallbackMismatch(CorruptObject):
    """Intact bytes whose executable expects another number of host callbacks than the
    loading trace provides: loading it would crash natively on execute. Refused (a miss),
    never quarantined: the pairing is wrong, not necessarily the bytes."""


class SignatureRefused(CorruptObject):
    """Intact bytes this reader will not run because of their signature: refused (a
    miss), never quarantined, since another reader may trust the key."""

    reason = "bad_signature"  # the counter a refusal is counted under


class Unsigned(SignatureRefused):
    """No signature, while this reader trusts only signed objects."""

    reason = "unsigned"


class UntrustedKey(SignatureRefused):
    """Signed by a key this reader does not list in ARTSTORE_TRUSTED_KEYS."""

    reason = "untrusted_key"


class BadSignature(SignatureRefused):
    """A signature that does not verify (altered object or frame, another namespace)."""


class SecretKeyListed(SignatureRefused):
    """The trusted entry for the signer's name is its secret seed, not its public key:
    refused like any bad signature (nothing it signed is accepted), said loudly once."""

    reason = "secret_key_listed"
