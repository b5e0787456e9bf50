"""Native modules (IREE) as entries: their key, fingerprint and payload frame.

A native module is a named function's portable StableHLO compiled by IREE for one
target (`llvm-cpu`, for one CPU: `generic`, this host's features, or a list of
features). It is an entry of its NAME@VERSION like the named executable's own
entries (module name `named:NAME@VERSION`, so `ls --named`, `rm --name`, removal
records and bundles' `--name` cover it), told apart by its payload's MAGIC, its key's
domain and its fingerprint's platform (`iree-llvm-cpu`). The key binds the name and
version to the digest of the StableHLO it was compiled from (the portable form's
`jax.export` serialization) and to the fingerprint, which holds the target, the CPU
architecture and features it was compiled for, and the compiler's version: a module
is never served to a host whose CPU lacks a feature it was built for (the reader asks
only for fingerprints whose features its host has).

The payload is `MAGIC, format version, header length, header (JSON), body (.vmfb)`;
the header is the calling convention (`native.convention`). `unframe` is the one
parser of a stored payload's frame: the verifier runs it on every path (store, tier,
pull, import, sign), so a payload that does not parse never reaches IREE.
"""

from __future__ import annotations

import hashlib
import json
import struct
from typing import Any

from artifactstore.errors import CorruptObject
from artifactstore.formats.fingerprint import FINGERPRINT_VERSION, Fingerprint
from artifactstore.formats.named import split_frame

MAGIC = b"ARTSTORE-NATIVE\0"
FORMAT_VERSION = 1
PLATFORM_PREFIX = "iree-"  # the fingerprint's platform: iree-<target>
KEY_FORMAT = "artifactstore-native-v1"
_LENGTH = struct.Struct(">BI")  # format version, header length
MAX_HEADER_BYTES = 1 << 20
# What every header must hold, and of which JSON type (the rest: native.convention).
REQUIRED = {
    "name": str,
    "version": str,
    "function": str,
    "stablehlo": str,
    "target": str,
    "cpu": str,
    "compiler": str,
    "inputs": dict,
    "outputs": dict,
}


def frame(header: dict[str, Any], body: bytes) -> bytes:
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    return MAGIC + _LENGTH.pack(FORMAT_VERSION, len(text)) + text + body


def unframe(payload: bytes) -> tuple[dict[str, Any], bytes]:
    """(the header as parsed JSON, the module's bytes); CorruptObject for anything that
    is not a native module payload of a format this client reads. Never raises
    anything else, whatever the bytes."""
    header, body = split_frame(payload, MAGIC, FORMAT_VERSION, "native module", MAX_HEADER_BYTES)
    if not isinstance(header, dict):
        raise CorruptObject("malformed native module header: not an object")
    for field, kind in REQUIRED.items():
        if not isinstance(header.get(field), kind):
            raise CorruptObject(f"malformed native module header: no valid {field!r}")
    if not body:
        raise CorruptObject("native module without a module")
    return header, body


def fingerprint(
    target: str, cpu_arch: str, cpu_features: tuple[str, ...], cpu: str, compiler: str
) -> Fingerprint:
    """The fingerprint of a module compiled for `target` on a CPU of `cpu_arch` with
    `cpu_features` (`cpu`: how they were chosen: generic, host or features) by IREE
    `compiler`. No JAX field applies: the module runs without it."""
    return Fingerprint(
        cpu_arch=cpu_arch,
        cpu_features=tuple(sorted(set(cpu_features))),
        os="any",
        jax_version="none",
        jaxlib_version="none",
        platform=PLATFORM_PREFIX + target,
        platform_version=f"iree {compiler}",
        device_kind=cpu,
        device_count=1,
        version=FINGERPRINT_VERSION,
    )


def entry_key(name: str, version: str, stablehlo: str, fingerprint_digest: str) -> str:
    """The key of NAME@VERSION's module compiled from the StableHLO of digest
    `stablehlo`, for the fingerprint of digest `fingerprint_digest`."""
    text = "\0".join((KEY_FORMAT, name, version, stablehlo, fingerprint_digest))
    return hashlib.sha256(text.encode()).hexdigest()
