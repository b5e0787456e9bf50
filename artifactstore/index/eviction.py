"""Index queries for `artstore gc`: fold reader accesses, walk entries oldest first,
count references, delete objects safely, and per-namespace quotas.

Every query is bounded (batches with keyset pagination on an index), so gc's
memory does not grow with the size of the index.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    Engine,
    String,
    any_,
    bindparam,
    case,
    delete,
    func,
    literal,
    select,
    tuple_,
    union,
    update,
)

from artifactstore.index.models import Access, Entry, Quota, StoredObject, utcnow
from artifactstore.index.repo import _insert


@contextmanager
def write_transaction(engine: Engine) -> Iterator[Connection]:
    """A transaction holding the write lock from its first statement.

    On SQLite a transaction that reads first and writes later can fail with
    SQLITE_BUSY when another process commits in between; BEGIN IMMEDIATE waits
    for the lock instead. PostgreSQL locks rows as statements touch them.
    """
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        else:
            conn.begin()
        try:
            yield conn
        except BaseException:
            conn.rollback()
            raise
        conn.commit()


# Bound parameters per statement: SQLite allows 32766, PostgreSQL 65535.
MAX_PARAMS = 30000


@dataclass(frozen=True)
class Deleted:
    key: str
    size: int
    module_name: str
    last_access: datetime


@dataclass(frozen=True)
class Candidate:
    """An entry as gc sees it: enough to decide and report, nothing more."""

    id: int
    key: str
    digest: str
    size: int
    last_access: datetime
    module_name: str
    jaxlib_version: str


_CANDIDATE_COLUMNS = (
    Entry.id,
    Entry.key,
    Entry.digest,
    Entry.size,
    Entry.last_access,
    Entry.module_name,
    Entry.jaxlib_version,
)


class EvictionIndex:
    def __init__(self, engine: Engine, namespace: str) -> None:
        self.engine = engine
        self.namespace = namespace

    def _one_of(self, column: Any, values: Sequence[Any]) -> Any:
        """`column IN (values)`; on PostgreSQL `= ANY(array)`: one parameter instead of
        thousands, which PostgreSQL plans far faster."""
        if self.engine.dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import ARRAY

            item = BigInteger() if column is Entry.id else String()
            return column == any_(literal(list(values), type_=ARRAY(item)))
        return column.in_(values)

    def _referenced(self, conn: Connection, digests: list[str]) -> set[str]:
        """Which of `digests` some entry of the namespace still points at."""
        return set(
            conn.scalars(
                select(Entry.digest)
                .where(Entry.namespace == self.namespace, self._one_of(Entry.digest, digests))
                .distinct()
            )
        )

    # -- accesses -----------------------------------------------------------
    def fold_accesses(self, batch: int = 1000) -> int:
        """Apply read-only readers' hits to entries exactly once; rows folded."""
        ns = self.namespace
        t = bindparam("t", type_=Entry.last_access.type)
        apply = (
            update(Entry)
            .where(Entry.namespace == ns, Entry.key == bindparam("k"))
            .values(
                hits=Entry.hits + bindparam("n"),
                last_access=case((Entry.last_access < t, t), else_=Entry.last_access),
            )
            .execution_options(synchronize_session=False)
        )
        with write_transaction(self.engine) as conn:
            top = conn.scalar(select(func.max(Access.id)).where(Access.namespace == ns))
            if top is None:
                return 0
            after = ""
            while True:
                rows = conn.execute(
                    select(Access.key, func.sum(Access.hits), func.max(Access.last_access))
                    .where(Access.namespace == ns, Access.id <= top, Access.key > after)
                    .group_by(Access.key)
                    .order_by(Access.key)
                    .limit(batch)
                ).all()
                if not rows:
                    break
                conn.execute(apply, [{"k": k, "n": int(n), "t": when} for k, n, when in rows])
                after = rows[-1][0]
            result = conn.execute(delete(Access).where(Access.namespace == ns, Access.id <= top))
            return int(result.rowcount)

    # -- entries ------------------------------------------------------------
    def referenced_bytes(self) -> int:
        """Bytes of the distinct objects the namespace's entries reference."""
        per_digest = (
            select(func.max(Entry.size).label("size"))
            .where(Entry.namespace == self.namespace)
            .group_by(Entry.digest)
            .subquery()
        )
        with self.engine.connect() as conn:
            return int(conn.scalar(select(func.coalesce(func.sum(per_digest.c.size), 0))) or 0)

    def oldest_entries(self, after: tuple[datetime, int] | None, limit: int) -> list[Candidate]:
        """The next `limit` entries by (last_access, id), after the keyset cursor `after`."""
        stmt = select(*_CANDIDATE_COLUMNS).where(Entry.namespace == self.namespace)
        if after is not None:
            stmt = stmt.where(tuple_(Entry.last_access, Entry.id) > tuple_(*after))
        stmt = stmt.order_by(Entry.last_access, Entry.id).limit(limit)
        with self.engine.connect() as conn:
            return [Candidate(*row) for row in conn.execute(stmt)]

    def jaxlib_versions(self) -> list[str]:
        with self.engine.connect() as conn:
            return [
                str(v)
                for v in conn.scalars(
                    select(Entry.jaxlib_version).where(Entry.namespace == self.namespace).distinct()
                )
            ]

    def entries_with_jaxlib(self, versions: list[str], after: int, limit: int) -> list[Candidate]:
        stmt = (
            select(*_CANDIDATE_COLUMNS)
            .where(
                Entry.namespace == self.namespace,
                Entry.jaxlib_version.in_(versions),
                Entry.id > after,
            )
            .order_by(Entry.id)
            .limit(limit)
        )
        with self.engine.connect() as conn:
            return [Candidate(*row) for row in conn.execute(stmt)]

    def reference_counts(self, digests: set[str]) -> dict[str, int]:
        if not digests:
            return {}
        stmt = (
            select(Entry.digest, func.count())
            .where(Entry.namespace == self.namespace, self._one_of(Entry.digest, sorted(digests)))
            .group_by(Entry.digest)
        )
        with self.engine.connect() as conn:
            return {str(d): int(n) for d, n in conn.execute(stmt)}

    def count_entries(self) -> int:
        with self.engine.connect() as conn:
            return int(
                conn.scalar(select(func.count()).where(Entry.namespace == self.namespace)) or 0
            )

    def delete_entries(
        self, ids: Sequence[int], *, not_used_since: datetime, on_deleted: Callable[[Deleted], None]
    ) -> int:
        """Delete these entries in one transaction, except any used after `not_used_since`.

        Calls `on_deleted` for each row deleted (streamed, not collected) and
        returns how many there were.
        """
        deleted = 0
        with write_transaction(self.engine) as conn:
            for start in range(0, len(ids), MAX_PARAMS):
                stmt = (
                    delete(Entry)
                    .where(
                        Entry.namespace == self.namespace,
                        self._one_of(Entry.id, list(ids[start : start + MAX_PARAMS])),
                        Entry.last_access <= not_used_since,
                    )
                    .returning(Entry.key, Entry.size, Entry.module_name, Entry.last_access)
                )
                for row in conn.execute(stmt):
                    on_deleted(Deleted(str(row[0]), int(row[1]), str(row[2]), row[3]))
                    deleted += 1
        return deleted

    def referenced_between(self, low: str, high: str | None) -> set[str]:
        """Digests referenced by entries with low <= digest < high (one listing chunk)."""
        stmt = select(Entry.digest).where(Entry.namespace == self.namespace, Entry.digest >= low)
        if high is not None:
            stmt = stmt.where(Entry.digest < high)
        with self.engine.connect() as conn:
            return {str(d) for d in conn.scalars(stmt.distinct())}

    def keys_for_digests(self, digests: list[str]) -> list[tuple[str, int]]:
        stmt = select(Entry.key, Entry.size).where(
            Entry.namespace == self.namespace, self._one_of(Entry.digest, digests)
        )
        with self.engine.connect() as conn:
            return [(str(k), int(s)) for k, s in conn.execute(stmt.order_by(Entry.key))]

    def drop_dangling(self, digests: list[str]) -> list[tuple[str, int]]:
        """Delete the entries (and object rows) of objects that are gone; (key, size) deleted."""
        if not digests:
            return []
        with write_transaction(self.engine) as conn:
            gone = conn.execute(
                delete(Entry)
                .where(Entry.namespace == self.namespace, self._one_of(Entry.digest, digests))
                .returning(Entry.key, Entry.size)
            ).all()
            conn.execute(
                delete(StoredObject).where(
                    StoredObject.namespace == self.namespace,
                    self._one_of(StoredObject.digest, digests),
                )
            )
        return sorted((str(k), int(s)) for k, s in gone)

    # -- objects ------------------------------------------------------------
    def unreferenced_objects(
        self, after: str, created_before: datetime, scan: int
    ) -> tuple[list[tuple[str, int]], str | None]:
        """Scan the next `scan` object rows older than the cutoff, by digest after `after`:
        those no entry references, and the cursor to continue from (None: done).

        Two index range queries per page rather than one anti-join: PostgreSQL
        plans `NOT EXISTS ... ORDER BY ... LIMIT` as a hash anti-join over both
        tables, on every page.
        """
        o = StoredObject
        page = (
            select(o.digest, o.size)
            .where(o.namespace == self.namespace, o.digest > after, o.created_at < created_before)
            .order_by(o.digest)
            .limit(scan)
        )
        with self.engine.connect() as conn:
            rows = [(str(d), int(s)) for d, s in conn.execute(page)]
            if not rows:
                return [], None
            referenced = self._referenced(conn, [d for d, _ in rows])
        return [(d, n) for d, n in rows if d not in referenced], rows[-1][0]

    def object_rows(self, digests: list[str]) -> dict[str, datetime]:
        """created_at of the object rows that exist among `digests`."""
        if not digests:
            return {}
        stmt = select(StoredObject.digest, StoredObject.created_at).where(
            StoredObject.namespace == self.namespace, self._one_of(StoredObject.digest, digests)
        )
        with self.engine.connect() as conn:
            return {str(d): t for d, t in conn.execute(stmt)}

    def adopt_objects(self, blobs: list[tuple[str, int, datetime]]) -> None:
        """Give unindexed blobs (a writer died between PUT and commit) an object row
        dated by the blob, so the one deletion path below can lock and remove them."""
        if not blobs:
            return
        rows = [
            {"namespace": self.namespace, "digest": d, "size": s, "created_at": t}
            for d, s, t in blobs
        ]
        with write_transaction(self.engine) as conn:
            conn.execute(_insert(self.engine, StoredObject).on_conflict_do_nothing(), rows)

    def delete_objects(
        self, digests: list[str], created_before: datetime, delete_blob: Callable[[str], object]
    ) -> list[tuple[str, int]]:
        """Delete objects that are still unreferenced and old; (digest, size) deleted.

        Within one transaction: lock the object rows (older than the cutoff),
        then, in a later statement (a fresh snapshot under READ COMMITTED),
        check that no entry references them, delete the blobs, delete the rows,
        commit. A writer committing an entry for one of these digests touches
        its object row in the same transaction (Index.add_entry), so it either
        committed before our lock, and we see its entry, or waits for our
        commit and then finds the blob gone and uploads it again (Store.put).
        On SQLite the write lock serialises the same steps.
        """
        if not digests:
            return []
        o = StoredObject
        with write_transaction(self.engine) as conn:
            locked = conn.execute(
                select(o.digest, o.size)
                .where(o.namespace == self.namespace, self._one_of(o.digest, digests))
                .where(o.created_at < created_before)
                .with_for_update()
            ).all()
            if not locked:
                return []
            referenced = self._referenced(conn, [d for d, _ in locked])
            gone = [(str(d), int(s)) for d, s in locked if d not in referenced]
            for digest, _ in gone:
                delete_blob(digest)
            if gone:
                conn.execute(
                    delete(o).where(
                        o.namespace == self.namespace, self._one_of(o.digest, [d for d, _ in gone])
                    )
                )
        return gone


