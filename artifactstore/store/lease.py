"""Compile leases as records and settings: what single-flight (store.flight) decides by.

Why apart: these are pure decisions (a lease's name, its object-store record, how
long a waiter waits, whether single-flight is on here) that `artstore doctor` and
the tests ask about without taking a lease.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from artifactstore.errors import CorruptObject, one_line
from artifactstore.formats.manifest import load_record

if TYPE_CHECKING:
    from artifactstore.config import Settings

FORMAT_VERSION = 1
MAX_RECORD_BYTES = 1024
# Without a known compile time, how long a waiter trusts a beating holder: long
# compiles are what this exists for (simulators take minutes), a hung one is rare.
DEFAULT_WAIT_SECS = 300.0
MIN_WAIT_SECS = 30.0
WAIT_MULTIPLE = 3.0
# Network filesystems whose locks SQLite cannot trust: an index there gets no leases.
_NETWORK_FS = ("nfs", "cifs", "smb", "9p", "lustre", "gpfs", "ceph", "gluster", "fuse", "afs")


def lease_name(namespace: str, key: str) -> str:
    """The index row's name: the key, and the namespace hashed to fit the column."""
    return f"compile:{key}:{hashlib.sha256(namespace.encode()).hexdigest()[:16]}"


@dataclass(frozen=True)
class LeaseRecord:
    """The object-store mirror of a compile lease, read by waiters (format version 1):
    `{"v": 1, "holder": "host:pid", "beat": n, "ttl": secs, "state": "compiling" |
    "abandoned", "hint": secs | null}`."""

    holder: str
    beat: int
    ttl: float
    state: str = "compiling"
    hint: float | None = None

    def encode(self) -> bytes:
        body = {
            "v": FORMAT_VERSION,
            "holder": self.holder,
            "beat": self.beat,
            "ttl": self.ttl,
            "state": self.state,
            "hint": self.hint,
        }
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> LeaseRecord:
        try:  # CorruptObject whatever the bytes (a bucket writer's) make fail
            raw = load_record(data[: MAX_RECORD_BYTES + 1])
            if len(data) > MAX_RECORD_BYTES or raw.get("v") != FORMAT_VERSION:
                raise ValueError("not a version 1 lease record")
            hint, beat = raw.get("hint"), raw["beat"]
            if isinstance(beat, bool) or not isinstance(beat, int) or not 0 <= beat < 2**63:
                raise ValueError("beat is not a count")
            record = cls(
                holder=str(raw["holder"])[:255],
                beat=beat,
                ttl=float(raw["ttl"]),
                state=str(raw["state"]),
                hint=None if hint is None else float(hint),
            )
        except Exception as exc:  # ValueError, OverflowError, RecursionError, ...
            raise CorruptObject(f"bad lease record ({one_line(exc)})") from None
        if record.state not in ("compiling", "abandoned") or not (
            math.isfinite(record.ttl) and record.ttl > 0
        ):
            raise CorruptObject("bad lease record (state or ttl)")
        return record


def wait_bound(settings: Settings, hint: float | None) -> float:
    """How long a waiter waits at most: the setting, else a multiple of the hint (its own
    index's, never a record's), and never past ARTSTORE_LEASE_MAX_HOLD."""
    if settings.lease_wait_secs is not None:
        return settings.lease_wait_secs
    known = hint is not None and math.isfinite(hint) and hint > 0
    wait = max(MIN_WAIT_SECS, WAIT_MULTIPLE * hint) if hint and known else DEFAULT_WAIT_SECS
    return min(wait, settings.lease_max_hold_secs)


def enabled(settings: Settings) -> tuple[bool, str]:
    """Whether single-flight is on here, and why (for `artstore doctor`).

    `auto` (the default) turns it on where every process sharing the store shares
    the leases too and a holder's death is noticed: a PostgreSQL index, or a
    SQLite index on a local filesystem (one host's processes); off for SQLite on
    a network filesystem, whose locks cannot be trusted.
    """
    mode = settings.single_flight
    if mode == "off":
        return False, "off (ARTSTORE_SINGLE_FLIGHT=0)"
    if mode == "on":
        return True, "on (ARTSTORE_SINGLE_FLIGHT=1)"
    if settings.index_is_server:
        return True, "on (auto: PostgreSQL index)"
    path = settings.index_url.split("///", 1)[-1]
    fs = filesystem_type(Path(path).parent)
    if fs is not None and fs.startswith(_NETWORK_FS):
        return False, f"off (auto: the SQLite index is on {fs}; set ARTSTORE_SINGLE_FLIGHT=1)"
    return True, "on (auto: SQLite index on a local filesystem)"


def filesystem_type(path: Path) -> str | None:
    """The type of the filesystem holding `path` (Linux /proc/mounts), or None."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return None
    target = str(path.resolve())
    best, fstype = "", None
    for line in mounts:
        parts = line.split()
        if len(parts) < 3:
            continue
        point = parts[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, fstype = point, parts[2]
    return fstype
