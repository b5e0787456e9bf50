"""Named, expiring leases in the index: one `artstore gc` per namespace at a time, one
compile of a key at a time (single-flight, store.flight).

A lease is a row (name, holder, token, expires_at). Taking it is an insert, or
an update of a row whose expiry has passed, so a crashed holder blocks others
for at most one TTL. The holder renews it while it works and stops if it finds
the lease taken (it was paused past its expiry). Expiry uses the clients'
clocks, which must agree to well within the TTL (NTP).

A row is written by whoever may write the index's leases, not only by this code:
one that expires further ahead than the taker's maximum (ARTSTORE_LEASE_MAX_HOLD:
a forged "until year 9999", a clock far ahead) is taken over as if expired, and no
holder sets its expiry past that maximum, so no lease outlives what the operator set.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import socket
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import Engine, delete, func, or_, select, update

from artifactstore.errors import LeaseHeld
from artifactstore.index.models import Entry, LeaseRow, utcnow
from artifactstore.index.sql import upsert

DEFAULT_TTL_SECS = 300.0
# Keep in step with config.defaults.DEFAULT_LEASE_MAX_HOLD_SECS (index/ does not read settings).
DEFAULT_MAX_HOLD_SECS = 600.0


def compile_lease_name(namespace: str, key: str) -> str:
    """A compile lease's row name (single-flight): the key, and the namespace hashed to
    fit the column."""
    return f"compile:{key}:{hashlib.sha256(namespace.encode()).hexdigest()[:16]}"


def compile_hint(engine: Engine, key: str) -> float | None:
    """`key`'s last known compile time (the longest of its entries'), or None: how long
    a writer waiting for its compile may expect to wait (never a record's word)."""
    with engine.connect() as conn:
        hint = conn.execute(select(func.max(Entry.compile_secs)).where(Entry.key == key)).scalar()
    return None if hint is None else float(hint)


def holder_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"[:255]


def dead_here(holder: str) -> bool:
    """Whether `holder` (host:pid) names a process of this host that has exited."""
    host, _, pid = holder.rpartition(":")
    if host != socket.gethostname()[: 255 - len(pid) - 1] or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:  # exists, another user's
        return False
    return False


@dataclass
class Lease:
    """One named lease as this process holds it (its row is `LeaseRow`)."""

    engine: Engine
    name: str
    ttl_secs: float = DEFAULT_TTL_SECS
    holder: str = field(default_factory=holder_name)
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    _renewed: float = 0.0
    # Whether the last successful try_acquire took the lease from another holder (expired,
    # expiring past the maximum, or dead on this host) rather than finding it free.
    took_over: bool = False
    # ARTSTORE_LEASE_MAX_HOLD: no row counts as held further ahead than this (see above).
    max_hold_secs: float = DEFAULT_MAX_HOLD_SECS

    def __post_init__(self) -> None:
        self.ttl_secs = min(self.ttl_secs, self.max_hold_secs)  # renewed no further

    def _expiry(self) -> datetime:
        return utcnow() + timedelta(seconds=self.ttl_secs)

    def try_acquire(self) -> tuple[str, datetime] | None:
        """Take the lease; None on success, else (holder, expires_at) of the current holder."""
        now = utcnow()
        values = {"holder": self.holder, "token": self.token, "expires_at": self._expiry()}
        with self.engine.begin() as conn:
            taken = conn.execute(
                upsert(self.engine, LeaseRow)
                .values(name=self.name, **values)
                .on_conflict_do_nothing()
                .returning(LeaseRow.name)
            ).first()
            self.took_over = taken is None
            if taken is None:
                beyond = now + timedelta(seconds=self.max_hold_secs)
                stale = conn.execute(
                    update(LeaseRow)
                    .where(
                        LeaseRow.name == self.name,
                        or_(LeaseRow.expires_at < now, LeaseRow.expires_at > beyond),
                    )
                    .values(**values)
                )
                if stale.rowcount != 1:
                    row = conn.execute(
                        select(LeaseRow.holder, LeaseRow.expires_at, LeaseRow.token).where(
                            LeaseRow.name == self.name
                        )
                    ).first()
                    if row is None:
                        return ("(released just now)", now)
                    # A holder on this host that no longer runs (killed, or it failed
                    # while the database was down and could not release) is taken over
                    # at once rather than after its TTL; the token makes it one taker.
                    dead = (
                        dead_here(str(row[0]))
                        and conn.execute(
                            update(LeaseRow)
                            .where(LeaseRow.name == self.name, LeaseRow.token == row[2])
                            .values(**values)
                        ).rowcount
                        == 1
                    )
                    if not dead:
                        return str(row[0]), row[1]
        self._renewed = time.monotonic()
        return None

    def acquire(self, *, wait: bool = False, poll_secs: float = 2.0) -> None:
        """Take the lease, or raise LeaseHeld naming the holder (or wait with `wait`)."""
        while True:
            other = self.try_acquire()
            if other is None:
                return
            if not wait:
                holder, expires = other
                raise LeaseHeld(
                    f"{self.name} is held by {holder} until {expires:%Y-%m-%d %H:%M:%S} UTC: "
                    "wait for it to finish, or pass --wait"
                )
            time.sleep(poll_secs)

    def renew(self) -> None:
        """Extend the lease; raise LeaseHeld if another process took it over."""
        with self.engine.begin() as conn:
            result = conn.execute(
                update(LeaseRow)
                .where(LeaseRow.name == self.name, LeaseRow.token == self.token)
                .values(expires_at=self._expiry())
            )
        if result.rowcount != 1:
            raise LeaseHeld(
                f"lost {self.name} (expired while paused and taken over): stopped; run again"
            )
        self._renewed = time.monotonic()

    def keep_alive(self) -> None:
        """Renew when a third of the TTL has passed; cheap to call once per batch."""
        if time.monotonic() - self._renewed > self.ttl_secs / 3:
            self.renew()

    def release(self) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                delete(LeaseRow).where(LeaseRow.name == self.name, LeaseRow.token == self.token)
            )


