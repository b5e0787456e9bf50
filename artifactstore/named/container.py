"""The payload of a named entry: a header (JSON) and a body (executable or export).

The store's codec wraps, compresses, digests and signs this like any payload, so the
header is covered by the entry's signature. `kind` says what the body is:
`native` (a serialized XLA executable for the entry's fingerprint) or `portable`
(a `jax.export` serialization, compiled on load).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from artifactstore.errors import CorruptObject
from artifactstore.formats.named import frame, unframe
from artifactstore.named.signature import Signature

Kind = Literal["native", "portable"]


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
    return frame(header.to_json(), body)


def decode(payload: bytes) -> tuple[Header, bytes]:
    """(header, body); CorruptObject for anything that is not a named payload of a
    format this client reads (`formats.named`)."""
    raw, body = unframe(payload)
    return parse_header(raw), body


def parse_header(raw: Any) -> Header:
    """A header as `formats.named.unframe` parsed it; CorruptObject if malformed."""
    try:
        return Header.from_json(raw)
    except ValueError as exc:
        raise CorruptObject(f"malformed named executable header: {exc}") from exc