# -- quotas (across namespaces) ---------------------------------------------
def set_quota(engine: Engine, namespace: str, max_bytes: int) -> None:
    ins = _insert(engine, Quota).values(
        namespace=namespace, max_bytes=max_bytes, updated_at=utcnow()
    )
    with engine.begin() as conn:
        conn.execute(
            ins.on_conflict_do_update(
                index_elements=["namespace"],
                set_={"max_bytes": max_bytes, "updated_at": utcnow()},
            )
        )


def get_quota(engine: Engine, namespace: str) -> int | None:
    with engine.connect() as conn:
        value = conn.scalar(select(Quota.max_bytes).where(Quota.namespace == namespace))
    return int(value) if value is not None else None


def list_quotas(engine: Engine) -> list[tuple[str, int]]:
    with engine.connect() as conn:
        rows = conn.execute(select(Quota.namespace, Quota.max_bytes).order_by(Quota.namespace))
        return [(str(ns), int(b)) for ns, b in rows]


def remove_quota(engine: Engine, namespace: str) -> bool:
    with engine.begin() as conn:
        return bool(conn.execute(delete(Quota).where(Quota.namespace == namespace)).rowcount)


def namespaces(engine: Engine) -> list[str]:
    """Every namespace with entries, objects or a quota."""
    stmt = union(
        select(Entry.namespace).distinct(),
        select(StoredObject.namespace).distinct(),
        select(Quota.namespace),
    )
    with engine.connect() as conn:
        return sorted({str(ns) for ns in conn.scalars(stmt)})
