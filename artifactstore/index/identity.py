"""The index's side of the store identity (artifactstore.store.identity): which object store,
by its id, each namespace of this index belongs to, and the entries that say whether
an unbound pair plausibly belongs together."""

from __future__ import annotations

from sqlalchemy import Engine, func, select, update

from artifactstore.index.models import Entry, IdentityRow, utcnow
from artifactstore.index.sql import upsert


def bound_id(engine: Engine, namespace: str) -> str | None:
    """The id of the object store `namespace` is bound to, or None if not yet bound."""
    with engine.connect() as conn:
        value = conn.scalar(select(IdentityRow.store_id).where(IdentityRow.namespace == namespace))
    return str(value) if value is not None else None


def bind(engine: Engine, namespace: str, store_id: str, *, replace: bool = False) -> str:
    """Record `store_id` for `namespace` unless another is recorded (then that one is
    kept, so two first writers agree) or `replace`; the id recorded afterwards."""
    ins = upsert(engine, IdentityRow).values(
        namespace=namespace, store_id=store_id, bound_at=utcnow()
    )
    with engine.begin() as conn:
        conn.execute(ins.on_conflict_do_nothing(index_elements=["namespace"]))
        if replace:
            conn.execute(
                update(IdentityRow)
                .where(IdentityRow.namespace == namespace)
                .values(store_id=store_id, bound_at=utcnow())
            )
        value = conn.scalar(select(IdentityRow.store_id).where(IdentityRow.namespace == namespace))
    return str(value)


def may_bind(engine: Engine, namespace: str) -> None:
    """Raise what recording an identity for `namespace` would raise (a login the namespace
    was never granted: row-level security), recording nothing. Asked before the object
    store's identity object is created, which is never deleted: a writer its index refuses
    must not leave the namespace bound to nothing in the team's bucket."""
    probe = upsert(engine, IdentityRow).values(
        namespace=namespace, store_id="probe", bound_at=utcnow()
    )
    with engine.connect() as conn:
        tx = conn.begin()
        try:
            conn.execute(probe.on_conflict_do_nothing(index_elements=["namespace"]))
        finally:
            tx.rollback()


def entry_count(engine: Engine, namespace: str) -> int:
    stmt = select(func.count()).select_from(Entry).where(Entry.namespace == namespace)
    with engine.connect() as conn:
        return int(conn.scalar(stmt) or 0)


def newest_digests(engine: Engine, namespace: str, limit: int) -> list[str]:
    """The objects of the namespace's `limit` newest entries (the likeliest to exist)."""
    with engine.connect() as conn:
        rows = conn.scalars(
            select(Entry.digest)
            .where(Entry.namespace == namespace)
            .order_by(Entry.id.desc())
            .limit(limit)
        )
        return [str(d) for d in rows]
