"""The object envelope: what bytes in the object store look like.

An object is `MAGIC | version | fingerprint digest (32 bytes) | zstd(payload)`
and is named by the sha256 of all of it. The fingerprint inside the object lets
a reader refuse an executable built for another platform even if the index
row that led to it is wrong, before a single byte reaches JAX.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass

import zstandard

from artifactstore.errors import CorruptObject

MAGIC = b"ARTX"
FORMAT_VERSION = 1
_HEADER_LEN = len(MAGIC) + 1 + 32
# Level 3 is zstd's default: ~3-4x on XLA executables at several hundred MB/s,
# so compression never costs more than a small fraction of the compile it saves.
ZSTD_LEVEL = 3

_local = threading.local()


def _compressor() -> zstandard.ZstdCompressor:
    comp = getattr(_local, "comp", None)
    if comp is None:
        comp = _local.comp = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    return comp


def _decompressor() -> zstandard.ZstdDecompressor:
    dec = getattr(_local, "dec", None)
    if dec is None:
        dec = _local.dec = zstandard.ZstdDecompressor()
    return dec


def digest_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Encoded:
    data: bytes
    digest: str
    raw_size: int


def encode(payload: bytes, fingerprint_digest: str) -> Encoded:
    fp = bytes.fromhex(fingerprint_digest)
    if len(fp) != 32:
        raise ValueError("fingerprint digest must be a sha256 hex digest")
    data = MAGIC + bytes([FORMAT_VERSION]) + fp + _compressor().compress(payload)
    return Encoded(data=data, digest=digest_of(data), raw_size=len(payload))


def decode(data: bytes, *, expected_digest: str, fingerprint_digest: str) -> bytes:
    """Verify digest, envelope and fingerprint, then decompress.

    Raises `CorruptObject` for bytes that are damaged and `FingerprintMismatch`
    for intact bytes built for another platform.
    """
    actual = digest_of(data)
    if actual != expected_digest:
        raise CorruptObject(f"object {expected_digest[:12]} has digest {actual[:12]}")
    if len(data) < _HEADER_LEN or not data.startswith(MAGIC):
        raise CorruptObject(f"object {expected_digest[:12]} has no artifactstore envelope")
    if data[len(MAGIC)] != FORMAT_VERSION:
        raise CorruptObject(
            f"object {expected_digest[:12]} has envelope version {data[len(MAGIC)]}"
        )
    stored_fp = data[len(MAGIC) + 1 : _HEADER_LEN].hex()
    if stored_fp != fingerprint_digest:
        raise FingerprintMismatch(
            f"object {expected_digest[:12]} was built for fingerprint {stored_fp[:12]}, "
            f"this host is {fingerprint_digest[:12]}"
        )
    try:
        return _decompressor().decompress(data[_HEADER_LEN:])
    except zstandard.ZstdError as exc:
        raise CorruptObject(f"object {expected_digest[:12]} does not decompress: {exc}") from None


def envelope_fingerprint(data: bytes) -> str | None:
    if len(data) < _HEADER_LEN or not data.startswith(MAGIC):
        return None
    return data[len(MAGIC) + 1 : _HEADER_LEN].hex()


class FingerprintMismatch(CorruptObject):
    """Intact bytes whose envelope names another platform."""
