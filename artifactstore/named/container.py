"""The payload of a named entry: a header (JSON) and a body (executable or export).

The store's codec wraps, compresses, digests and signs this like any payload, so the
header is covered by the entry's signature. `kind` says what the body is:
`native` (a serialized XLA executable for the entry's fingerprint) or `portable`
(a `jax.export` serialization, compiled on load).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any, Literal

from artifactstore.errors import CorruptObject
from artifactstore.named.signature import Signature

MAGIC = b"ARTSTORE-NAMED\0"
FORMAT_VERSION = 1
Kind = Literal["native", "portable"]
_LENGTH = struct.Struct(">BI")  # format version, header length


@dataclass(frozen=True)
class Header:
    """What a loader needs besides the body: the call signature and where it came from."""

    kind: Kind
    name: str
    version: str
    inputs: Signature
    outputs: Signature
    jax_version: str
    devices: tuple[int, ...]  # device ids the executable runs on, in its order
    platform: str  # the backend it was built for (`cpu`, `cuda`, ...; the export's platforms)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "version": self.version,
            "inputs": self.inputs.to_json(),
            "outputs": self.outputs.to_json(),
            "jax_version": self.jax_version,
            "devices": list(self.devices),
            "platform": self.platform,
        }

    @classmethod
    def from_json(cls, data: Any) -> Header:
        if not isinstance(data, dict) or data.get("kind") not in ("native", "portable"):
            raise ValueError("unknown kind")
        devices = data.get("devices")
        if not isinstance(devices, list) or not all(isinstance(d, int) for d in devices):
            raise ValueError("malformed devices")
        for name in ("name", "version", "jax_version", "platform"):
            if not isinstance(data.get(name), str):
                raise ValueError(f"malformed {name}")
        return cls(
            kind=data["kind"],
            name=data["name"],
            version=data["version"],
            inputs=Signature.from_json(data.get("inputs")),
            outputs=Signature.from_json(data.get("outputs")),
            jax_version=data["jax_version"],
            devices=tuple(devices),
            platform=data["platform"],
        )


def encode(header: Header, body: bytes) -> bytes:
    text = json.dumps(header.to_json(), sort_keys=True, separators=(",", ":")).encode()
    return MAGIC + _LENGTH.pack(FORMAT_VERSION, len(text)) + text + body


def decode(payload: bytes) -> tuple[Header, bytes]:
    """(header, body); CorruptObject for anything that is not a named payload of a
    format this client reads (a newer format says so, rather than failing later)."""
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
    try:
        header = Header.from_json(json.loads(payload[start : start + length]))
    except (ValueError, UnicodeDecodeError) as exc:
        raise CorruptObject(f"malformed named executable header: {exc}") from exc
    return header, payload[start + length :]
