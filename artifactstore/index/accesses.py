"""Read-only readers' hits: appended as rows, folded into entries by `artstore gc`.

Readers may not update `entries` (their database role has INSERT on `accesses`
only), so they append batches here, and gc applies them exactly once before it
chooses by last access: LRU then reflects the whole cluster.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Engine, bindparam, case, delete, func, insert, select, update

from artifactstore.index.db import allow_access_append
from artifactstore.index.models import Access, Entry
from artifactstore.index.sql import write_transaction

# Hits one access row may carry: a process cannot plausibly serve more between two
# flushes, and any number of such rows sums far below BIGINT's limit.
MAX_HITS_PER_ROW = 1_000_000


def append_accesses(
    engine: Engine, namespace: str, touches: dict[str, tuple[int, datetime]]
) -> None:
    """Append batched hits: key -> (count, latest access time)."""
    if not touches:
        return
    rows = [
        {"namespace": namespace, "key": k, "hits": n, "last_access": t}
        for k, (n, t) in touches.items()
    ]
    with engine.begin() as conn:
        allow_access_append(conn)
        conn.execute(insert(Access), rows)


def fold_accesses(engine: Engine, namespace: str, batch: int = 1000) -> int:
    """Apply the namespace's access rows to its entries and delete them; rows folded."""
    t = bindparam("t", type_=Entry.last_access.type)
    apply = (
        update(Entry)
        .where(Entry.namespace == namespace, Entry.key == bindparam("k"))
        .values(
            hits=Entry.hits + bindparam("n"),
            last_access=case((Entry.last_access < t, t), else_=Entry.last_access),
        )
        .execution_options(synchronize_session=False)
    )
    with write_transaction(engine) as conn:
        top = conn.scalar(select(func.max(Access.id)).where(Access.namespace == namespace))
        if top is None:
            return 0
        after = ""
        while True:
            rows = conn.execute(
                select(Access.key, func.sum(Access.hits), func.max(Access.last_access))
                .where(Access.namespace == namespace, Access.id <= top, Access.key > after)
                .group_by(Access.key)
                .order_by(Access.key)
                .limit(batch)
            ).all()
            if not rows:
                break
            conn.execute(apply, [{"k": k, "n": int(n), "t": when} for k, n, when in rows])
            after = rows[-1][0]
        result = conn.execute(delete(Access).where(Access.namespace == namespace, Access.id <= top))
        return int(result.rowcount)
