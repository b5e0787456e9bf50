"""Hits of deleted entries, kept: `stats` counts hits and misses over the same span.

Why: `stats` sums hits over the entries the index holds, while misses are counted for
all time in `counters`. Once gc evicted (or `rm` removed) the entries that were hit,
their hits left with them, and the hit rate fell to what the survivors had seen (0.6%
where the per-day usage rows said 52%, issue 38). So every deletion of entries adds,
in its own transaction, the deleted rows' hits, bytes fetched and compile time saved
to the namespace's `counters` (`evicted_*`), which `EntryIndex.stats` adds back. No schema
change: `counters` is a name -> value table that every version adds to.

Hits can also arrive after their entry was deleted: a reader's hit journal folded, or
a writer's access flush, after gc or `rm` removed the entry it loaded. Those hits
happened (the per-day usage rows count them), so they join `evicted_hits` in the
transaction that applies them (`keep_late_hits`). Their bytes and compile time saved
are not known there (the entry that held size and compile time is gone): the usage
rows have them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection, Engine, Float, cast, func, select

from artifactstore.index.models import BIGINT_MAX, CounterRow, Entry
from artifactstore.index.sql import one_of, upsert


def _evicted(rows: Any) -> dict[str, Any]:
    """Counter name -> what it sums over the deleted entries (`rows`' columns)."""
    hits = cast(rows.hits, Float)
    return {
        "evicted_hits": hits,
        "evicted_bytes_fetched": hits * rows.size,
        "evicted_compile_ms_saved": hits * rows.compile_secs * 1000,
    }


def keep_hits(conn: Connection, engine: Engine, namespace: str, *where: Any) -> None:
    """Before `DELETE FROM entries WHERE where` in `conn`'s transaction: add those rows'
    hits, bytes fetched and compile milliseconds saved to the `evicted_*` counters.

    The rows are locked first (FOR UPDATE; SQLite's write lock covers the database),
    then the counters, as a flush adding late hits locks them: never a deadlock."""
    rows = (
        select(Entry.hits, Entry.size, Entry.compile_secs)
        .where(Entry.namespace == namespace, *where)
        .with_for_update()
        .subquery()
    )
    evicted = _evicted(rows.c)
    sums = [func.coalesce(func.sum(column), 0) for column in evicted.values()]
    row = conn.execute(select(*sums)).one()
    _add(conn, engine, namespace, dict(zip(evicted, row, strict=True)))


def keep_late_hits(
    conn: Connection, engine: Engine, namespace: str, hits: Mapping[str, int]
) -> None:
    """After `hits` (key -> count) were added to the namespace's entries in `conn`'s
    transaction: add the hits of keys no entry holds (deleted before their hits
    arrived) to `evicted_hits`. After the update, so the rows it changed are locked
    by this transaction and cannot be deleted before it commits."""
    if not hits:
        return
    held = set(
        conn.scalars(
            select(Entry.key).where(
                Entry.namespace == namespace, one_of(engine, Entry.key, list(hits))
            )
        )
    )
    late = sum(max(int(n), 0) for key, n in hits.items() if key not in held)
    _add(conn, engine, namespace, {"evicted_hits": late})


def _add(conn: Connection, engine: Engine, namespace: str, values: dict[str, Any]) -> None:
    """Add `values` (counter name -> number, saturating at BIGINT) to the namespace's
    counters, in sorted order (as every writer of `counters` locks its rows)."""
    for name, total in sorted(values.items()):
        value = min(int(total or 0), BIGINT_MAX)
        if value <= 0:
            continue
        ins = upsert(engine, CounterRow).values(namespace=namespace, name=name, value=value)
        conn.execute(
            ins.on_conflict_do_update(
                index_elements=["namespace", "name"],
                set_={"value": CounterRow.value + ins.excluded.value},
            )
        )


def evicted(counters: dict[str, int]) -> tuple[int, int, float]:
    """(hits, bytes fetched, compile seconds saved) of deleted entries, from `counters`."""
    return (
        int(counters.get("evicted_hits", 0)),
        int(counters.get("evicted_bytes_fetched", 0)),
        int(counters.get("evicted_compile_ms_saved", 0)) / 1000,
    )
