"""What `artstore metrics` reports per namespace, read from the index in a few queries."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Engine, Float, cast, func, select

from artifactstore.index.models import CounterRow, Entry, Quota, StoredObject, utcnow
from artifactstore.metrics import NamespaceFigures


def namespace_figures(engine: Engine, namespaces: Sequence[str]) -> list[NamespaceFigures]:
    """Entries, bytes, objects, hits, oldest access, quota and counters of `namespaces`
    (each listed, with zeros where the index holds nothing for it), in one read."""
    figures = {ns: NamespaceFigures(ns) for ns in namespaces}
    wanted = list(figures)
    now = utcnow()
    with engine.connect() as conn:
        entries = conn.execute(
            select(
                Entry.namespace,
                func.count(Entry.id),
                func.coalesce(func.sum(Entry.size), 0),
                # As a float: hits saturate at BIGINT's top (see EntryIndex.stats).
                func.coalesce(func.sum(cast(Entry.hits, Float)), 0),
                func.coalesce(func.sum(Entry.hits * Entry.compile_secs), 0.0),
                func.min(Entry.last_access),
            )
            .where(Entry.namespace.in_(wanted))
            .group_by(Entry.namespace)
        )
        for ns, count, size, hits, saved, oldest in entries:
            f = figures[ns]
            f.entries, f.entry_bytes = int(count), int(size)
            f.entry_hits, f.compile_secs_saved = float(hits), float(saved)
            if oldest is not None:  # min() keeps the column's type: an aware UTC datetime
                f.oldest_access_age_secs = (now - oldest).total_seconds()
        objects = conn.execute(
            select(
                StoredObject.namespace,
                func.count(),
                func.coalesce(func.sum(StoredObject.size), 0),
            )
            .where(StoredObject.namespace.in_(wanted))
            .group_by(StoredObject.namespace)
        )
        for ns, count, size in objects:
            figures[ns].objects, figures[ns].object_bytes = int(count), int(size)
        # What a quota counts: the distinct objects the entries reference (EvictionIndex).
        per_digest = (
            select(Entry.namespace, func.max(Entry.size).label("size"))
            .where(Entry.namespace.in_(wanted))
            .group_by(Entry.namespace, Entry.digest)
            .subquery()
        )
        used = dict(
            conn.execute(
                select(per_digest.c.namespace, func.sum(per_digest.c.size)).group_by(
                    per_digest.c.namespace
                )
            ).all()
        )
        for ns, max_bytes in conn.execute(
            select(Quota.namespace, Quota.max_bytes).where(Quota.namespace.in_(wanted))
        ):
            figures[ns].quota_bytes = int(max_bytes)
            figures[ns].quota_used_bytes = int(used.get(ns) or 0)
        for ns, name, value in conn.execute(
            select(CounterRow.namespace, CounterRow.name, CounterRow.value).where(
                CounterRow.namespace.in_(wanted)
            )
        ):
            figures[ns].counters[str(name)] = int(value)
    return [figures[ns] for ns in wanted]
