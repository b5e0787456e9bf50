"""Whether the index database itself is sound (not whether its rows match the objects).

What an error means is `index/diagnosis.py`.
"""

from __future__ import annotations

import contextlib
import os
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import Engine, text
from sqlalchemy.exc import SQLAlchemyError

from artifactstore.index.diagnosis import Diagnosis, diagnose, sqlite_path


def integrity_problem(engine: Engine) -> Diagnosis | None:
    """What is wrong with the database's own structure or its reach, naming the fix; None
    when it answers and is sound.

    SQLite: `PRAGMA quick_check` (every page and index, O(size), no row-by-row
    comparison). PostgreSQL guards its own pages; a query that answers is enough.
    Only a corrupt file is fixed by `artstore db rebuild`: an unreachable server, a
    refused login or an unreadable file each name their own fix (`diagnose`).
    """
    url = engine.url.render_as_string(hide_password=False)
    try:
        with engine.connect() as conn:
            if engine.dialect.name == "sqlite":
                rows = [str(r[0]) for r in conn.execute(text("PRAGMA quick_check"))]
                if rows != ["ok"]:
                    return Diagnosis(
                        "corrupt",
                        f"the index database is corrupt ({'; '.join(rows)[:200]})",
                        "`artstore db rebuild` moves it aside and recreates it from the objects",
                    )
            else:
                conn.execute(text("SELECT 1"))
    except SQLAlchemyError as exc:
        return diagnose(exc, url, write=False)
    return None


def set_aside(url: str) -> Path | None:
    """Move a SQLite index that fails its integrity check out of the way (with its WAL
    files), so a fresh one can be built in its place; returns where it went."""
    from artifactstore.index.engine import open_engine

    path = sqlite_path(url)
    if path is None or not path.exists():
        return None
    engine = open_engine(url)
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
