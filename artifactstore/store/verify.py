"""The one verifier: an object's bytes and what is expected -> its payload, or why not.

Why one: every level that hands stored bytes on (this host's tier, the store's read
path, `artstore import`, `export` and `pull`, `artstore sign`) and every entry kind
(JAX executables, torch-xla cache files, named payloads, native modules) reaches its
payload here, so a check added once (a new signature rule, a new kind) holds on every path. The
levels decide only what a `Refusal` costs them (a miss, a quarantine, a count, a log
line); none checks bytes itself (tests/test_layers.py keeps `codec.decode` and
`codec.decode_entry` here).

The entry's kind is read from the object's own metadata (its module name, covered by
the digest and any signature), not asked of the caller: a load ahead asks for named
entries as it asks for executables, and a kind the object claims must hold whoever
asks. Each kind's payload is then checked as that kind: a torch-xla file must carry
a name that yields the entry's key (`formats.torchxla.unframe`), a named payload
must be framed as one, and a native module (an IREE module of a named version) must
be framed as one with a legible calling convention (`formats.native.unframe`), so
that no payload that does not parse reaches IREE on any path.
"""

from __future__ import annotations

from dataclasses import dataclass

from artifactstore.errors import CorruptObject, OverLimit
from artifactstore.formats import codec, torchxla
from artifactstore.formats import named as named_format
from artifactstore.formats import native as native_format
from artifactstore.formats.codec import Expected as Expected  # what verify() takes

EXECUTABLE, TORCH_XLA, NAMED, NATIVE = "executable", "torch-xla", "named", "native"

# Why bytes were refused; the levels count and log them under these names.
SIGNATURE_REASONS = ("unsigned", "untrusted_key", "bad_signature", "secret_key_listed")
REASONS = (
    "corrupt",  # damaged: digest, envelope, sizes, metadata, decompression
    "fingerprint_mismatch",  # intact, built for another platform
    "wrong_entry",  # intact, stored for another key
    "callback_mismatch",  # intact, expects another number of host callbacks
    "over_limit",  # bigger than this reader allows
    "without_metadata",  # names no entry, where one is required (signing)
    "malformed",  # intact, but not a payload of the kind its metadata names
    *SIGNATURE_REASONS,
)


@dataclass(frozen=True)
class Verified:
    """A payload that passed every check; `kind` as its metadata names it."""

    payload: bytes
    kind: str = EXECUTABLE
    meta: codec.ObjectMeta | None = None


@dataclass(frozen=True)
class Refusal:
    """Why bytes were not handed on: one of `REASONS`, and the check's exception (for
    its message: `str`, or `errors.one_line` where its type is quoted too)."""

    reason: str
    error: CorruptObject

    def __str__(self) -> str:
        return str(self.error)

    @property
    def signature(self) -> bool:
        """Intact bytes refused for their signature: never quarantined, since another
        reader may trust the key."""
        return self.reason in SIGNATURE_REASONS

    @property
    def damaged(self) -> bool:
        """Bytes that are not what was stored: the only refusal that may cost the object
        (a quarantine); every other one is about this reader or the record that led here."""
        return self.reason == "corrupt"


def verify(data: bytes, expected: Expected) -> Verified | Refusal:
    """`data`'s payload if it is the object `expected` describes, intact, for this
    platform and entry, signed as required and well-formed for its kind; else why not.
    Never raises for what the bytes hold: they are untrusted input."""
    try:
        meta = codec.read_meta(data) if expected.with_metadata else None
    except CorruptObject as exc:
        return refusal(exc)
    if expected.with_metadata and meta is None and _intact(data, expected):
        return _refuse("without_metadata", f"object {expected.digest[:12]} names no entry")
    try:
        payload, meta = codec.decode_entry(data, expected)
    except CorruptObject as exc:  # OverLimit and the signature refusals are kinds of it
        return refusal(exc)
    return _of_kind(payload, meta, expected)


def _intact(data: bytes, expected: Expected) -> bool:
    """Whether `data` is the expected object for this platform (a refusal for want of
    metadata must not hide a damaged or foreign object: `decode` names those)."""
    fingerprint = codec.envelope_fingerprint(data)
    return fingerprint == expected.fingerprint and codec.digest_of(data) == expected.digest


def _of_kind(
    payload: bytes, meta: codec.ObjectMeta | None, expected: Expected
) -> Verified | Refusal:
    """`payload` checked as the kind of entry its metadata names."""
    module = "" if meta is None else meta.module_name
    if module.startswith(torchxla.MODULE_PREFIX):
        assert meta is not None
        try:
            torchxla.unframe(payload, key=meta.key, fingerprint=expected.fingerprint)
        except CorruptObject as exc:
            return _refuse("malformed", f"object {expected.digest[:12]}: {exc}")
        return Verified(payload, TORCH_XLA, meta)
    if module.startswith(named_format.MODULE_PREFIX):
        if payload.startswith(native_format.MAGIC):
            try:
                native_format.unframe(payload)
            except CorruptObject as exc:
                return _refuse("malformed", f"object {expected.digest[:12]}: {exc}")
            return Verified(payload, NATIVE, meta)
        if not payload.startswith(named_format.MAGIC):
            return _refuse("malformed", f"object {expected.digest[:12]} is no named executable")
        return Verified(payload, NAMED, meta)
    return Verified(payload, EXECUTABLE, meta)


def refusal(exc: CorruptObject) -> Refusal:
    """The refusal a check's exception stands for (`codec`'s, `store.removed`'s)."""
    if isinstance(exc, codec.SignatureRefused):
        reason = exc.reason
    elif isinstance(exc, OverLimit):
        reason = "over_limit"
    elif isinstance(exc, codec.FingerprintMismatch):
        reason = "fingerprint_mismatch"
    elif isinstance(exc, codec.WrongEntry):
        reason = "wrong_entry"
    elif isinstance(exc, codec.CallbackMismatch):
        reason = "callback_mismatch"
    else:
        reason = "corrupt"
    return Refusal(reason, exc)


def _refuse(reason: str, detail: str) -> Refusal:
    return Refusal(reason, CorruptObject(detail))
