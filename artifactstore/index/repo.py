"""The queries the store and the CLI run against the index.

Inserts are idempotent upserts (`ON CONFLICT DO NOTHING` on both SQLite and
PostgreSQL), so many machines writing the same key at once leave one entry and
raise nothing.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, Float, and_, bindparam, cast, delete, func, select, update
from sqlalchemy.orm import Session

from artifactstore.config import check_namespace
from artifactstore.formats.codec import Encoded
from artifactstore.formats.put import Put
from artifactstore.formats.usage import Usage
from artifactstore.index.accesses import append_accesses, saturating_hits
from artifactstore.index.kept_hits import evicted, keep_hits, keep_late_hits
from artifactstore.index.models import CounterRow, Entry, FingerprintRow, StoredObject, utcnow
from artifactstore.index.sql import upsert
from artifactstore.index.totals import IndexStats
from artifactstore.index.usage import write_usage


@dataclass(frozen=True)
class NewEntry:
    """What a writer knows about an entry before it exists."""

    key: str
    digest: str
    size: int
    raw_size: int
    module_name: str
    platform: str
    platform_version: str
    device_kind: str
    device_count: int
    jax_version: str
    jaxlib_version: str
    cpu_arch: str
    fingerprint: str
    compile_secs: float
    producer_host: str
    # The name of the key that signed the object, and the signature (base64); None for
    # unsigned entries. Informational: readers verify the object's own signature frame.
    signer: str | None = field(default=None, kw_only=True)
    signature: str | None = field(default=None, kw_only=True)

    @classmethod
    def of(cls, put: Put, encoded: Encoded) -> NewEntry:
        """The row for `put` stored as the object `encoded`: platform columns from its
        fingerprint, text cut to the columns' widths. One place for a writer's put and for
        gc's rebuild from objects."""
        fingerprint = put.fingerprint
        return cls(
            key=put.key,
            digest=encoded.digest,
            size=len(encoded.data),
            raw_size=encoded.raw_size,
            module_name=put.module_name[:255],
            platform=fingerprint.platform,
            platform_version=fingerprint.platform_version[:255],
            device_kind=fingerprint.device_kind[:255],
            device_count=fingerprint.device_count,
            jax_version=fingerprint.jax_version,
            jaxlib_version=fingerprint.jaxlib_version,
            cpu_arch=fingerprint.cpu_arch,
            fingerprint=fingerprint.digest,
            compile_secs=float(put.compile_secs),
            producer_host=(put.producer_host or "")[:255],
            signer=encoded.signer,
            signature=encoded.signature,
        )


@dataclass(frozen=True)
class EntryInfo(NewEntry):
    """An entry as read back, detached from any session."""

    namespace: str
    created_at: datetime
    last_access: datetime
    hits: int

    @classmethod
    def from_row(cls, row: Entry) -> EntryInfo:
        return cls(**{name: getattr(row, name) for name in cls.__dataclass_fields__})

    def to_json(self) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in self.__dataclass_fields__}
        data["created_at"] = self.created_at.isoformat()
        data["last_access"] = self.last_access.isoformat()
        return data


