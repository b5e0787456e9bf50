"""Per-namespace size quotas (enforced by `artstore gc`), and the list of namespaces."""

from __future__ import annotations

from sqlalchemy import Engine, delete, select, union

from artifactstore.index.models import Entry, Quota, StoredObject, utcnow
from artifactstore.index.sql import upsert


def set_quota(engine: Engine, namespace: str, max_bytes: int) -> None:
    ins = upsert(engine, Quota).values(
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
