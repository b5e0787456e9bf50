"""SQLAlchemy 2.0 typed models of the index; the schema itself is made by Alembic.

The same models serve SQLite (embedded default) and PostgreSQL (teams). Every
table is partitioned by `namespace` so teams sharing one database never see
each other's rows.
"""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Date,
    DateTime,
    Float,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

DIGEST = String(64)
NAMESPACE = String(63)


# The largest value of a BIGINT column: hit counts saturate here (index/accesses.py).
BIGINT_MAX = 2**63 - 1


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite stores naive text)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        assert isinstance(value, datetime)
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    pass


class Entry(Base):
    """One cache key and what it resolves to."""

    __tablename__ = "entries"
    __table_args__ = (
        UniqueConstraint("namespace", "key", name="uq_entries_namespace_key"),
        # (last_access, id): gc walks entries oldest first with keyset pagination.
        Index("ix_entries_namespace_last_access_id", "namespace", "last_access", "id"),
        Index("ix_entries_namespace_digest", "namespace", "digest"),
        Index("ix_entries_namespace_jaxlib", "namespace", "jaxlib_version"),
    )

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    namespace: Mapped[str] = mapped_column(NAMESPACE)
    key: Mapped[str] = mapped_column(String(64))
    digest: Mapped[str] = mapped_column(DIGEST)
    size: Mapped[int] = mapped_column(BigInteger)
    raw_size: Mapped[int] = mapped_column(BigInteger)
    module_name: Mapped[str] = mapped_column(String(255))
    platform: Mapped[str] = mapped_column(String(32))
    platform_version: Mapped[str] = mapped_column(String(255))
    device_kind: Mapped[str] = mapped_column(String(255))
    device_count: Mapped[int] = mapped_column(Integer)
    jax_version: Mapped[str] = mapped_column(String(32))
    jaxlib_version: Mapped[str] = mapped_column(String(32))
    cpu_arch: Mapped[str] = mapped_column(String(32))
    fingerprint: Mapped[str] = mapped_column(DIGEST)
    compile_secs: Mapped[float] = mapped_column(Float)
    producer_host: Mapped[str] = mapped_column(String(255))
    # Signed entries (migration 0003): the signing key's name and the signature
    # (base64 Ed25519); NULL for unsigned entries and those written before 0003.
    signer: Mapped[str | None] = mapped_column(String(63), nullable=True, default=None)
    signature: Mapped[str | None] = mapped_column(String(128), nullable=True, default=None)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_access: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    hits: Mapped[int] = mapped_column(BigInteger, default=0)


class StoredObject(Base):
    """An object known to be durable in the blob store (recorded after the PUT)."""

    __tablename__ = "objects"

    namespace: Mapped[str] = mapped_column(NAMESPACE, primary_key=True)
    digest: Mapped[str] = mapped_column(DIGEST, primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class FingerprintRow(Base):
    """The full fingerprint behind a digest, stored once for all its entries."""

    __tablename__ = "fingerprints"

    digest: Mapped[str] = mapped_column(DIGEST, primary_key=True)
    body: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class CounterRow(Base):
    """Per-namespace event counts that have no row of their own (misses, corrupt objects)."""

    __tablename__ = "counters"

    namespace: Mapped[str] = mapped_column(NAMESPACE, primary_key=True)
    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger, default=0)


class UsageRow(Base):
    """What processes saw, per namespace, UTC day and platform fingerprint (migration 0004).

    Written by this version's clients only, in the flush that writes `counters` (or
    folded from their hit journals): old clients add to `counters` and `entries.hits`
    alone, so `artstore stats` takes its namespace totals from those and its
    per-day and per-fingerprint rows from here (README: "Stats"). Every column is
    a sum, added to by upserts; `fingerprint` is "" where the event had none (a
    counter added without one, such as a lease wait).
    Eligible misses are `misses - misses_below_threshold`.
    """

    __tablename__ = "usage"

    namespace: Mapped[str] = mapped_column(NAMESPACE, primary_key=True)
    day: Mapped[date] = mapped_column(Date, primary_key=True)
    fingerprint: Mapped[str] = mapped_column(DIGEST, primary_key=True)
    hits: Mapped[int] = mapped_column(BigInteger, default=0)
    misses: Mapped[int] = mapped_column(BigInteger, default=0)
    misses_below_threshold: Mapped[int] = mapped_column(BigInteger, default=0)
    below_threshold: Mapped[int] = mapped_column(BigInteger, default=0)
    bytes_fetched: Mapped[int] = mapped_column(BigInteger, default=0)
    compile_secs_saved: Mapped[float] = mapped_column(Float, default=0.0)
    lease_waits: Mapped[int] = mapped_column(BigInteger, default=0)
    lease_takeovers: Mapped[int] = mapped_column(BigInteger, default=0)


class Access(Base):
    """Hits recorded by read-only readers, insert-only; gc folds them into entries.

    Readers may not update `entries` (their database role has INSERT on this
    table only), so they append batches here and LRU still reflects the cluster.
    """

    __tablename__ = "accesses"
    __table_args__ = (Index("ix_accesses_namespace_key", "namespace", "key"),)

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    namespace: Mapped[str] = mapped_column(NAMESPACE)
    key: Mapped[str] = mapped_column(String(64))
    hits: Mapped[int] = mapped_column(BigInteger)
    last_access: Mapped[datetime] = mapped_column(UTCDateTime)


class Quota(Base):
    """A namespace's size limit in bytes, enforced by `artstore gc`."""

    __tablename__ = "quotas"

    namespace: Mapped[str] = mapped_column(NAMESPACE, primary_key=True)
    max_bytes: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class LeaseRow(Base):
    """A named, expiring lock in the index (e.g. `gc:NAMESPACE`), so one gc runs at a time."""

    __tablename__ = "leases"

    name: Mapped[str] = mapped_column(String(127), primary_key=True)
    holder: Mapped[str] = mapped_column(String(255))
    token: Mapped[str] = mapped_column(String(32))
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)


class IdentityRow(Base):
    """The id of the object store a namespace of this index belongs to (store/identity.py)."""

    __tablename__ = "identities"

    namespace: Mapped[str] = mapped_column(NAMESPACE, primary_key=True)
    store_id: Mapped[str] = mapped_column(String(64))
    bound_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
