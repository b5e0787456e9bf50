"""How a named entry's payload is framed: MAGIC, format version, header length, the
header (JSON), then the body (a serialized executable or a `jax.export` form).

Apart from `named.container` (what the header says) so that a reader below the named
part, the prefetch that deserializes a program's named executables before it asks for
them (issue 31), can split a payload and read the devices without knowing signatures.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from artifactstore.errors import CorruptObject
from artifactstore.formats.manifest import load_record

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
