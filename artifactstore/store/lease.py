"""Compile leases as settings: what single-flight (store.flight) and gc decide by.

Why apart: these are pure decisions (whether a record's holder expired, how long a
waiter waits, whether single-flight is on here) that `artstore doctor` and the tests
ask about without taking a lease. The record's format is formats.lease; the lease's
row and its name, index.leases.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from artifactstore.config import Settings
    from artifactstore.formats.lease import LeaseRecord

# Without a known compile time, how long a waiter trusts a beating holder: long
# compiles are what this exists for (simulators take minutes), a hung one is rare.
DEFAULT_WAIT_SECS = 300.0
MIN_WAIT_SECS = 30.0
WAIT_MULTIPLE = 3.0
# Network filesystems whose locks SQLite cannot trust: an index there gets no leases.
_NETWORK_FS = ("nfs", "cifs", "smb", "9p", "lustre", "gpfs", "ceph", "gluster", "fuse", "afs")


def expired(record: LeaseRecord, settings: Settings, now: float) -> bool:
    """Whether `record`'s holder stopped beating longer ago than its TTL and a grace (this
    process's own TTL): its holder is dead or cut off, and waiting gains nothing. A
    record without `at`, or one dated ahead, is not expired: what it may cost is
    bounded by the waiter's own settings (`reader_wait`, `wait_bound`), never by it."""
    if record.at is None:
        return False
    ttl = min(record.ttl, settings.lease_max_hold_secs)
    return now - record.at > ttl + settings.lease_ttl_secs


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


def trusts_no_key(settings: Settings) -> bool:
    """Signatures required and no key trusted (not even its own): every entry of the
    store is refused here, so no wait can end in a load, and a writer stores nothing."""
    trusted = settings.trusted_keys
    return trusted is not None and not trusted.names


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