@dataclass(frozen=True)
class Filters:
    """Which entries a query reads, applied in SQL (a store of millions of entries is
    never streamed through Python to pick a few)."""

    platform: str | None = None
    device_kind: str | None = None
    jaxlib_version: str | None = None
    # Module names starting with this text (`named:`: the named executables).
    module_prefix: str | None = None
    # A shell pattern over module names (`jit_train*`): `*` and `?` become LIKE's `%`
    # and `_`; a `[...]` set is matched in SQL as any one character, then exactly by
    # `iter_entries` (LIKE has no sets), so the result is the same as fnmatch's.
    module_glob: str | None = None
    fingerprint_prefix: str | None = None  # a fingerprint digest or a prefix of one

    def clauses(self) -> list[Any]:
        out: list[Any] = []
        if self.platform:
            out.append(Entry.platform == self.platform)
        if self.device_kind:
            out.append(Entry.device_kind == self.device_kind)
        if self.jaxlib_version:
            out.append(Entry.jaxlib_version == self.jaxlib_version)
        if self.module_prefix:
            out.append(Entry.module_name.startswith(self.module_prefix, autoescape=True))
        if self.module_glob is not None:
            out.append(Entry.module_name.like(glob_to_like(self.module_glob), escape="\\"))
        if self.fingerprint_prefix:
            out.append(Entry.fingerprint.startswith(self.fingerprint_prefix, autoescape=True))
        return out

    def accepts(self, entry: NewEntry) -> bool:
        """What SQL cannot say exactly: a module pattern with a `[...]` set."""
        glob = self.module_glob
        return glob is None or "[" not in glob or fnmatch.fnmatchcase(entry.module_name, glob)


