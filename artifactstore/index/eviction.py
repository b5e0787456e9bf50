"""Index queries for `artstore gc`: the LRU cutoff, set-wise and race-safe deletion of
entries and objects, and the per-prefix reads that reconciliation compares with the
blob store's listing.

Every query is bounded (id or digest ranges, keyset pages, one row back from
the cutoff query), so gc's memory does not grow with the size of the index,
and sorting happens in the database.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Engine,
    and_,
    case,
    delete,
    false,
    func,
    not_,
    or_,
    select,
    tuple_,
)

from artifactstore.index.kept_hits import keep_hits
from artifactstore.index.models import Entry, StoredObject
from artifactstore.index.sql import one_of, upsert, write_transaction

DeleteBlobs = Callable[[list[str]], object]


@dataclass(frozen=True)
class VictimRow:
    """An entry gc removes (or, dry, would): enough to report it and page on."""

    id: int
    key: str
    size: int
    module_name: str
    last_access: datetime


_VICTIM_COLUMNS = (Entry.id, Entry.key, Entry.size, Entry.module_name, Entry.last_access)


@dataclass(frozen=True)
class Victims:
    """The entries one gc run removes, as a predicate rather than a list: those built
    by an old jaxlib, and the least recently used ones up to and including the
    (last_access, id) cursor `through`. A hit moves an entry past the cursor, so
    an entry used while gc runs is kept; a dry run evaluates the same predicate.
    """

    jaxlib_versions: tuple[str, ...] = ()
    through: tuple[datetime, int] | None = None

    def clause(self) -> ColumnElement[bool]:
        parts: list[ColumnElement[bool]] = []
        if self.jaxlib_versions:
            parts.append(Entry.jaxlib_version.in_(self.jaxlib_versions))
        if self.through is not None:
            parts.append(tuple_(Entry.last_access, Entry.id) <= tuple_(*self.through))
        return or_(*parts) if parts else false()


NO_VICTIMS = Victims()


@dataclass(frozen=True)
class WaitingObjects:
    """Unreferenced objects still within the grace period: how many, their bytes, and
    the oldest and newest of their times (None when there are none)."""

    count: int
    size: int
    oldest: datetime | None
    newest: datetime | None


class EvictionIndex:
    def __init__(self, engine: Engine, namespace: str) -> None:
        self.engine = engine
        self.namespace = namespace

    # -- entries ------------------------------------------------------------
    def _entries(self, excluding: Victims = NO_VICTIMS) -> ColumnElement[bool]:
        """The namespace's entries, less `excluding` (what a dry run has already counted
        as gone; in a real run those rows are deleted and the clause is moot)."""
        return and_(Entry.namespace == self.namespace, not_(excluding.clause()))

    def referenced_bytes(self, excluding: Victims = NO_VICTIMS) -> int:
        """Bytes of the distinct objects the namespace's entries reference."""
        per_digest = (
            select(func.max(Entry.size).label("size"))
            .where(self._entries(excluding))
            .group_by(Entry.digest)
            .subquery()
        )
        with self.engine.connect() as conn:
            return int(conn.scalar(select(func.coalesce(func.sum(per_digest.c.size), 0))) or 0)

    def lru_cutoff(
        self, free_bytes: int, older_than: datetime | None, excluding: Victims = NO_VICTIMS
    ) -> tuple[datetime, int] | None:
        """The shortest least-recently-used prefix of entries, as its last (last_access, id),
        whose removal frees at least `free_bytes` of objects and takes every entry
        last used before `older_than`; None when nothing needs to go.

        An object is freed with the newest entry that references it, so one
        query ranks each digest's entries and sums object sizes in LRU order:
        the database sorts, gc holds one row.
        """
        key = (Entry.last_access, Entry.id)
        cutoffs: list[tuple[datetime, int]] = []
        with self.engine.connect() as conn:
            if free_bytes > 0:
                newest = func.row_number().over(
                    partition_by=Entry.digest, order_by=(Entry.last_access.desc(), Entry.id.desc())
                )
                frees = (
                    select(*key, case((newest == 1, Entry.size), else_=0).label("frees"))
                    .where(self._entries(excluding))
                    .subquery()
                )
                running = select(
                    frees.c.last_access,
                    frees.c.id,
                    func.sum(frees.c.frees)
                    .over(order_by=(frees.c.last_access, frees.c.id), rows=(None, 0))
                    .label("freed"),
                ).subquery()
                row = conn.execute(
                    select(running.c.last_access, running.c.id)
                    .where(running.c.freed >= free_bytes)
                    .order_by(running.c.last_access, running.c.id)
                    .limit(1)
                ).first()
                if row is None:  # entries went meanwhile: all that is left must go
                    row = conn.execute(
                        select(*key)
                        .where(self._entries(excluding))
                        .order_by(Entry.last_access.desc(), Entry.id.desc())
                        .limit(1)
                    ).first()
                if row is not None:
                    cutoffs.append((row[0], int(row[1])))
            if older_than is not None:
                row = conn.execute(
                    select(*key)
                    .where(self._entries(excluding), Entry.last_access < older_than)
                    .order_by(Entry.last_access.desc(), Entry.id.desc())
                    .limit(1)
                ).first()
                if row is not None:
                    cutoffs.append((row[0], int(row[1])))
        return max(cutoffs) if cutoffs else None

    def count_victims(self, victims: Victims, excluding: Victims = NO_VICTIMS) -> int:
        with self.engine.connect() as conn:
            stmt = select(func.count()).where(self._entries(excluding), victims.clause())
            return int(conn.scalar(stmt) or 0)

    def victims_page(
        self,
        victims: Victims,
        excluding: Victims,
        after: tuple[datetime, int] | None,
        limit: int,
    ) -> list[VictimRow]:
        """What a dry run reports: the next `limit` victims in LRU order after `after`."""
        stmt = select(*_VICTIM_COLUMNS).where(self._entries(excluding), victims.clause())
        if after is not None:
            stmt = stmt.where(tuple_(Entry.last_access, Entry.id) > tuple_(*after))
        stmt = stmt.order_by(Entry.last_access, Entry.id).limit(limit)
        with self.engine.connect() as conn:
            return [VictimRow(*row) for row in conn.execute(stmt)]

    def id_bounds(self) -> tuple[int, int] | None:
        """The namespace's lowest and highest entry id (None: no entries)."""
        with self.engine.connect() as conn:
            low, high = conn.execute(
                select(func.min(Entry.id), func.max(Entry.id)).where(
                    Entry.namespace == self.namespace
                )
            ).one()
        return None if low is None else (int(low), int(high))

    def delete_victims(
        self, victims: Victims, low: int, high: int, on_deleted: Callable[[VictimRow], None]
    ) -> int:
        """Delete the victims with low <= id < high in one transaction; how many went.

        Victims go by id ranges, not in LRU order: a range is a contiguous run
        of table pages, so each page is rewritten once over the whole run
        rather than once per batch (on SQLite that is most of the cost).
        `on_deleted` sees each deleted row as it streams back.
        """
        stmt = (
            delete(Entry)
            .where(
                Entry.namespace == self.namespace,
                Entry.id >= low,
                Entry.id < high,
                victims.clause(),
            )
            .returning(*_VICTIM_COLUMNS)
        )
        deleted = 0
        with write_transaction(self.engine) as conn:
            where = (Entry.id >= low, Entry.id < high, victims.clause())
            keep_hits(conn, self.engine, self.namespace, *where)  # stats keeps their hits
            for row in conn.execute(stmt):
                on_deleted(VictimRow(*row))
                deleted += 1
        return deleted

    def jaxlib_versions(self) -> list[str]:
        with self.engine.connect() as conn:
            return [
                str(v)
                for v in conn.scalars(
                    select(Entry.jaxlib_version).where(Entry.namespace == self.namespace).distinct()
                )
            ]

    def referenced_between(self, low: str, high: str | None) -> set[str]:
        """Digests referenced by entries with low <= digest < high (one listing chunk)."""
        stmt = select(Entry.digest).where(Entry.namespace == self.namespace, Entry.digest >= low)
        if high is not None:
            stmt = stmt.where(Entry.digest < high)
        with self.engine.connect() as conn:
            return {str(d) for d in conn.scalars(stmt.distinct())}

    def keys_between(self, low: str, high: str | None) -> set[str]:
        """Keys of the entries with low <= key < high (one manifest listing chunk)."""
        stmt = select(Entry.key).where(Entry.namespace == self.namespace, Entry.key >= low)
        if high is not None:
            stmt = stmt.where(Entry.key < high)
        with self.engine.connect() as conn:
            return {str(k) for k in conn.scalars(stmt)}

    def keys_for_digests(
        self, digests: list[str], excluding: Victims = NO_VICTIMS
    ) -> list[tuple[str, int]]:
        stmt = select(Entry.key, Entry.size).where(
            self._entries(excluding), one_of(self.engine, Entry.digest, digests)
        )
        with self.engine.connect() as conn:
            return [(str(k), int(s)) for k, s in conn.execute(stmt.order_by(Entry.key))]

    def stored_keys(self, keys: list[str]) -> set[str]:
        """Which of `keys` have an entry (gc: quick-key records of keys stored since)."""
        if not keys:
            return set()
        stmt = select(Entry.key).where(
            Entry.namespace == self.namespace, one_of(self.engine, Entry.key, keys)
        )
        with self.engine.connect() as conn:
            return {str(k) for k in conn.scalars(stmt)}

    def drop_dangling(self, digests: list[str]) -> list[tuple[str, int]]:
        """Delete the entries (and object rows) of objects that are gone; (key, size) deleted."""
        if not digests:
            return []
        with write_transaction(self.engine) as conn:
            keep_hits(conn, self.engine, self.namespace, one_of(self.engine, Entry.digest, digests))
            gone = conn.execute(
                delete(Entry)
                .where(
                    Entry.namespace == self.namespace, one_of(self.engine, Entry.digest, digests)
                )
                .returning(Entry.key, Entry.size)
            ).all()
            conn.execute(
                delete(StoredObject).where(
                    StoredObject.namespace == self.namespace,
                    one_of(self.engine, StoredObject.digest, digests),
                )
            )
        return sorted((str(k), int(s)) for k, s in gone)

    # -- objects ------------------------------------------------------------
    def count_objects(self) -> int:
        with self.engine.connect() as conn:
            stmt = select(func.count()).where(StoredObject.namespace == self.namespace)
            return int(conn.scalar(stmt) or 0)

    def object_range_end(self, after: str, rows: int) -> str | None:
        """The digest `rows` object rows past `after` (None: fewer are left), so that one
        sweep covers a bounded range whatever the digests look like."""
        o = StoredObject
        stmt = (
            select(o.digest)
            .where(o.namespace == self.namespace, o.digest > after)
            .order_by(o.digest)
            .offset(max(rows - 1, 0))
            .limit(1)
        )
        with self.engine.connect() as conn:
            found = conn.scalar(stmt)
        return None if found is None else str(found)

    def sweep_objects(
        self,
        after: str,
        through: str | None,
        created_before: datetime,
        delete_blobs: DeleteBlobs | None,
        excluding: Victims = NO_VICTIMS,
    ) -> list[tuple[str, int]]:
        """Delete the objects with after < digest <= through (None: no end) that are
        older than the cutoff and that no entry references; (digest, size) of each.
        With `delete_blobs` None (a dry run) nothing is deleted and entries in
        `excluding` count as gone."""

        def in_range(column: Any) -> list[ColumnElement[bool]]:
            return [column > after] if through is None else [column > after, column <= through]

        return self._sweep(
            in_range(StoredObject.digest),
            in_range(Entry.digest),
            created_before,
            delete_blobs,
            excluding,
        )

    def delete_objects(
        self, digests: list[str], created_before: datetime, delete_blobs: DeleteBlobs
    ) -> list[tuple[str, int]]:
        """`sweep_objects` for a list of digests (reconciliation's adopted orphans)."""
        if not digests:
            return []
        return self._sweep(
            [one_of(self.engine, StoredObject.digest, digests)],
            [one_of(self.engine, Entry.digest, digests)],
            created_before,
            delete_blobs,
        )

    def _sweep(
        self,
        where: list[ColumnElement[bool]],
        entries_where: list[ColumnElement[bool]],
        created_before: datetime,
        delete_blobs: DeleteBlobs | None,
        excluding: Victims = NO_VICTIMS,
    ) -> list[tuple[str, int]]:
        """Delete objects that are still unreferenced and old.

        Safe against a writer committing an entry for one of these digests at
        the same time without locking anything first: the writer touches the
        object row (created_at = now, EntryIndex.add_entry) in the entry's own
        transaction, and the DELETE re-tests `created_at < cutoff` on the row
        as it stands when it gets there (PostgreSQL re-evaluates the condition
        on a row another transaction changed, SQLite's write lock orders the
        two). So an entry committed before the DELETE either shows in the
        reference check or has moved its row out of reach, and a writer
        committing after it finds the blob gone and uploads it again
        (Store.put). References are read by the same range or list (`entries_where`)
        and compared here, never by an anti-join whose plan depends on
        statistics that a large gc has just made stale. Blobs go before the
        transaction commits: if that fails, the rows stay and the next gc
        deletes them.
        """
        o = StoredObject
        old = and_(o.namespace == self.namespace, o.created_at < created_before)
        with write_transaction(self.engine) if delete_blobs else self.engine.connect() as conn:
            rows = conn.execute(select(o.digest, o.size).where(old, *where)).all()
            referenced = set(
                conn.scalars(
                    select(Entry.digest).where(self._entries(excluding), *entries_where).distinct()
                )
            )
            unreferenced = [(str(d), int(n)) for d, n in rows if d not in referenced]
            if delete_blobs is None or not unreferenced:
                return unreferenced
            gone = [
                (str(d), int(n))
                for d, n in conn.execute(
                    delete(o)
                    .where(old, one_of(self.engine, o.digest, [d for d, _ in unreferenced]))
                    .returning(o.digest, o.size)
                )
            ]
            delete_blobs([d for d, _ in gone])
        return gone

    def waiting_objects(
        self, created_since: datetime, excluding: Victims = NO_VICTIMS
    ) -> WaitingObjects:
        """The unreferenced objects that the grace period keeps (created or touched at or
        after `created_since`): what gc tells the operator it will delete later. A read
        for the report only, so a plain anti-join (no race to guard against)."""
        o = StoredObject
        referenced = select(Entry.id).where(self._entries(excluding), Entry.digest == o.digest)
        totals = (func.count(), func.coalesce(func.sum(o.size), 0))
        stmt = select(*totals, func.min(o.created_at), func.max(o.created_at)).where(
            o.namespace == self.namespace, o.created_at >= created_since, ~referenced.exists()
        )
        with self.engine.connect() as conn:
            count, size, first, last = conn.execute(stmt).one()
        return WaitingObjects(int(count), int(size), first, last)

    def object_rows(self, digests: list[str]) -> dict[str, datetime]:
        """created_at of the object rows that exist among `digests`."""
        if not digests:
            return {}
        stmt = select(StoredObject.digest, StoredObject.created_at).where(
            StoredObject.namespace == self.namespace,
            one_of(self.engine, StoredObject.digest, digests),
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
            for d, s, t in sorted(blobs)  # digest order: concurrent adopters lock alike
        ]
        with write_transaction(self.engine) as conn:
            conn.execute(upsert(self.engine, StoredObject).on_conflict_do_nothing(), rows)
