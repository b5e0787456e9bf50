"""What a working-set entry may ask this backend to deserialize with (issue 38).

A working set names, per entry, the compile options and device ids it is deserialized
with, and XLA trusts them: junk options abort the process in a CHECK (`replica_count >
0`, SIGABRT), and options for more devices than the entry names stalled a reader until
its breaker opened. So before any deserialization the options are parsed and checked
against this process's backend: replicas and partitions at least 1, their product the
entry's device count, every device id one of this backend's, each once, no more than it
has, and the options' device assignment (if any) the entry's devices in order. A named
entry's devices come from its verified payload header and are checked the same way.
Anything else is `Refused` (counted by the caller) and never reaches XLA. This holds
signed or not: a signature says who wrote a set, not that it fits this host.

What reaches XLA is not the recorded options but new ones built from the checked fields
(`REBUILT`): the record's debug options and environment overrides (`xla_dump_to`, pass
lists, autotune files: paths and behaviour the set's writer would choose for this
process) are never read, and a deserialize gets this process's own defaults for them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from artifactstore.jaxhook import compat


class Refused(ValueError):
    """An entry whose options or devices do not fit this backend: never deserialized."""


def checked_devices(ids: Sequence[int], devices: Mapping[int, Any]) -> tuple[Any, ...]:
    """This backend's devices for `ids`; Refused unless each is one of them, once."""
    if not ids:
        raise Refused("no devices")
    if len(ids) > len(devices):
        raise Refused(f"{len(ids)} devices, and this backend has {len(devices)}")
    if len(set(ids)) != len(ids):
        raise Refused("a device is named twice")
    for i in ids:
        if i not in devices:
            raise Refused(f"device {str(i)[:20]} is not one of this backend's")
    return tuple(devices[i] for i in ids)


# The build options' fields a deserialize may take from a record: counts, partitioning
# switches and levels (the device assignment is checked and copied on its own).
REBUILT = (
    "num_replicas",
    "num_partitions",
    "use_spmd_partitioning",
    "use_auto_spmd_partitioning",
    "use_shardy_partitioner",
    "allow_spmd_sharding_propagation_to_output",
    "allow_spmd_sharding_propagation_to_parameters",
    "auto_spmd_partitioning_mesh_shape",
    "auto_spmd_partitioning_mesh_ids",
    "optimization_level",
    "memory_fitting_level",
)


def checked_options(data: bytes, ids: Sequence[int]) -> Any:
    """Compile options for exactly the devices `ids` (already checked by
    `checked_devices`), in that order, rebuilt from the checked fields of those in
    `data`; Refused unless those are for these devices."""
    options = _checked(compat.parse_options(data), ids)
    rebuilt = compat.new_options()
    build, into = options.executable_build_options, rebuilt.executable_build_options
    for name in REBUILT:
        if hasattr(build, name):
            setattr(into, name, getattr(build, name))
    rebuilt.num_replicas, rebuilt.num_partitions = options.num_replicas, options.num_partitions
    rebuilt.parameter_is_tupled_arguments = bool(options.parameter_is_tupled_arguments)
    rebuilt.compile_portable_executable = bool(options.compile_portable_executable)
    if build.device_assignment is not None:
        rebuilt.device_assignment = build.device_assignment
    return rebuilt


def _checked(options: Any, ids: Sequence[int]) -> Any:
    build = options.executable_build_options
    replicas, partitions = int(build.num_replicas), int(build.num_partitions)
    if (int(options.num_replicas), int(options.num_partitions)) != (replicas, partitions):
        raise Refused("the options disagree on their replicas or partitions")
    if replicas < 1 or partitions < 1:
        raise Refused(f"{replicas} replicas and {partitions} partitions")
    if replicas * partitions != len(ids):
        raise Refused(
            f"options for {replicas}x{partitions} devices, and the entry names {len(ids)}"
        )
    assignment = build.device_assignment
    if assignment is not None:
        serialize = getattr(assignment, "serialize", None)
        if serialize is None:
            raise Refused("this JAX cannot show the options' device assignment")
        if assignment_ids(bytes(serialize()), replicas, partitions) != list(ids):
            raise Refused("the options' device assignment is not the entry's devices")
    return options


def assignment_ids(data: bytes, replicas: int, partitions: int) -> list[int]:
    """The device ids of a serialized DeviceAssignmentProto, replica by replica (as JAX
    lists an executable's devices); Refused unless it is `replicas` x `partitions`."""
    counts = {1: 0, 2: 0}
    columns: list[list[int]] = []  # per computation (partition), its device per replica
    for number, _wire, value in _fields(data):
        if number in counts and isinstance(value, int):
            counts[number] = value
        elif number == 3 and isinstance(value, bytes):
            column: list[int] = []
            for inner, _wire, item in _fields(value):
                if inner != 1:
                    continue
                if isinstance(item, int):
                    column.append(item)
                else:  # packed
                    column.extend(_varints(item))
            columns.append(column)
    if (counts[1], counts[2]) != (replicas, partitions) or len(columns) != partitions:
        raise Refused("the options' device assignment is not their replicas x partitions")
    if any(len(c) != replicas for c in columns):
        raise Refused("the options' device assignment is not their replicas x partitions")
    return [columns[c][r] for r in range(replicas) for c in range(partitions)]


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if pos >= len(data) or shift > 63:
            raise Refused("the options' device assignment is unreadable")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _varints(data: bytes) -> Iterator[int]:
    pos = 0
    while pos < len(data):
        value, pos = _varint(data, pos)
        yield value


def _fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of a protobuf message: varints and
    length-delimited fields only (all a device assignment has)."""
    pos = 0
    while pos < len(data):
        tag, pos = _varint(data, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            yield number, wire, value
        elif wire == 2:
            size, pos = _varint(data, pos)
            if pos + size > len(data):
                raise Refused("the options' device assignment is unreadable")
            yield number, wire, data[pos : pos + size]
            pos += size
        else:
            raise Refused("the options' device assignment is unreadable")