def glob_to_like(pattern: str) -> str:
    """A LIKE pattern (escape character `\\`) matching at least what the shell pattern
    matches: exactly, unless it has a `[...]` set (then any one character there)."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "*":
            out.append("%")
        elif c == "?":
            out.append("_")
        elif c == "[" and "]" in pattern[i + 2 :]:
            out.append("_")
            i = pattern.index("]", i + 2)
        elif c in "%_\\":
            out.append("\\" + c)
        else:
            out.append(c)
        i += 1
    return "".join(out)


class EntryIndex:
    """The entries, objects and counters of one namespace, as the store and the CLI use them."""

    def __init__(self, engine: Engine, namespace: str) -> None:
        self.engine = engine
        self.namespace = check_namespace(namespace)

    # -- hot path -----------------------------------------------------------
    def lookup(self, key: str) -> EntryInfo | None:
        with Session(self.engine) as session:
            row = session.scalars(
                select(Entry).where(Entry.namespace == self.namespace, Entry.key == key)
            ).first()
            return EntryInfo.from_row(row) if row is not None else None

    # -- writes -------------------------------------------------------------
    def add_entry(self, entry: NewEntry, fingerprint_json: str) -> bool:
        """Insert the entry (and its object and fingerprint rows); False if the key existed."""
        now = utcnow()
        values = {name: getattr(entry, name) for name in entry.__dataclass_fields__}
        with self.engine.begin() as conn:
            conn.execute(
                upsert(self.engine, FingerprintRow)
                .values(digest=entry.fingerprint, body=fingerprint_json, created_at=now)
                .on_conflict_do_nothing()
            )
            conn.execute(
                upsert(self.engine, StoredObject)
                .values(
                    namespace=self.namespace, digest=entry.digest, size=entry.size, created_at=now
                )
                # Touch, not skip: the row lock and fresh timestamp make a concurrent
                # gc either see this entry or finish deleting first (EvictionIndex._sweep).
                .on_conflict_do_update(
                    index_elements=["namespace", "digest"], set_={"created_at": now}
                )
            )
            result = conn.execute(
                upsert(self.engine, Entry)
                .values(namespace=self.namespace, created_at=now, last_access=now, hits=0, **values)
                .on_conflict_do_nothing(index_elements=["namespace", "key"])
                .returning(Entry.id)  # rowcount is -1 for this statement on psycopg
            )
            return result.first() is not None

    def repoint(
        self, key: str, *, old_digest: str, new: Encoded, entry: NewEntry | None = None
    ) -> bool:
        """Point `key` at the object `new` (a re-signed copy of its object) in one
        transaction, only while it still points at `old_digest`; False if it no longer
        does. `entry`: replace every column with its values too (another object for the key)."""
        now = utcnow()
        new_digest, size = new.digest, len(new.data)
        signer, signature = new.signer, new.signature
        values: dict[str, Any] = {}
        if entry is not None:
            values = {name: getattr(entry, name) for name in entry.__dataclass_fields__}
            values.update(created_at=now, last_access=now, hits=0)
        values.update(digest=new_digest, size=size, signer=signer, signature=signature)
        with self.engine.begin() as conn:
            conn.execute(
                upsert(self.engine, StoredObject)
                .values(namespace=self.namespace, digest=new_digest, size=size, created_at=now)
                .on_conflict_do_update(
                    index_elements=["namespace", "digest"], set_={"created_at": now}
                )
            )
            result = conn.execute(
                update(Entry)
                .where(
                    Entry.namespace == self.namespace,
                    Entry.key == key,
                    Entry.digest == old_digest,
                )
                .values(**values)
                .execution_options(synchronize_session=False)
            )
            return bool(result.rowcount)

    def record_access(self, touches: dict[str, tuple[int, datetime]]) -> None:
        """Apply batched hits: key -> (count, latest access time), in key order (as
        fold_accesses does) so concurrent flushes lock rows alike and never deadlock.
        Hits of entries deleted meanwhile count as evicted entries' (index/kept_hits.py)."""
        if not touches:
            return
        stmt = (
            update(Entry)
            .where(Entry.namespace == self.namespace, Entry.key == bindparam("k"))
            .values(
                hits=saturating_hits(bindparam("n", type_=Entry.hits.type)),
                last_access=bindparam("t", type_=Entry.last_access.type),
            )
        )
        params = [{"k": k, "n": max(n, 0), "t": t} for k, (n, t) in sorted(touches.items())]
        with self.engine.begin() as conn:
            conn.execute(stmt.execution_options(synchronize_session=False), params)
            late = {k: n for k, (n, _) in touches.items()}
            keep_late_hits(conn, self.engine, self.namespace, late)

    def record_reader_access(self, touches: dict[str, tuple[int, datetime]]) -> None:
        """Append a read-only reader's batched hits; `artstore gc` folds them into entries."""
        append_accesses(self.engine, self.namespace, touches)

    def add_counters(self, counts: dict[str, int], usage: Usage | None = None) -> None:
        """Add to the namespace's counters and, in the same transaction, its usage rows
        (per day and fingerprint: index/usage.py). Rows are locked in sorted order,
        as write_usage does, so concurrent callers never deadlock."""
        counts = {k: v for k, v in sorted(counts.items()) if v}
        if not counts and not usage:
            return
        with self.engine.begin() as conn:
            if usage:
                write_usage(conn, self.engine, self.namespace, usage)
            for name, value in counts.items():
                ins = upsert(self.engine, CounterRow).values(
                    namespace=self.namespace, name=name, value=value
                )
                conn.execute(
                    ins.on_conflict_do_update(
                        index_elements=["namespace", "name"],
                        set_={"value": CounterRow.value + ins.excluded.value},
                    )
                )

    def delete_entries(self, keys: Sequence[str]) -> int:
        if not keys:
            return 0
        with self.engine.begin() as conn:
            keep_hits(conn, self.engine, self.namespace, Entry.key.in_(keys))
            result = conn.execute(
                delete(Entry).where(Entry.namespace == self.namespace, Entry.key.in_(keys))
            )
            return int(result.rowcount)

    def delete_entry(self, key: str, *, digest: str) -> None:
        """Delete `key` only while it points at `digest` (a fresh put may have replaced it)."""
        with self.engine.begin() as conn:
            keep_hits(conn, self.engine, self.namespace, Entry.key == key, Entry.digest == digest)
            conn.execute(
                delete(Entry).where(
                    Entry.namespace == self.namespace, Entry.key == key, Entry.digest == digest
                )
            )

    def delete_all_entries(self) -> int:
        with self.engine.begin() as conn:
            keep_hits(conn, self.engine, self.namespace)
            result = conn.execute(delete(Entry).where(Entry.namespace == self.namespace))
            return int(result.rowcount)

    def forget_objects(self, digests: Iterable[str]) -> None:
        digests = list(digests)
        if not digests:
            return
        with self.engine.begin() as conn:
            conn.execute(
                delete(StoredObject).where(
                    StoredObject.namespace == self.namespace, StoredObject.digest.in_(digests)
                )
            )

    # -- reads --------------------------------------------------------------
    def iter_entries(
        self, filters: Filters | None = None, batch: int = 1000
    ) -> Iterator[EntryInfo]:
        """Entries, most recently used first, streamed in batches."""
        clauses = [Entry.namespace == self.namespace, *(filters or Filters()).clauses()]
        stmt = select(Entry).where(and_(*clauses)).order_by(Entry.last_access.desc(), Entry.id)
        accepts = (filters or Filters()).accepts
        with Session(self.engine) as session:
            for row in session.scalars(stmt.execution_options(yield_per=batch)):
                entry = EntryInfo.from_row(row)
                if accepts(entry):
                    yield entry

    def keys_for_digest(self, digest: str) -> list[str]:
        with Session(self.engine) as session:
            return list(
                session.scalars(
                    select(Entry.key).where(
                        Entry.namespace == self.namespace, Entry.digest == digest
                    )
                )
            )

    def keys_with_prefix(self, prefix: str) -> list[str]:
        with Session(self.engine) as session:
            return list(
                session.scalars(
                    select(Entry.key).where(
                        Entry.namespace == self.namespace, Entry.key.startswith(prefix)
                    )
                )
            )

    def referenced_digests(self) -> Iterator[tuple[str, int]]:
        stmt = (
            select(Entry.digest, func.max(Entry.size))
            .where(Entry.namespace == self.namespace)
            .group_by(Entry.digest)
        )
        with self.engine.connect() as conn:
            for digest, size in conn.execute(stmt.execution_options(yield_per=5000)):
                yield str(digest), int(size)

    def stats(self) -> IndexStats:
        with Session(self.engine) as session:
            entries, size, hits, saved, fetched = session.execute(
                select(
                    func.count(Entry.id),
                    func.coalesce(func.sum(Entry.size), 0),
                    # As a float: SQLite's integer sum() fails on overflow, and hits
                    # saturate at BIGINT's top (index/accesses.py), so two such add up past it.
                    func.coalesce(func.sum(cast(Entry.hits, Float)), 0),
                    func.coalesce(func.sum(Entry.hits * Entry.compile_secs), 0.0),
                    func.coalesce(func.sum(cast(Entry.hits, Float) * Entry.size), 0),
                ).where(Entry.namespace == self.namespace)
            ).one()
            counters = dict(
                session.execute(
                    select(CounterRow.name, CounterRow.value).where(
                        CounterRow.namespace == self.namespace
                    )
                ).all()
            )
            objects, object_bytes = session.execute(
                select(func.count(), func.coalesce(func.sum(StoredObject.size), 0)).where(
                    StoredObject.namespace == self.namespace
                )
            ).one()
        # Hits of entries gc evicted or `rm` removed count too (index/kept_hits.py).
        gone_hits, gone_fetched, gone_saved = evicted(counters)
        return IndexStats(
            entries=int(entries),
            bytes=int(size),
            hits=int(hits) + gone_hits,
            misses=int(counters.get("misses", 0)),
            corrupt=int(counters.get("corrupt", 0)),
            compile_secs_saved=float(saved) + gone_saved,
            objects=int(objects),
            object_bytes=int(object_bytes),
            misses_below_threshold=int(counters.get("misses_below_threshold", 0)),
            below_threshold=int(counters.get("below_threshold", 0)),
            bytes_fetched=int(fetched) + gone_fetched,
            lease_waits=int(counters.get("lease_waits", 0)),
            lease_takeovers=int(counters.get("lease_takeovers", 0)),
            warm_compiles=int(counters.get("warm_compiles", 0)),
        )
