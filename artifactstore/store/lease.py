"""Compile leases as records and settings: what single-flight (store.flight) decides by.

Why apart: these are pure decisions (a lease's name, its object-store record, how
long a waiter waits, whether single-flight is on here) that `artstore doctor` and
the tests ask about without taking a lease.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
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
    "abandoned", "hint": secs | null, "at": unix secs}` (`at`, the holder's clock at its
    last beat, is optional: older writers leave it out)."""

    holder: str
    beat: int
    ttl: float
    state: str = "compiling"
    hint: float | None = None
    at: float | None = None

    def encode(self) -> bytes:
        body = {
            "v": FORMAT_VERSION,
            "holder": self.holder,
            "beat": self.beat,
            "ttl": self.ttl,
            "state": self.state,
            "hint": self.hint,
        }
        if self.at is not None:
            body["at"] = round(self.at, 3)
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> LeaseRecord:
        try:  # CorruptObject whatever the bytes (a bucket writer's) make fail
            raw = load_record(data[: MAX_RECORD_BYTES + 1])
            if len(data) > MAX_RECORD_BYTES or raw.get("v") != FORMAT_VERSION:
                raise ValueError("not a version 1 lease record")
            hint, beat, at = raw.get("hint"), raw["beat"], raw.get("at")
            if isinstance(beat, bool) or not isinstance(beat, int) or not 0 <= beat < 2**63:
                raise ValueError("beat is not a count")
            record = cls(
                holder=str(raw["holder"])[:255],
                beat=beat,
                ttl=float(raw["ttl"]),
                state=str(raw["state"]),
                hint=None if hint is None else float(hint),
                at=None if at is None else float(at),
            )
        except Exception as exc:  # ValueError, OverflowError, RecursionError, ...
            raise CorruptObject(f"bad lease record ({one_line(exc)})") from None
        if record.state not in ("compiling", "abandoned") or not (
            math.isfinite(record.ttl) and record.ttl > 0
        ):
            raise CorruptObject("bad lease record (state or ttl)")
        if record.at is not None and not math.isfinite(record.at):
            raise CorruptObject("bad lease record (at)")
        return record

    def expired(self, settings: Settings, now: float) -> bool:
        """Whether the holder stopped beating longer ago than its TTL and a grace (this
        process's own TTL): its holder is dead or cut off, and waiting gains nothing. A
        record without `at`, or one dated ahead, is not expired: what it may cost is
        bounded by the waiter's own settings (`reader_wait`, `wait_bound`), never by it."""
        if self.at is None:
            return False
        ttl = min(self.ttl, settings.lease_max_hold_secs)
        return now - self.at > ttl + settings.lease_ttl_secs

    def shown_holder(self) -> str:
        """The holder, as a log line may show it (untrusted text: no control characters)."""
        return re.sub(r"[^A-Za-z0-9._:@-]", "?", self.holder[:80]) or "?"


def wait_bound(settings: Settings, hint: float | None) -> float:
    """How long a waiter waits at most: the setting, else a multiple of the hint (its own
    index's, never a record's), and never past ARTSTORE_LEASE_MAX_HOLD."""
    if settings.lease_wait_secs is not None:
        return settings.lease_wait_secs
    known = hint is not None and math.isfinite(hint) and hint > 0
    wait = max(MIN_WAIT_SECS, WAIT_MULTIPLE * hint) if hint and known else DEFAULT_WAIT_SECS
    return min(wait, settings.lease_max_hold_secs)


def reader_wait(settings: Settings) -> tuple[float, str]:
    """How long a read-only reader waits for a writer's compile at most, and the setting
    that says so: ARTSTORE_LEASE_READER_WAIT (a few seconds), or ARTSTORE_LEASE_WAIT when
    shorter. A reader cannot take a silent holder's lease over, and a record anyone with
    bucket write can forge must not hold it longer than its own short bound."""
    bound, setting = settings.lease_reader_wait_secs, "ARTSTORE_LEASE_READER_WAIT"
    if settings.lease_wait_secs is not None and settings.lease_wait_secs < bound:
        bound, setting = settings.lease_wait_secs, "ARTSTORE_LEASE_WAIT"
    return bound, setting


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
