"""How a named entry's payload is framed: MAGIC, format version, header length, the
header (JSON), then the body (a serialized executable or a `jax.export` form).

Apart from `named.container` (what the header says) so that a reader below the named
part, the prefetch that deserializes a program's named executables before it asks for
them (issue 31), can split a payload and read the devices without knowing signatures.
Also the removal records of named versions (below), which the read path checks.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from artifactstore.errors import CorruptObject
from artifactstore.formats import signing
from artifactstore.formats.records import load_record

if TYPE_CHECKING:
    from artifactstore.formats.signing import SigningKey, TrustedKeys

MAGIC = b"ARTSTORE-NAMED\0"
FORMAT_VERSION = 1
_LENGTH = struct.Struct(">BI")  # format version, header length
# A header's signature trees and shardings nest a few levels; deeper is refused unparsed.
HEADER_DEPTH = 32


def frame(header: dict[str, Any], body: bytes) -> bytes:
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    return MAGIC + _LENGTH.pack(FORMAT_VERSION, len(text)) + text + body


def unframe(payload: bytes) -> tuple[Any, bytes]:
    """(the header as parsed JSON, body); CorruptObject for anything that is not a named
    payload of a format this client reads (a newer format says so, not a later failure)."""
    return split_frame(payload, MAGIC, FORMAT_VERSION, "named executable")


def split_frame(
    payload: bytes, magic: bytes, format_version: int, what: str, max_header: int = 1 << 24
) -> tuple[Any, bytes]:
    """(header as parsed JSON, body) of a payload framed as `frame` frames one, with
    `magic` (named executables', native modules'); CorruptObject naming `what` else."""
    start = len(magic) + _LENGTH.size
    if not payload.startswith(magic) or len(payload) < start:
        raise CorruptObject(f"not a {what}")
    version, length = _LENGTH.unpack_from(payload, len(magic))
    if version != format_version:
        raise CorruptObject(
            f"{what} format {version}; this artifactstore reads {format_version} "
            "(upgrade artifactstore)"
        )
    if length > max_header or start + length > len(payload):
        raise CorruptObject(f"{what} header truncated")
    try:  # nested at most HEADER_DEPTH levels, checked before parsing (no RecursionError)
        header = load_record(payload[start : start + length], HEADER_DEPTH)
    except ValueError as exc:
        raise CorruptObject(f"malformed {what} header: {exc}") from exc
    return header, payload[start + length :]


def native_devices(header: Any) -> tuple[int, ...] | None:
    """The device ids of a native executable's header, None for anything else."""
    if not isinstance(header, dict) or header.get("kind") != "native":
        return None
    devices = header.get("devices")
    if not isinstance(devices, list) or not all(type(d) is int and d >= 0 for d in devices):
        return None
    return tuple(devices)


# -- removed versions ----------------------------------------------------------------
# `artstore rm --name` leaves one small record per NAME@VERSION it removed, beside the
# manifests under a name no manifest can have (a digest and a suffix), so listings of
# manifests never show it and every role's bucket policy already covers it. Its power is
# to refuse: a store-fetched entry of that version is not loaded, and writers do not
# store that version again (versions are immutable once published). Where signatures are
# required, that power is a trusted key's only: the record carries formats.signing's
# "s" field (domain `REMOVAL_DOMAIN`, over the namespace and the record's name), and one
# without a trusted signature is ignored (a bucket writer without the key could
# otherwise make any unpublished version unstorable). Without signatures its presence
# refuses, whatever it holds.
MODULE_PREFIX = "named:"
REMOVED_SUFFIX = ".removed"
REMOVED_VERSION = 1
MAX_REMOVED_BYTES = 1024
_REMOVED_DOMAIN = "artifactstore-named-removed-v1"
REMOVAL_DOMAIN = b"artifactstore-named-removal-signature-v1\x00"
HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class Removal:
    """What a removal record says, as far as it says it legibly (never raises: a record
    is untrusted bytes; its name, not its body, decides which version it concerns)."""

    record: str  # its name: `removed_name(name, version)`
    name: str | None  # NAME@VERSION when the body names the version its name is for
    version: str | None
    removed_at: int | None  # for messages only
    signature: signing.RecordSignature | None
    malformed: str | None = None  # why the body or its signature field is unreadable

    @property
    def ref(self) -> str:
        """NAME@VERSION, or the record's name where the body does not say."""
        if self.name is None or self.version is None:
            return self.record
        return f"{self.name[:128]}@{self.version[:64]}"

    def refusal(self, trusted: TrustedKeys, namespace: str) -> str | None:
        """Why a process that requires signatures ignores this record; None: obeyed."""
        if self.malformed is not None:
            return self.malformed
        return signing.record_refusal(
            self.signature, trusted, REMOVAL_DOMAIN, namespace, self.record
        )


def split_module(module: str) -> tuple[str, str] | None:
    """(name, version) of a named entry's module name (`named:NAME@VERSION`), else None."""
    if not module.startswith(MODULE_PREFIX):
        return None
    name, at, version = module[len(MODULE_PREFIX) :].rpartition("@")
    return (name, version) if at and name and version else None


def removed_name(name: str, version: str) -> str:
    """The record name of NAME@VERSION's removal (what any process derives from either)."""
    text = "\0".join((_REMOVED_DOMAIN, name, version)).encode()
    return hashlib.sha256(text).hexdigest() + REMOVED_SUFFIX


def check_removed_name(record: str) -> str:
    """`record` if it names a removal record; else ValueError (as record kinds require)."""
    digest, suffix = record[:64], record[64:]
    if suffix != REMOVED_SUFFIX or len(digest) != 64 or not all(c in HEX for c in digest):
        raise ValueError(f"not a removal record: {record[:80]!r}")
    return record


def encode_removed(
    name: str,
    version: str,
    removed_at: int,
    signer: SigningKey | None = None,
    namespace: str = "",
) -> bytes:
    """A removal record: which version, and when (for messages); signed by `signer` for
    `namespace` where given."""
    body: dict[str, object] = {
        "v": REMOVED_VERSION,
        "name": name,
        "version": version,
        "removed": int(removed_at),
    }
    if signer is not None:
        body = signing.sign_record(
            body, signer, REMOVAL_DOMAIN, namespace, removed_name(name, version)
        )
    return json.dumps(body, separators=signing.RECORD_SEPARATORS).encode()


def decode_removed(record: str, data: bytes) -> Removal:
    """What the removal record `record` holding `data` says (see `Removal`)."""
    blank = Removal(record, None, None, None, None)
    try:
        body = load_record(data) if len(data) <= MAX_REMOVED_BYTES else None
        if not isinstance(body, dict):
            return replace(blank, malformed="not a removal record (unreadable)")
        name, version = body.get("name"), body.get("version")
        said = isinstance(name, str) and isinstance(version, str)
        if not said or removed_name(str(name), str(version)) != record:
            name = version = None
        at = body.get("removed")
        when = at if type(at) is int and at >= 0 else None
        return Removal(record, name, version, when, signing.record_signature(body))
    except Exception as exc:  # anything the bytes can cause: never a reader's error
        return replace(blank, malformed=f"not a removal record ({str(exc)[:80]})")


def removed_at(data: bytes) -> int | None:
    """When a removal record says its version was removed; None if it does not say
    legibly (what a record refuses is its name's version, never its body's)."""
    return decode_removed("", data).removed_at
