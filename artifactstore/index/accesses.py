"""Read-only readers' hits: appended as rows, folded into entries by `artstore gc`.

Readers may not update `entries` (their database role has INSERT on `accesses`
only), so they append batches here, and gc applies them exactly once before it
chooses by last access: LRU then reflects the whole cluster.

Rows come from readers, who are trusted less than writers: a row may claim any
count and any time. Folding clamps both (see `fold_accesses`), so no row can pin
an entry with a far-future access time or overflow `entries.hits` (BIGINT) and
make every later gc fail. On PostgreSQL the reader role's insert trigger
(`infra/policies/postgres-roles.sql`) applies the same clamps on insert;
folding clamps again because SQLite has no roles and old rows predate them.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, bindparam, case, delete, func, insert, select, update

from artifactstore.index.engine import allow_access_append
from artifactstore.index.kept_hits import keep_late_hits
from artifactstore.index.models import BIGINT_MAX, Access, Entry, utcnow
from artifactstore.index.sql import write_transaction

# Most hits one access row may add: a reader's batch counts its compiles served, which
# are far fewer (JAX keeps executables in memory). Keep in step with the trigger in
# infra/policies/postgres-roles.sql (tests/test_roles.py checks that they agree).
ROW_HITS_MAX = 1_000_000
# No access row counts as earlier than this (an entry's own time is always later).
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def clamp_hits(n: int) -> int:
    """A row's hit count as folding counts it: 0..ROW_HITS_MAX."""
    return min(max(int(n), 0), ROW_HITS_MAX)


def saturating_hits(n: Any) -> Any:
    """`Entry.hits + n` that stops at BIGINT_MAX instead of failing with an overflow
    (`n` >= 0, a bound parameter): one huge count must not break every later update."""
    return case((Entry.hits > BIGINT_MAX - n, BIGINT_MAX), else_=Entry.hits + n)


def clean_touches(
    accesses: dict[str, tuple[int, float]], not_after: float | None = None
) -> dict[str, tuple[int, datetime]]:
    """Hits from a file or an object (a tier's journal, a hit journal) as index rows.

    Such rows come from anyone who could write there: a row the index could not
    take (a key longer than its column, a count past BIGINT, a time past year 9999)
    would fail every later flush, so such rows are dropped and counts and times are
    clamped, as the database clamps readers' rows; no time is later than now, nor than
    `not_after` (when the store wrote the journal: no hit it holds can be later)."""
    now = time.time() if not_after is None else min(time.time(), not_after)
    touches: dict[str, tuple[int, datetime]] = {}
    for key, (n, when) in accesses.items():
        if not (isinstance(key, str) and 0 < len(key) <= 64 and key.isascii()):
            continue
        if not key.isprintable() or not 0 < when < float("inf"):  # also drops NaN
            continue
        hits = min(max(int(n), 1), ROW_HITS_MAX)
        touches[key] = (hits, datetime.fromtimestamp(min(when, now), UTC))
    return touches


def append_accesses(
    engine: Engine, namespace: str, touches: dict[str, tuple[int, datetime]]
) -> None:
    """Append batched hits: key -> (count, latest access time).

    Clamped here as the database would, so an honest reader's row (a clock a little
    ahead, an absurd count) is never changed or refused there."""
    if not touches:
        return
    now = utcnow()
    rows = [
        {"namespace": namespace, "key": k, "hits": clamp_hits(n), "last_access": min(t, now)}
        for k, (n, t) in touches.items()
    ]
    with engine.begin() as conn:
        allow_access_append(conn)
        conn.execute(insert(Access), rows)


def fold_accesses(engine: Engine, namespace: str, batch: int = 1000) -> int:
    """Apply the namespace's access rows to its entries and delete them; rows folded.

    Each row counts 0..ROW_HITS_MAX hits, and its time counts no later than now: a
    row claiming year 9999 marks the entry used now, once, which any reader may
    claim honestly too; after this fold the entry ages like any other. The sum is
    added saturating at BIGINT_MAX. Clamped in SQL, before summing and before any
    value reaches Python (SQLite's sum() raises on overflow; PostgreSQL's
    'infinity' has no Python datetime). Hits of keys no entry holds (deleted before
    their hits arrived) are kept as evicted entries' hits (index/kept_hits.py)."""
    now = datetime.now(UTC)
    t = bindparam("t", type_=Entry.last_access.type)
    n = bindparam("n", type_=Entry.hits.type)
    apply = (
        update(Entry)
        .where(Entry.namespace == namespace, Entry.key == bindparam("k"))
        .values(
            hits=saturating_hits(n),
            last_access=case((Entry.last_access < t, t), else_=Entry.last_access),
        )
        .execution_options(synchronize_session=False)
    )
    hits = case((Access.hits > ROW_HITS_MAX, ROW_HITS_MAX), (Access.hits < 0, 0), else_=Access.hits)
    cap = bindparam("now", now, type_=Access.last_access.type)
    floor = bindparam("floor", EPOCH, type_=Access.last_access.type)
    when = case(
        (Access.last_access > cap, cap),
        (Access.last_access < floor, floor),  # '-infinity', or a clock at zero
        else_=Access.last_access,
    )
    with write_transaction(engine) as conn:
        top = conn.scalar(select(func.max(Access.id)).where(Access.namespace == namespace))
        if top is None:
            return 0
        after = ""
        while True:
            rows = conn.execute(
                select(Access.key, func.sum(hits), func.max(when).label("when"))
                .where(Access.namespace == namespace, Access.id <= top, Access.key > after)
                .group_by(Access.key)
                .order_by(Access.key)
                .limit(batch)
            ).all()
            if not rows:
                break
            params = [
                {"k": k, "n": min(int(total or 0), BIGINT_MAX), "t": min(last, now)}
                for k, total, last in rows
            ]
            conn.execute(apply, params)
            keep_late_hits(conn, engine, namespace, {p["k"]: p["n"] for p in params})
            after = rows[-1][0]
        result = conn.execute(delete(Access).where(Access.namespace == namespace, Access.id <= top))
        return int(result.rowcount)
