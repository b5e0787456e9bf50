"""Whether the index database itself is sound (not whether its rows match the objects)."""

from __future__ import annotations

import contextlib
import os
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from artifactstore.errors import one_line


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite index URL; None for other databases and in-memory ones."""
    try:
        parsed = make_url(url)
    except Exception:
        return None
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database.removeprefix("file:").split("?")[0])


def integrity_problem(engine: Engine) -> str | None:
    """What is wrong with the database's own structure, or None.

    SQLite: `PRAGMA quick_check` (every page and index, O(size), no row-by-row
    comparison). PostgreSQL guards its own pages; a query that answers is enough.
    """
    try:
        with engine.connect() as conn:
            if engine.dialect.name == "sqlite":
                rows = [str(r[0]) for r in conn.execute(text("PRAGMA quick_check"))]
                if rows != ["ok"]:
                    return f"the index database is corrupt ({'; '.join(rows)[:200]})"
            else:
                conn.execute(text("SELECT 1"))
    except SQLAlchemyError as exc:
        reason = one_line(getattr(exc, "orig", None) or exc)
        return f"the index database cannot be read ({reason})"
    return None


def set_aside(url: str) -> Path | None:
    """Move a SQLite index that fails its integrity check out of the way (with its WAL
    files), so a fresh one can be built in its place; returns where it went."""
    from artifactstore.index import db

    path = sqlite_path(url)
    if path is None or not path.exists():
        return None
    engine = db.open_engine(url)
    try:
        problem = integrity_problem(engine)
    finally:
        engine.dispose()
    if problem is None:
        return None
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.replace(f"{path}{suffix}", f"{target}{suffix}")
    return target