def stale_leases(
    engine: Engine,
    namespace: str,
    *,
    grace_secs: float,
    max_hold_secs: float,
    remove: bool,
    limit: int = 10_000,
) -> list[str]:
    """The names of `namespace`'s compile leases whose holder is gone: expired more than
    `grace_secs` ago, expiring further ahead than `max_hold_secs` (forged, or a clock far
    ahead: takers already treat it as expired), or held by a process of this host that has
    exited; deleted when `remove` (gc), each only if still held by the same token. At most
    `limit` a call. A holder paused past that finds its lease lost, as after a takeover."""
    prefix, _, suffix = compile_lease_name(namespace, "\0").partition("\0")
    now = utcnow()
    early = now - timedelta(seconds=grace_secs)
    late = now + timedelta(seconds=max_hold_secs + grace_secs)
    named = LeaseRow.name.like(_like(prefix) + "%" + _like(suffix), escape="\\")
    query = select(LeaseRow.name, LeaseRow.holder, LeaseRow.token, LeaseRow.expires_at)
    with engine.begin() as conn:
        rows = conn.execute(query.where(named).limit(limit)).all()
        gone = [
            (name, token)
            for name, holder, token, expires in rows
            if expires < early or expires > late or dead_here(str(holder))
        ]
        if gone and remove:
            for name, token in gone:
                conn.execute(delete(LeaseRow).where(LeaseRow.name == name, LeaseRow.token == token))
    return [name for name, _ in gone]


def live_leases(engine: Engine, names: list[str], *, grace_secs: float) -> set[str]:
    """Which of `names` are leases held now (or expired less than `grace_secs` ago)."""
    if not names:
        return set()
    since = utcnow() - timedelta(seconds=grace_secs)
    with engine.connect() as conn:
        query = select(LeaseRow.name).where(LeaseRow.name.in_(names), LeaseRow.expires_at >= since)
        return set(conn.execute(query).scalars())


def _like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
