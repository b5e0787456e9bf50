"""Quick-key records: a key that compiles too fast to be stored, published beside the manifests.

Why: trivial jits compile faster than ARTSTORE_MIN_COMPILE_SECS and are never stored.
A host's tier remembers them so that its processes never look them up
(artifactstore.store.quick), but a node that `artstore pull` prepared has never compiled
them: without these records it would look each one up in the object store, a certain
miss, and with the store down pay the timeout and log a line. So a writer that looked
such a key up, found nothing and compiled it below the threshold publishes one of these,
and `pull` merges this fingerprint's into the tier (keys that have a manifest are stored
now, so not quick: those are left out; gc deletes their records).

Everything is in the name, `{fingerprint digest}.{entry key}`, so that a pull learns the
keys from one listing, never a GET per record. The body is informative only (nothing
trusts it): `{"v": 1, "c": compile seconds}`, at most MAX_QUICK_BYTES.

A forged record can only make pulled nodes compile a key instead of looking it up (the
cost of a cold start, never a wrong load); only writers may put them.

A host's tier keeps its own such keys in one file (`below-threshold.json`, merged by each
process at exit: artifactstore.store.quick): one JSON object, `{key: [compile seconds,
expiry in seconds since the epoch]}`; one the tier cannot read is set aside whole.
"""

from __future__ import annotations

import json
import math
from typing import Any

from artifactstore.errors import CorruptObject, one_line
from artifactstore.formats.codec import check_digest
from artifactstore.formats.manifest import check_key
from artifactstore.formats.records import decode_record, load_record

FORMAT_VERSION = 1
MAX_QUICK_BYTES = 256
SEPARATOR = "."  # between the fingerprint digest and the key (neither holds one)
# The tier's file: key -> (compile seconds, expiry as seconds since the epoch)
BelowThreshold = dict[str, tuple[float, float]]


def quick_name(fingerprint: str, key: str) -> str:
    """The record's name for `key` compiled on the platform `fingerprint` (a digest)."""
    return f"{check_digest(fingerprint)}{SEPARATOR}{check_key(key)}"


def split_quick_name(name: str) -> tuple[str, str]:
    """(fingerprint digest, key) of a record's name; ValueError if it is not one of ours."""
    fingerprint, sep, key = name.partition(SEPARATOR)
    try:
        if not sep:
            raise ValueError("no separator")
        return check_digest(fingerprint), check_key(key)
    except ValueError:
        raise ValueError(f"not a quick-key record name: {name[:140]!r}") from None


def check_quick_name(name: str) -> str:
    """`name` if it names a quick-key record, else ValueError (for RecordKind.check_name)."""
    split_quick_name(name)
    return name


def encode(compile_secs: float) -> bytes:
    secs = compile_secs if math.isfinite(compile_secs) and compile_secs >= 0 else 0.0
    body = {"v": FORMAT_VERSION, "c": round(min(secs, 1e6), 4)}
    return json.dumps(body, separators=(",", ":")).encode()


def decode(data: bytes) -> float:
    """The compile seconds a record says; CorruptObject for anything that is not one."""

    def parse(raw: dict[str, Any]) -> float:
        secs = raw["c"]
        if isinstance(secs, bool) or not isinstance(secs, (int, float)):
            raise ValueError("compile seconds are not a number")
        if not 0 <= secs < 1e9:  # also false for NaN
            raise ValueError("compile seconds out of range")
        return float(secs)

    return decode_record(data, "quick-key record", MAX_QUICK_BYTES, (FORMAT_VERSION,), parse)


def encode_below_threshold(keys: BelowThreshold) -> bytes:
    """The tier's below-threshold file holding `keys`."""
    return json.dumps(keys).encode()


def decode_below_threshold(data: bytes) -> BelowThreshold:
    """The keys a tier's below-threshold file holds (any process of the host may have
    written it); CorruptObject for anything that is not one."""
    try:
        raw = load_record(data)  # nested a few levels at most
        return {str(k): (float(c), float(t)) for k, (c, t) in raw.items()}
    except Exception as exc:  # ValueError, TypeError, AttributeError, OverflowError, ...
        raise CorruptObject(f"below-threshold keys unreadable ({one_line(exc)})") from None
