"""Issue 38 item 3: what a hostile record of a bounded kind costs in memory.

Each bounded kind's decoder is fed its worst shapes at the bound (the most JSON values
its bytes can hold) and just past it; the peak of Python allocations (tracemalloc) stays
within a fixed multiple of the bound, and a record past the bound is refused before it is
parsed. An object declaring a 1 TiB executable is refused before anything is inflated.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable

import pytest
import zstandard

from artifactstore.errors import CorruptObject, OverLimit
from artifactstore.formats import codec, identity, quick
from artifactstore.formats.journal import MAX_JOURNAL_BYTES, Journal
from artifactstore.formats.lease import MAX_LEASE_BYTES, LeaseRecord
from artifactstore.formats.manifest import MAX_MANIFEST_BYTES, Manifest
from artifactstore.formats.workingset import MAX_HINT_BYTES, MAX_WORKING_SET_BYTES, Hint, WorkingSet
from security.hostile import FP, KEY, TRUSTED

# Python objects for the values a record's bytes can hold: a generous multiple.
PER_BYTE = 64
SLACK = 1 << 20

DECODERS: dict[str, tuple[int, Callable[[bytes], object]]] = {
    "manifest": (MAX_MANIFEST_BYTES, lambda d: Manifest.decode(d, KEY)),
    "quick-key record": (quick.MAX_QUICK_BYTES, quick.decode),
    "hit journal": (MAX_JOURNAL_BYTES, Journal.decode),
    "working set": (MAX_WORKING_SET_BYTES, lambda d: WorkingSet.decode(d, "c" * 40)),
    "working set hint": (MAX_HINT_BYTES, Hint.decode),
    "lease record": (MAX_LEASE_BYTES, LeaseRecord.decode),
    "identity": (identity.MAX_IDENTITY_BYTES, identity.decode),
}


def _shapes(bound: int) -> list[bytes]:
    """The worst at the bound: one-digit values, nested lists, short keys; and past it."""
    values = bound // 2 - 8
    return [
        b'{"v":1,"a":[' + b"1," * values + b"1]}",
        b'{"v":1,"a":{' + b",".join(b'"%x":[1,1]' % i for i in range(bound // 16)) + b"}}",
        b'{"v":1,"e":[' + b"[]," * (bound // 3 - 8) + b"[]]}",
        b" " * (bound + 1) + b"{}",
    ]


def _peak(run: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        try:
            run()
        except (CorruptObject, OverLimit, ValueError):
            pass
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("kind", sorted(DECODERS))
def test_a_record_at_its_bound_costs_a_bounded_multiple(kind: str) -> None:
    bound, decode = DECODERS[kind]
    for data in _shapes(bound):
        data = data[: bound + 1] if len(data) > bound + 1 else data
        peak = _peak(lambda: decode(data))  # noqa: B023 - run at once
        assert peak <= PER_BYTE * bound + SLACK, (kind, len(data), peak)


def test_an_object_declaring_a_huge_executable_is_refused_uninflated() -> None:
    frame = zstandard.ZstdCompressor().compress(b"\0" * (1 << 20))  # declares 1 MiB
    header = codec.MAGIC + bytes([1]) + bytes.fromhex(FP.digest)
    data = header + frame
    peak = _peak(
        lambda: codec.decode(
            data,
            digest=codec.digest_of(data),
            fingerprint=FP.digest,
            max_raw_size=1024,
        )
    )
    assert peak < 256 * 1024, peak  # refused from the frame header: OverLimit
    with pytest.raises(CorruptObject):  # signatures required: refused before the frame
        codec.decode(
            data,
            digest=codec.digest_of(data),
            fingerprint=FP.digest,
            key=KEY,
            trusted=TRUSTED,
            namespace="default",
        )
