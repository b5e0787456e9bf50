"""The frames of an object's bytes: the envelope header, the payload's zstd frame and
the skippable frames after it (metadata, signature), each found from the end by its
footer without a copy of the object (see `formats.codec` for what they mean).

Apart from the codec so that how bytes are laid out is read in one place and what
they say (the entry, the signature) in another.
"""

from __future__ import annotations

import hashlib
import struct
import threading

import zstandard

from artifactstore.errors import CorruptObject

MAGIC = b"ARTX"
FORMAT_VERSION = 1
HEADER_LEN = len(MAGIC) + 1 + 32
META_MAGIC = b"ARTM"
META_VERSION = 1
SKIPPABLE = 0x184D2A5E  # one of zstd's skippable-frame magic numbers (0x184D2A5?)
FOOTER = struct.Struct("<I4s")  # body length, META_MAGIC
FRAME_HEAD = struct.Struct("<II")  # skippable magic, frame size
MAX_META_BYTES = 1 << 20
SIG_MAGIC = b"ARTS"
MAX_SIG_BYTES = 4096
# Level 3 is zstd's default: ~3-4x on XLA executables at several hundred MB/s,
# so compression never costs more than a small fraction of the compile it saves.
ZSTD_LEVEL = 3

_local = threading.local()


def compressor() -> zstandard.ZstdCompressor:
    """This thread's compressor (zstandard's are not thread-safe; creating one costs)."""
    comp = getattr(_local, "comp", None)
    if comp is None:
        comp = _local.comp = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    return comp


def decompressor() -> zstandard.ZstdDecompressor:
    dec = getattr(_local, "dec", None)
    if dec is None:
        dec = _local.dec = zstandard.ZstdDecompressor()
    return dec


def skippable(body: bytes, magic: bytes) -> bytes:
    """`body` as a zstd skippable frame ending in its length and `magic`."""
    frame = body + FOOTER.pack(len(body), magic)
    return FRAME_HEAD.pack(SKIPPABLE, len(frame)) + frame


def signature_bounds(data: bytes) -> tuple[int, bytes | None]:
    """(where the bytes before the signature frame end, the signature body or None);
    no copy of the object is made."""
    body_end = len(data) - FOOTER.size
    if body_end < HEADER_LEN or data[body_end + 4 :] != SIG_MAGIC:
        return len(data), None
    (length,) = struct.unpack_from("<I", data, body_end)
    start = body_end - length
    head = start - FRAME_HEAD.size
    if length > MAX_SIG_BYTES or head < HEADER_LEN:
        return len(data), None
    magic, size = FRAME_HEAD.unpack_from(data, head)
    if magic != SKIPPABLE or size != length + FOOTER.size:
        return len(data), None
    return head, data[start:body_end]


def split_signature(data: bytes) -> tuple[bytes, bytes | None]:
    """(the object's bytes before its signature frame, the signature body or None)."""
    end, body = signature_bounds(data)
    return (data if end == len(data) else data[:end]), body


def digests(data: bytes, end: int) -> tuple[str, str]:
    """(sha256 of all of `data`, sha256 of its first `end` bytes), in one pass."""
    view = memoryview(data)
    h = hashlib.sha256(view[:end])
    content = h.hexdigest()
    if end == len(data):
        return content, content
    h.update(view[end:])
    return h.hexdigest(), content


def bounds(data: bytes) -> tuple[int, bytes | None, int]:
    """(where the payload's zstd frame ends, the metadata body or None, where the bytes
    before any signature frame end); no copy of the object is made."""
    end, _ = signature_bounds(data)
    body_end = end - FOOTER.size
    if body_end < HEADER_LEN or data[body_end + 4 : end] != META_MAGIC:
        return end, None, end
    (length,) = struct.unpack_from("<I", data, body_end)
    start = body_end - length
    head = start - FRAME_HEAD.size
    if length > MAX_META_BYTES or head < HEADER_LEN:
        return end, None, end
    magic, size = FRAME_HEAD.unpack_from(data, head)
    if magic != SKIPPABLE or size != length + FOOTER.size:
        return end, None, end
    return head, data[start:body_end], end


def split(data: bytes) -> tuple[bytes, bytes | None]:
    """(the payload's zstd frame, the metadata body or None); any signature frame is
    left out."""
    frame_end, body, _ = bounds(data)
    return data[HEADER_LEN:frame_end], body


def declared_size(frame: bytes | memoryview, short: str) -> int:
    """The executable's size as the payload frame's header declares it (our encoder
    always writes it); a frame without one is refused rather than inflated blind."""
    try:
        size = zstandard.frame_content_size(frame)
    except zstandard.ZstdError as exc:
        raise CorruptObject(f"object {short} has an unreadable payload frame: {exc}") from None
    if size < 0:
        raise CorruptObject(f"object {short} does not declare its executable's size")
    return int(size)


def envelope_fingerprint(data: bytes) -> str | None:
    """The fingerprint digest in `data`'s envelope; None if it has none."""
    if len(data) < HEADER_LEN or not data.startswith(MAGIC):
        return None
    return data[len(MAGIC) + 1 : HEADER_LEN].hex()
