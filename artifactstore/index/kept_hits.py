"""Hits of deleted entries, kept: `stats` counts hits and misses over the same span.

Why: `stats` sums hits over the entries the index holds, while misses are counted for
all time in `counters`. Once gc evicted (or `rm` removed) the entries that were hit,
their hits left with them, and the hit rate fell to what the survivors had seen (0.6%
where the per-day usage rows said 52%, issue 38). So every deletion of entries adds,
in its own transaction, the deleted rows' hits, bytes fetched and compile time saved
to the namespace's `counters` (EVICTED), which `EntryIndex.stats` adds back. No schema
change: `counters` is a name -> value table that every version adds to.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Engine, Float, cast, func, select

from artifactstore.index.accesses import BIGINT_MAX
from artifactstore.index.models import CounterRow, Entry
from artifactstore.index.sql import upsert

# Counter name -> what it sums over the deleted entries.
EVICTED: dict[str, Any] = {
    "evicted_hits": cast(Entry.hits, Float),
    "evicted_bytes_fetched": cast(Entry.hits, Float) * Entry.size,
    "evicted_compile_ms_saved": cast(Entry.hits, Float) * Entry.compile_secs * 1000,
}


def keep_hits(conn: Connection, engine: Engine, namespace: str, *where: Any) -> None:
    """Before `DELETE FROM entries WHERE where` in `conn`'s transaction: add those rows'
    hits, bytes fetched and compile milliseconds saved to the EVICTED counters."""
    sums = [func.coalesce(func.sum(column), 0) for column in EVICTED.values()]
    row = conn.execute(select(*sums).where(Entry.namespace == namespace, *where)).one()
    for name, total in zip(EVICTED, row, strict=True):
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
