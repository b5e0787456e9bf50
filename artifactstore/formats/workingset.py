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

Format: one UTF-8 JSON object of at most MAX_WORKING_SET_BYTES,

    {"v": 1, "p": program id, "f": fingerprint digest,
     "e": [[entry key, base64 compile options, [device id, ...], host callbacks], ...]}

in first-use order, at most MAX_WORKING_SET_KEYS entries, named by the program id
(`program_id`: a digest of the program and the fingerprint). Version 2 adds a fifth
field to each entry, its kind: "jit" (an executable JAX asks for through the compile
hook) or "named" (a named executable's payload, `formats.named`; no options). A set
with no named entry is written as version 1, so that clients from before version 2
still read it during a rollout; they refuse a version 2 set whole (no prediction,
never a wrong load). Records come from a bucket that anyone who may write it chose:
parsed with `load_record`, every field checked, anything else refused whole
(`CorruptObject`).

Signed sets (issue 38): a record decides what a reader deserializes (which entries,
with which options and devices), so where a process requires signatures
(ARTSTORE_TRUSTED_KEYS, the default of team stores) it follows a set only when a trusted
key signed it. A writer holding ARTSTORE_SIGNING_KEY adds one field to the object,

    "s": {"k": key name, "sig": base64 Ed25519 signature}

over the namespace, the program id and the record without "s" (formats.signing's signed
records, under a domain tag of its own, `SET_DOMAIN`: no entry signature is a working
set's, nor the other way).
Old and new clients during a rollout: clients from before signatures ignore the field
and read a signed set as before; a new client that requires signatures refuses an old
client's unsigned set whole (no prediction, never a wrong load); one that does not
require them reads both.

A host also keeps, in its tier only, the program's *hint*: the fingerprint digest and
platform of its last run's default backend (`Hint`), so that the next run fetches and
verifies its working set while JAX still initializes the backend that the fingerprint
is computed from; deserializing waits for the backend, and a wrong hint costs the
fetches only.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from artifactstore.errors import CorruptObject
from artifactstore.formats.codec import check_digest
from artifactstore.formats.manifest import check_key
from artifactstore.formats.records import decode_record
from artifactstore.formats.signing import (
    RECORD_SEPARATORS,
    RecordSignature,
    record_refusal,
    record_signature,
    sign_record,
)

if TYPE_CHECKING:
    from artifactstore.formats.signing import SigningKey, TrustedKeys

FORMAT_VERSION = 2
READ_VERSIONS = (1, 2)
KINDS = ("jit", "named")
MAX_WORKING_SET_BYTES = 1024 * 1024
MAX_WORKING_SET_KEYS = 256
MAX_HINT_BYTES = 1024
# One entry's compile options, serialized (a few KiB for the largest programs we know).
MAX_OPTIONS_BYTES = 64 * 1024
# Devices of one executable: a large pod slice's, with room to spare.
MAX_DEVICES = 16384
_NAME_RE = re.compile(r"[0-9a-f]{40}")
SET_DOMAIN = b"artifactstore-working-set-signature-v1\x00"


@dataclass(frozen=True)
class WorkingEntry:
    """One key a process loaded or stored, with what deserializing it needs."""

    key: str
    options: bytes  # the compile options, serialized (`CompileOptions.SerializeAsString`)
    devices: tuple[int, ...]  # the ids of the executable's devices, in order
    callbacks: int = 0  # host callbacks: such entries are never loaded ahead
    kind: str = "jit"  # or "named": a named executable (its devices are its header's)


@dataclass(frozen=True)
class WorkingSet:
    program: str  # the record's name: `program_id(...)`
    fingerprint: str  # the fingerprint digest every entry was built for
    entries: tuple[WorkingEntry, ...]
    signature: RecordSignature | None = field(default=None, compare=False)

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(e.key for e in self.entries)

    def encode(self, signer: SigningKey | None = None, namespace: str = "") -> bytes:
        """The record, signed by `signer` for `namespace` if given; entries beyond the
        bounds (count, then bytes) are left out, the latest first used going first."""
        kept = [
            e
            for e in self.entries[:MAX_WORKING_SET_KEYS]
            if len(e.options) <= MAX_OPTIONS_BYTES and len(e.devices) <= MAX_DEVICES
        ]
        version = 1 if all(e.kind == "jit" for e in kept) else FORMAT_VERSION
        rows = [
            [e.key, base64.b64encode(e.options).decode(), list(e.devices), e.callbacks]
            + ([e.kind] if version > 1 else [])
            for e in kept
        ]
        while True:
            record: dict[str, Any] = {
                "v": version,
                "p": self.program,
                "f": self.fingerprint,
                "e": rows,
            }
            if signer is not None:
                record = sign_record(record, signer, SET_DOMAIN, namespace, self.program)
            data = json.dumps(record, separators=RECORD_SEPARATORS).encode()
            if len(data) <= MAX_WORKING_SET_BYTES or not rows:
                return data
            rows = rows[: len(rows) * 3 // 4]

    @classmethod
    def decode(cls, data: bytes, program: str) -> WorkingSet:
        """The working set recorded under `program`; CorruptObject for anything else."""

        def parse(raw: dict[str, Any]) -> WorkingSet:
            rows = raw["e"]
            if not isinstance(rows, list) or len(rows) > MAX_WORKING_SET_KEYS:
                raise ValueError("entries not a list within the bound")
            return cls(
                program=check_program_id(raw["p"]),
                fingerprint=check_digest(raw["f"]),
                entries=tuple(_entry(row, raw["v"]) for row in rows),
                signature=record_signature(raw),
            )

        what = f"working set {program[:12]}"
        found = decode_record(data, what, MAX_WORKING_SET_BYTES, READ_VERSIONS, parse)
        if found.program != program:
            raise CorruptObject(f"working set under {program[:12]} is {found.program[:12]}'s")
        return found

    def refusal(self, trusted: TrustedKeys, namespace: str) -> str | None:
        """Why a process that requires signatures does not follow this set (one line, no
        key material); None when a key in `trusted` signed it for `namespace`."""
        return record_refusal(self.signature, trusted, SET_DOMAIN, namespace, self.program)


def _entry(row: Any, version: int) -> WorkingEntry:
    if not isinstance(row, list) or len(row) != 3 + version:
        raise ValueError(f"an entry of a version {version} set has not {3 + version} fields")
    key, options, devices, callbacks = row[:4]
    kind = row[4] if version > 1 else "jit"
    if kind not in KINDS:
        raise ValueError(f"an entry's kind is not one of {KINDS}")
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
    return WorkingEntry(
        check_key(str(key)) if isinstance(key, str) else _bad(),
        raw_options,
        tuple(devices),
        callbacks,
        kind,
    )


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


@dataclass(frozen=True)
class Hint:
    """A program's last default backend on this host: which working set to fetch while
    JAX still initializes this run's (`{"v": 1, "f": digest, "pl": platform}`)."""

    fingerprint: str
    platform: str

    def encode(self) -> bytes:
        return json.dumps({"v": 1, "f": self.fingerprint, "pl": self.platform}).encode()

    @classmethod
    def decode(cls, data: bytes) -> Hint:
        def parse(raw: dict[str, Any]) -> Hint:
            platform = raw["pl"]
            if not isinstance(platform, str) or not re.fullmatch(r"[a-z0-9_]{1,32}", platform):
                raise ValueError("not a platform name")
            return cls(check_digest(raw["f"]), platform)

        return decode_record(data, "working set hint", MAX_HINT_BYTES, (1,), parse)


def hint_id(program: str) -> str:
    """The hint's name: the program on this host, whatever its platform."""
    return program_id(program, "hint")
