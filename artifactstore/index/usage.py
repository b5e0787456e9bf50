"""Usage rows (migration 0004): written with the counters, grouped for `artstore stats --by`.

Rows are per (namespace, UTC day, fingerprint digest) and only ever added to
(artifactstore.formats.usage lists the fields). Per-module figures come from `entries`
instead (module names are not a usage dimension: there are thousands of them).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import date
from typing import Any

from sqlalchemy import Connection, Engine, Float, cast, func, select

from artifactstore.formats import usage as _usage
from artifactstore.formats.counters import with_aliases
from artifactstore.index.kept_hits import evicted
from artifactstore.index.models import CounterRow, Entry, FingerprintRow, UsageRow
from artifactstore.index.sql import upsert

INT_FIELDS = tuple(f for f in _usage.FIELDS if f != "compile_secs_saved")


def write_usage(conn: Connection, engine: Engine, namespace: str, usage: _usage.Usage) -> None:
    """Add `usage` into the namespace's rows (one upsert per day and fingerprint).

    In sorted order: two transactions upserting the same rows lock them in the same
    order, so a gc's fold and a writer's exit flush never deadlock on PostgreSQL."""
    for (day, fingerprint), values in sorted(usage.items()):
        if not any(values.values()):
            continue
        row: dict[str, Any] = {name: int(values.get(name, 0)) for name in INT_FIELDS}
        row["compile_secs_saved"] = float(values.get("compile_secs_saved", 0.0))
        ins = upsert(engine, UsageRow).values(
            namespace=namespace, day=day, fingerprint=fingerprint, **row
        )
        conn.execute(
            ins.on_conflict_do_update(
                index_elements=["namespace", "day", "fingerprint"],
                set_={
                    name: getattr(UsageRow, name) + getattr(ins.excluded, name)
                    for name in _usage.FIELDS
                },
            )
        )


@dataclass
class UsageGroup:
    """One `artstore stats --by` row; None where the source cannot say (per module:
    misses, below-threshold compiles and leases are not known per module)."""

    group: str
    hits: int = 0
    misses: int | None = 0
    misses_below_threshold: int | None = 0
    below_threshold: int | None = 0
    bytes_fetched: int = 0
    compile_secs_saved: float = 0.0
    lease_waits: int | None = 0
    lease_takeovers: int | None = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def eligible_misses(self) -> int | None:
        if self.misses is None:
            return None
        return max(self.misses - (self.misses_below_threshold or 0), 0)

    @property
    def hit_rate(self) -> float | None:
        eligible = self.eligible_misses
        if eligible is None:
            return None
        lookups = self.hits + eligible
        return self.hits / lookups if lookups else 0.0

    def to_json(self, name: str) -> dict[str, Any]:
        # The names of process_stats() (formats.counters), with 0.3's for one release.
        return with_aliases(
            {
                name: self.group,
                **self.extra,
                "hits": self.hits,
                "misses": self.eligible_misses,
                "hit_rate": self.hit_rate,
                "lookups_missed": self.misses,
                "misses_below_threshold": self.misses_below_threshold,
                "quick_compiles": self.below_threshold,
                "bytes_fetched": self.bytes_fetched,
                "compile_secs_saved": self.compile_secs_saved,
                "lease_waits": self.lease_waits,
                "lease_takeovers": self.lease_takeovers,
            }
        )


def _sums() -> list[Any]:
    # Floats where rows add up past BIGINT (SQLite's integer sum() raises on overflow).
    return [func.coalesce(func.sum(cast(getattr(UsageRow, f), Float)), 0) for f in _usage.FIELDS]


def _group(name: str, values: Iterable[Any]) -> UsageGroup:
    out = UsageGroup(name)
    for field_name, value in zip(_usage.FIELDS, values, strict=True):
        number = float(value or 0)
        setattr(out, field_name, number if field_name == "compile_secs_saved" else int(number))
    return out


def by_day(engine: Engine, namespace: str, since: date | None = None) -> list[UsageGroup]:
    """Usage per UTC day, newest first."""
    where = [UsageRow.namespace == namespace]
    if since is not None:
        where.append(UsageRow.day >= since)
    stmt = select(UsageRow.day, *_sums()).where(*where).group_by(UsageRow.day)
    with engine.connect() as conn:
        rows = conn.execute(stmt.order_by(UsageRow.day.desc())).all()
    return [_group(day.isoformat(), rest) for day, *rest in rows]


def by_fingerprint(engine: Engine, namespace: str, since: date | None = None) -> list[UsageGroup]:
    """Usage per fingerprint digest, most hits first, with its platform, device kind
    and jaxlib where the index holds the fingerprint ("" digest: events without one)."""
    where = [UsageRow.namespace == namespace]
    if since is not None:
        where.append(UsageRow.day >= since)
    stmt = select(UsageRow.fingerprint, *_sums()).where(*where).group_by(UsageRow.fingerprint)
    with engine.connect() as conn:
        rows = conn.execute(stmt).all()
        digests = [r[0] for r in rows if r[0]]
        bodies = (
            dict(
                conn.execute(
                    select(FingerprintRow.digest, FingerprintRow.body).where(
                        FingerprintRow.digest.in_(digests)
                    )
                ).all()
            )
            if digests
            else {}
        )
    groups = [_group(digest, rest) for digest, *rest in rows]
    for group in groups:
        group.extra = _describe(bodies.get(group.group))
    return sorted(groups, key=lambda g: (-g.hits, g.group))


# The `--by module` row of entries no longer held (their module names left with them).
REMOVED = "(removed entries)"


def by_module(engine: Engine, namespace: str) -> list[UsageGroup]:
    """Per module name, from the entries the index holds now: their hits (all time),
    the bytes and compile time those hits saved; and one REMOVED row for the hits of
    entries gc or `rm` deleted (index/kept_hits.py), so the rows add up to `stats`.
    Misses, below-threshold compiles and leases are not known per module (None)."""
    stmt = (
        select(
            Entry.module_name,
            func.count(Entry.id),
            func.coalesce(func.sum(Entry.size), 0),
            func.coalesce(func.sum(cast(Entry.hits, Float)), 0),
            func.coalesce(func.sum(cast(Entry.hits, Float) * Entry.size), 0),
            func.coalesce(func.sum(Entry.hits * Entry.compile_secs), 0.0),
        )
        .where(Entry.namespace == namespace)
        .group_by(Entry.module_name)
    )
    with engine.connect() as conn:
        rows: list[Any] = list(conn.execute(stmt).all())
        counters = dict(
            conn.execute(
                select(CounterRow.name, CounterRow.value).where(CounterRow.namespace == namespace)
            ).all()
        )
    gone_hits, gone_fetched, gone_saved = evicted(counters)
    if gone_hits:
        rows.append((REMOVED, 0, 0, gone_hits, gone_fetched, gone_saved))
    groups = [
        UsageGroup(
            str(module),
            hits=int(hits),
            misses=None,
            misses_below_threshold=None,
            below_threshold=None,
            bytes_fetched=int(fetched),
            compile_secs_saved=float(saved),
            lease_waits=None,
            lease_takeovers=None,
            extra={"entries": int(entries), "bytes": int(size)},
        )
        for module, entries, size, hits, fetched, saved in rows
    ]
    return sorted(groups, key=lambda g: (-g.hits, g.group))


def _describe(body: str | None) -> dict[str, Any]:
    """What `--by fingerprint` shows of a fingerprint beside its digest."""
    out: dict[str, Any] = {"platform": None, "device_kind": None, "jaxlib_version": None}
    if body is None:
        return out
    try:
        data = json.loads(body)
    except ValueError:
        return out
    if isinstance(data, dict):
        for name in out:
            value = data.get(name)
            out[name] = str(value) if value is not None else None
    return out
