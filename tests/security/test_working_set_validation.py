"""Issue 38.2: hostile working-set entries through the load-ahead path's validation.

Whatever a working set holds (random or truncated records, junk or adversarially valid
compile options, device ids this host lacks, named twice, too many), `ahead.deserialize`
either refuses it (`validate.Refused`, which the prefetcher counts) or calls the backend
with options for exactly the entry's devices, each one of this backend's, once. The
backend here is a stand-in that checks those facts with its own oracle (JAX's printed
device assignment, not our protobuf reader) and never deserializes; the options are
parsed by the real XLA client.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from jax._src.lib import xla_client as xc

from artifactstore.errors import CorruptObject
from artifactstore.formats.workingset import MAX_WORKING_SET_BYTES, WorkingEntry, WorkingSet
from artifactstore.jaxhook import ahead, compat, validate
from security import hostile

PROGRAM = "c" * 40
FP = "ab" * 32
KEY = "k" * 64
BACKEND_IDS = (0, 1, 2, 3)


@dataclass(frozen=True)
class FakeDevice:
    id: int


@dataclass
class Backend:
    """Checks every deserialize call against this backend's devices; loads nothing."""

    devices_by_id: dict[int, FakeDevice] = field(
        default_factory=lambda: {i: FakeDevice(i) for i in BACKEND_IDS}
    )
    calls: list[tuple[int, ...]] = field(default_factory=list)

    def deserialize_executable(self, payload: bytes, devices: Sequence[Any], options: Any) -> str:
        ids = tuple(d.id for d in devices)
        assert not options.env_option_overrides  # never the record's (xla_dump_to=...)
        assert options.executable_build_options.debug_options.xla_dump_to == ""
        assert ids and len(set(ids)) == len(ids) and set(ids) <= set(self.devices_by_id)
        build = options.executable_build_options
        replicas, partitions = build.num_replicas, build.num_partitions
        assert replicas >= 1 and partitions >= 1 and replicas * partitions == len(ids)
        assignment = build.device_assignment
        if assignment is not None:
            assert (assignment.replica_count(), assignment.computation_count()) == (
                replicas,
                partitions,
            )
            columns = [
                [int(i) for i in ids_text.split()]
                for _, ids_text in re.findall(r"Computation(\d+)\{([^}]*)\}", str(assignment))
            ]
            flat = [columns[c][r] for r in range(replicas) for c in range(partitions)]
            assert tuple(flat) == ids
        self.calls.append(ids)
        return "executable"


@contextmanager
def _fake_device_lists() -> Iterator[None]:
    """Device lists of the stand-in's devices (XLA's DeviceList takes real ones only)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(compat, "device_list", lambda devices: devices)
        yield


def _options(replicas: int, partitions: int, grid: list[list[int]] | None, dump: str = "") -> bytes:
    o = xc.CompileOptions()
    o.num_replicas, o.num_partitions = replicas, partitions
    if grid is not None:
        o.device_assignment = xc.DeviceAssignment.create(np.array(grid, dtype=np.int32))
    if dump:  # what a set's writer would choose for the reader
        o.env_option_overrides = [("xla_dump_to", dump)]
        o.executable_build_options.debug_options.xla_dump_to = dump
    return bytes(o.SerializeAsString())


@st.composite
def options(draw: st.DrawFn) -> bytes:
    """Junk bytes, or real options with hostile counts and device assignments."""
    if draw(st.booleans()):
        return draw(st.binary(max_size=200))
    rows, cols = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    ids = draw(st.lists(st.integers(-2, 6), min_size=rows * cols, max_size=rows * cols))
    grid = np.array(ids).reshape(rows, cols).tolist() if draw(st.booleans()) else None
    dump = draw(st.sampled_from(["", "/tmp/chosen-by-the-bucket"]))
    return _options(draw(st.integers(-2, 5)), draw(st.integers(-2, 5)), grid, dump)


devices = st.lists(st.one_of(st.integers(0, 5), st.integers(0, 2**31 - 1)), max_size=6)
GENUINE_2X2 = WorkingEntry(KEY, _options(2, 2, [[0, 1], [2, 3]]), (0, 1, 2, 3))


@given(st.builds(lambda o, d: WorkingEntry(KEY, o, tuple(d)), options(), devices))
@example(WorkingEntry(KEY, b"junk", (0,)))  # the measured abort
@example(WorkingEntry(KEY, _options(1, 4, None), (0,)))  # the measured stall
@example(WorkingEntry(KEY, _options(1, 1, [[3]]), (0,)))  # options for another device
@example(WorkingEntry(KEY, _options(2, 1, None), (0, 0)))  # a device twice
@example(WorkingEntry(KEY, _options(1, 5, None), (0, 1, 2, 3, 4)))  # more than it has
@example(GENUINE_2X2)
@example(WorkingEntry(KEY, _options(1, 2, [[3, 1]]), (3, 1)))
@example(WorkingEntry(KEY, _options(1, 1, [[2]], "/tmp/chosen"), (2,)))  # dumps there
def test_deserialize_gets_only_validated_options(entry: WorkingEntry) -> None:
    backend = Backend()
    with _fake_device_lists():
        try:
            executable, header = ahead.deserialize(backend, backend.devices_by_id, entry, b"x")
        except validate.Refused:
            assert backend.calls == []
            return
    assert executable == "executable" and header is None and backend.calls == [entry.devices]


def test_the_property_can_fail() -> None:
    """Not vacuous: genuine options for 2x2 devices and for one reach the backend; the
    measured abort's junk does not."""
    backend = Backend()
    with _fake_device_lists():
        ahead.deserialize(backend, backend.devices_by_id, GENUINE_2X2, b"x")
        one = WorkingEntry(KEY, _options(1, 1, [[2]]), (2,))
        ahead.deserialize(backend, backend.devices_by_id, one, b"x")
        with pytest.raises(validate.Refused):
            ahead.deserialize(backend, backend.devices_by_id, WorkingEntry(KEY, b"junk", (0,)), b"")
    assert backend.calls == [(0, 1, 2, 3), (2,)]


def _record(entries: list[list[Any]]) -> dict[str, Any]:
    return {"v": 1, "p": PROGRAM, "f": FP, "e": entries}


GOOD_ROW = [KEY, "CAEQAQ==", [0], 0]


@given(hostile.records(_record([GOOD_ROW, GOOD_ROW]), max_bytes=MAX_WORKING_SET_BYTES))
@example(WorkingSet(PROGRAM, FP, (GENUINE_2X2,)).encode())
@example(hostile.DEEP)
def test_hostile_sets_through_decode_and_validation(data: bytes) -> None:
    """A hostile record is refused by decode (CorruptObject), or each of its entries is
    refused by validation or reaches the backend with validated options."""
    try:
        found = WorkingSet.decode(data, PROGRAM)
    except CorruptObject:
        return
    backend = Backend()
    with _fake_device_lists():
        for entry in ahead.loadable(found.entries):
            if entry.kind != "jit":
                continue
            try:
                ahead.deserialize(backend, backend.devices_by_id, entry, b"x")
            except validate.Refused:
                continue
            assert backend.calls[-1] == entry.devices


@given(st.binary(max_size=300), st.integers(1, 4), st.integers(1, 4))
def test_the_assignment_reader_never_fails_otherwise(data: bytes, r: int, p: int) -> None:
    """Our protobuf reader on any bytes: a list of ids or Refused, nothing else."""
    try:
        ids = validate.assignment_ids(data, r, p)
    except validate.Refused:
        return
    assert len(ids) == r * p
