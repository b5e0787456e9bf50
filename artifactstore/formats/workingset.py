"""Working sets: what a program loaded or stored last time, so that the next run of it
loads that much ahead, while it still imports and traces (issue 31).

Why a record of its own: a warm start spends most of its time deserializing executables
one after another, as JAX asks for them; knowing the keys in advance lets a process
fetch, verify and deserialize them in parallel threads before JAX asks. A deserialize
needs what the compile hook cannot rebuild without the trace: the compile options and
the devices; the record carries both, per key. It is a prediction only: a prefetched
executable is used only when the request's key, fingerprint, options and devices equal
those it was deserialized with, and its object is verified exactly as any hit is, so a
stale, forged or damaged record costs bounded memory and background time, never a
wrong load.

Format (version 1): one UTF-8 JSON object of at most MAX_WORKING_SET_BYTES,

    {"v": 1, "p": program id, "f": fingerprint digest,
     "e": [[entry key, base64 compile options, [device id, ...], host callbacks], ...]}

in first-use order, at most MAX_WORKING_SET_KEYS entries, named by the program id
(`program_id`: a digest of the program and the fingerprint). Records come from a
bucket that anyone who may write it chose: parsed with `load_record`, every field
checked, anything else refused whole (`CorruptObject`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from artifactstore.errors import CorruptObject
from artifactstore.formats.codec import check_digest
from artifactstore.formats.manifest import check_key, load_record

FORMAT_VERSION = 1
MAX_WORKING_SET_BYTES = 1024 * 1024
MAX_WORKING_SET_KEYS = 256
# One entry's compile options, serialized (a few KiB for the largest programs we know).
MAX_OPTIONS_BYTES = 64 * 1024
# Devices of one executable: a large pod slice's, with room to spare.
MAX_DEVICES = 16384
_NAME_RE = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class WorkingEntry:
    """One key a process loaded or stored, with what deserializing it needs."""

    key: str
    options: bytes  # the compile options, serialized (`CompileOptions.SerializeAsString`)
    devices: tuple[int, ...]  # the ids of the executable's devices, in order
    callbacks: int = 0  # host callbacks: such entries are never loaded ahead


@dataclass(frozen=True)
class WorkingSet:
    program: str  # the record's name: `program_id(...)`
    fingerprint: str  # the fingerprint digest every entry was built for
    entries: tuple[WorkingEntry, ...]

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(e.key for e in self.entries)

    def encode(self) -> bytes:
        """The record; entries beyond the bounds (count, then bytes) are left out, the
        latest first used going first."""
        rows = [
            [e.key, base64.b64encode(e.options).decode(), list(e.devices), e.callbacks]
            for e in self.entries[:MAX_WORKING_SET_KEYS]
            if len(e.options) <= MAX_OPTIONS_BYTES and len(e.devices) <= MAX_DEVICES
        ]
        while True:
            record = {"v": FORMAT_VERSION, "p": self.program, "f": self.fingerprint, "e": rows}
            data = json.dumps(record, separators=(",", ":")).encode()
            if len(data) <= MAX_WORKING_SET_BYTES or not rows:
                return data
            rows = rows[: len(rows) * 3 // 4]

    @classmethod
    def decode(cls, data: bytes, program: str) -> WorkingSet:
        """The working set recorded under `program`; CorruptObject for anything else."""
        if len(data) > MAX_WORKING_SET_BYTES:
            raise CorruptObject(f"working set {program[:12]} is {len(data)} bytes: too big")
        try:
            raw = load_record(data)
            if not isinstance(raw, dict) or raw.get("v") != FORMAT_VERSION:
                raise ValueError("not a version 1 working set")
            rows = raw["e"]
            if not isinstance(rows, list) or len(rows) > MAX_WORKING_SET_KEYS:
                raise ValueError("entries not a list within the bound")
            found = cls(
                program=check_program_id(raw["p"]),
                fingerprint=check_digest(raw["f"]),
                entries=tuple(_entry(row) for row in rows),
            )
        except Exception as exc:  # anything the bytes can cause
            raise CorruptObject(f"working set {program[:12]} is unreadable ({exc})") from None
        if found.program != program:
            raise CorruptObject(f"working set under {program[:12]} is {found.program[:12]}'s")
        return found


def _entry(row: Any) -> WorkingEntry:
    if not isinstance(row, list) or len(row) != 4:
        raise ValueError("an entry is not [key, options, devices, callbacks]")
    key, options, devices, callbacks = row
    if not isinstance(options, str) or len(options) > MAX_OPTIONS_BYTES * 4 // 3 + 4:
        raise ValueError("options are not base64 within the bound")
    if not isinstance(devices, list) or len(devices) > MAX_DEVICES:
        raise ValueError("devices are not a list within the bound")
    if not all(type(d) is int and 0 <= d < 2**31 for d in devices):
        raise ValueError("a device id is not a small integer")
    if type(callbacks) is not int or not 0 <= callbacks < 2**31:
        raise ValueError("callbacks is not a count")
    try:
        raw_options = base64.b64decode(options, validate=True)
    except binascii.Error:
        raise ValueError("options are not base64") from None
    return WorkingEntry(check_key(str(key)) if isinstance(key, str) else _bad(), raw_options,
                        tuple(devices), callbacks)  # fmt: skip


def _bad() -> str:
    raise ValueError("a key is not text")


def program_id(program: str, fingerprint_digest: str) -> str:
    """The record's name: the program (a path, or ARTSTORE_PROGRAM) on one platform."""
    return hashlib.sha256(f"{program}\0{fingerprint_digest}".encode()).hexdigest()[:40]


def check_program_id(name: Any) -> str:
    """A working set's name as it may name a file or an object key: 40 hex digits."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ValueError(f"not a working set name: {str(name)[:140]!r}")
    return name
