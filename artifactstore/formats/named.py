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
from typing import Any

from artifactstore.errors import CorruptObject
from artifactstore.formats.records import load_record

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
    start = len(MAGIC) + _LENGTH.size
    if not payload.startswith(MAGIC) or len(payload) < start:
        raise CorruptObject("not a named executable")
    version, length = _LENGTH.unpack_from(payload, len(MAGIC))
    if version != FORMAT_VERSION:
        raise CorruptObject(
            f"named executable format {version}; this artifactstore reads {FORMAT_VERSION} "
            "(upgrade artifactstore)"
        )
    if start + length > len(payload):
        raise CorruptObject("named executable header truncated")
    try:  # nested at most HEADER_DEPTH levels, checked before parsing (no RecursionError)
        header = load_record(payload[start : start + length], HEADER_DEPTH)
    except ValueError as exc:
        raise CorruptObject(f"malformed named executable header: {exc}") from exc
    return header, payload[start + length :]


def native_devices(header: Any) -> tuple[int, ...] | None:
    """The device ids of a native executable's header, None for anything else."""
    if not isinstance(header, dict) or header.get("kind") != "native":
        return None
    devices = header.get("devices")
    if not isinstance(devices, list) or not all(type(d) is int and d >= 0 for d in devices):
        return None
    return tuple(devices)


# -- removed versions (issue 38) --------------------------------------------------
# `artstore rm --name` leaves one small record per NAME@VERSION it removed, beside the
# manifests under a name no manifest can have (a digest and a suffix), so listings of
# manifests never show it and every role's bucket policy already covers it. Its only
# power is to refuse: a store-fetched entry of that version is not loaded, and writers do
# not store that version again (versions are immutable once published). So it needs no
# signature: a forged one costs what deleting the version's objects costs.
MODULE_PREFIX = "named:"
REMOVED_SUFFIX = ".removed"
REMOVED_VERSION = 1
MAX_REMOVED_BYTES = 1024
_REMOVED_DOMAIN = "artifactstore-named-removed-v1"
HEX = frozenset("0123456789abcdef")


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


def encode_removed(name: str, version: str, removed_at: int) -> bytes:
    """A removal record: which version, and when (for messages; never trusted)."""
    body = {"v": REMOVED_VERSION, "name": name, "version": version, "removed": int(removed_at)}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def removed_at(data: bytes) -> int | None:
    """When a removal record says its version was removed; None if it does not say
    legibly (the record still refuses: its presence, not its contents, is what counts)."""
    try:
        body = json.loads(data[:MAX_REMOVED_BYTES]) if len(data) <= MAX_REMOVED_BYTES else None
        at = body.get("removed") if isinstance(body, dict) else None
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return at if type(at) is int and at >= 0 else None
