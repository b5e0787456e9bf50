"""Manifests: an entry's record, published beside the objects (issue 16).

A reader that finds `key`'s manifest in the object store knows which object to fetch
without asking the database, as Bazel's action cache sits beside its CAS. A manifest
only says where to look: the object it names is verified in full (digest, envelope,
fingerprint, entry key, callback count, sizes, signature) before anything is loaded,
so a stale, forged or damaged manifest costs a miss, never a wrong load.

Format (version 1): one UTF-8 JSON object of at most MAX_MANIFEST_BYTES,

    {"v": 1, "d": object digest, "f": fingerprint digest, "c": compile seconds,
     "k": entry key, "r": executable size, "s": object size, "m": module name,
     "cb": host callbacks or null, "sg": signer name or null}

`d`, `f` and `c` are also what a tier's key file holds, under the same names.
Publication order: object durable -> index row -> manifest. Removal: the manifest, the
index row, then the object (`rm`; gc's eviction withdraws the manifest just after the row,
and deletes the object after its grace period). What a crash between two steps leaves,
and how `artstore verify --repair` mends it: artifactstore/gc/verify.py.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from artifactstore.errors import CorruptObject
from artifactstore.formats.codec import check_digest
from artifactstore.formats.records import decode_record

FORMAT_VERSION = 1
MAX_MANIFEST_BYTES = 16 * 1024
_KEY_RE = re.compile(r"[0-9A-Za-z]{8,128}")
_MAX_SIZE = 2**63 - 1


def check_key(key: str) -> str:
    """An entry key as it may name a file or an object key: 8-128 letters and digits."""
    if not _KEY_RE.fullmatch(key):
        raise ValueError(f"not an entry key: {key[:140]!r}")
    return key


@dataclass(frozen=True)
class Manifest:
    key: str
    digest: str
    fingerprint: str
    compile_secs: float
    raw_size: int
    size: int
    module_name: str
    callbacks: int | None = None
    signer: str | None = None

    @classmethod
    def of(cls, entry: Any, *, callbacks: int | None = None) -> Manifest:
        """The manifest of an index entry (anything with an entry's fields)."""
        return cls(
            key=entry.key,
            digest=entry.digest,
            fingerprint=entry.fingerprint,
            compile_secs=float(entry.compile_secs),
            raw_size=int(entry.raw_size),
            size=int(entry.size),
            module_name=entry.module_name,
            callbacks=callbacks,
            signer=entry.signer,
        )

    def encode(self) -> bytes:
        record = {
            "v": FORMAT_VERSION,
            "d": self.digest,
            "f": self.fingerprint,
            "c": self.compile_secs,
            "k": self.key,
            "r": self.raw_size,
            "s": self.size,
            "m": self.module_name[:255],
            "cb": self.callbacks,
            "sg": self.signer,
        }
        return json.dumps(record, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes, key: str) -> Manifest:
        """The manifest published for `key`; CorruptObject for anything else."""

        def parse(raw: dict[str, Any]) -> Manifest:
            return cls(
                key=_text(raw["k"]),
                digest=check_digest(raw["d"]),
                fingerprint=check_digest(raw["f"]),
                compile_secs=_number(raw["c"]),
                raw_size=_size(raw["r"]),
                size=_size(raw["s"]),
                module_name=_text(raw["m"])[:255],
                callbacks=None if raw.get("cb") is None else _size(raw["cb"]),
                signer=None if raw.get("sg") is None else _text(raw["sg"])[:64],
            )

        what = f"manifest of {key[:12]}"
        manifest = decode_record(data, what, MAX_MANIFEST_BYTES, (FORMAT_VERSION,), parse)
        if manifest.key != key:
            # A manifest copied under another key: it names another entry's object.
            raise CorruptObject(f"manifest under {key[:12]} is {manifest.key[:12]}'s")
        return manifest


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError("a text field is not text")
    return value


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError("a number is not a number")
    number = float(value)
    if not 0 <= number < 1e9:  # also false for NaN
        raise ValueError("compile seconds out of range")
    return number


def _size(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_SIZE:
        raise ValueError("a size is not a size")
    return value
