"""Schema migrations for the index, and its engines (opened by `index.engine`).

One Alembic history serves SQLite and PostgreSQL. Upgrades take a lock
(a file lock for SQLite, an advisory lock for PostgreSQL) so that many
processes starting at once on a fresh store migrate it exactly once.
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.engine import Connection

from artifactstore.errors import ReadOnlyError, SchemaMismatch
from artifactstore.index.engine import (
    allow_access_append,
    open_engine,
    read_only_reason,
    release_idle,
)
from artifactstore.redact import redact

__all__ = [
    "SCHEMA_HEAD",
    "SchemaState",
    "SchemaStatus",
    "allow_access_append",
    "current_revision",
    "head_revision",
    "migrations_dir",
    "open_engine",
    "read_only_reason",
    "release_idle",
    "schema_status",
    "upgrade",
]

log = logging.getLogger("artifactstore")

_PG_MIGRATION_LOCK = 0x41525453  # "ARTS"
# The newest migration in migrations/versions. Kept as a constant so that a
# process checking its schema need not import Alembic or scan the scripts;
# tests/test_units.py fails if it drifts from Alembic's head.
SCHEMA_HEAD = "0005"


def migrations_dir() -> Path:
    """Where the Alembic scripts are, installed (package data) or in a checkout.

    The checkout this package was imported from wins: an editable install maps
    `artifactstore.migrations` to the checkout it was installed from, which need not
    be this one (a git worktree run with PYTHONPATH)."""
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").is_file() and (checkout / "migrations" / "env.py").is_file():
        return checkout / "migrations"
    try:
        from importlib.resources import files

        path = Path(str(files("artifactstore.migrations")))
        if (path / "env.py").is_file():
            return path
    except (ImportError, TypeError):
        pass
    return Path(__file__).resolve().parents[2] / "migrations"


class SchemaState(enum.Enum):
    EMPTY = "empty"
    CURRENT = "current"
    BEHIND = "behind"
    AHEAD = "ahead"


@dataclass(frozen=True)
class SchemaStatus:
    state: SchemaState
    current: str | None
    head: str

    def problem(self) -> str | None:
        """What is wrong with a schema that is not current, naming the fix; else None."""
        if self.state is SchemaState.CURRENT:
            return None
        if self.state is SchemaState.AHEAD:
            return (
                f"index schema {self.current} is newer than this artifactstore understands "
                f"(head {self.head}): upgrade artifactstore (pip install -U artifactstore)"
            )
        return (
            f"index schema is {self.current or 'not created'}, this artifactstore needs "
            f"{self.head}: run `artstore db upgrade`"
        )

    def require_current(self) -> None:
        problem = self.problem()
        if problem is not None:
            raise SchemaMismatch(problem)


def _alembic_config(connection: Connection | None = None) -> Any:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def _script() -> Any:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_alembic_config())


def head_revision() -> str:
    head = _script().get_current_head()
    assert head is not None
    return str(head)


def current_revision(engine: Engine) -> str | None:
    """The revision in alembic_version, read without importing Alembic."""
    from sqlalchemy import inspect

    with engine.connect() as conn:
        if not inspect(conn).has_table("alembic_version"):
            return None
        row = conn.execute(text("SELECT version_num FROM alembic_version")).first()
    return str(row[0]) if row is not None else None


def schema_status(engine: Engine) -> SchemaStatus:
    head = SCHEMA_HEAD
    current = current_revision(engine)
    if current is None:
        return SchemaStatus(SchemaState.EMPTY, None, head)
    if current == head:
        return SchemaStatus(SchemaState.CURRENT, current, head)
    script = _script()
    try:
        known = script.get_revision(current) is not None
    except Exception:
        known = False
    return SchemaStatus(SchemaState.BEHIND if known else SchemaState.AHEAD, current, head)


@contextlib.contextmanager
def _migration_lock(engine: Engine) -> Iterator[Connection]:
    url = engine.url
    if url.get_backend_name() == "sqlite" and url.database and url.database != ":memory:":
        lock_path = Path(url.database + ".migrate.lock")
        with open(lock_path, "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                with engine.begin() as conn:
                    yield conn
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
        return
    with engine.begin() as conn:
        if url.get_backend_name() == "postgresql":
            # Concurrent upgrades queue here (the first migrates, the rest find it done):
            # the connection's lock_timeout (ARTSTORE_TIMEOUT) is for lookups, not this.
            conn.execute(text("SET LOCAL lock_timeout = 0"))
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_MIGRATION_LOCK})
        yield conn


def upgrade(engine: Engine, revision: str = "head") -> SchemaStatus:
    """Apply migrations up to `revision`; safe to call from many processes at once."""
    from alembic import command

    why = read_only_reason(engine)
    if why is not None:  # before the lock: its file may not be creatable here
        status = schema_status(engine)
        if status.state is SchemaState.CURRENT and revision == "head":
            return status
        raise ReadOnlyError(f"cannot migrate: {why}")
    with _migration_lock(engine) as conn:
        status = schema_status(engine)
        if status.state is SchemaState.AHEAD:
            status.require_current()
        if status.state is SchemaState.CURRENT and revision == "head":
            return status
        command.upgrade(_alembic_config(conn), revision)
    log.debug("index at %s upgraded to %s", redact(str(engine.url)), revision)
    return schema_status(engine)
