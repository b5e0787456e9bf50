"""Engines and schema migrations for the index.

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

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import Connection, make_url

from artifactstore.config import redact_url
from artifactstore.errors import ConfigError, SchemaMismatch, one_line

log = logging.getLogger("artifactstore")

_PG_MIGRATION_LOCK = 0x41525453  # "ARTS"
# The newest migration in migrations/versions. Kept as a constant so that a
# process checking its schema need not import Alembic or scan the scripts;
# tests/test_units.py fails if it drifts from Alembic's head.
SCHEMA_HEAD = "0002"


def migrations_dir() -> Path:
    """Where the Alembic scripts are, installed (package data) or in a checkout."""
    try:
        from importlib.resources import files

        path = Path(str(files("artifactstore.migrations")))
        if (path / "env.py").is_file():
            return path
    except (ImportError, TypeError):
        pass
    return Path(__file__).resolve().parents[2] / "migrations"


def open_engine(url: str, *, timeout_secs: float = 10.0) -> Engine:
    """An engine with bounded waits: a dead database costs at most about timeout_secs."""
    try:
        parsed = make_url(url)
    except Exception:  # ArgumentError, ValueError: the message may quote the password
        raise ConfigError(
            "malformed index URL: use sqlite:///path/index.db or "
            "postgresql+psycopg://user@host:5432/dbname"
        ) from None
    kwargs: dict[str, Any] = {"future": True}
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        kwargs["connect_args"] = {"timeout": max(timeout_secs, 1.0)}
        engine = create_engine(parsed, **kwargs)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    kwargs["pool_pre_ping"] = True
    kwargs["pool_size"] = 4
    kwargs["max_overflow"] = 4
    kwargs["pool_timeout"] = timeout_secs
    kwargs["connect_args"] = {
        "connect_timeout": max(1, int(timeout_secs)),
        "application_name": "artifactstore",
    }
    try:
        return create_engine(parsed, **kwargs)
    except ImportError as exc:  # the dialect's driver, imported by create_engine
        raise ConfigError(
            f"the index is {parsed.get_backend_name()} but its driver is not installed "
            f"({one_line(exc)}): pip install 'artifactstore[postgres]'"
        ) from None


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    import sqlite3

    cur = dbapi_conn.cursor()
    # WAL lets readers proceed while one process writes; FULL makes a commit
    # durable before we report an entry as stored. Switching to WAL needs a
    # moment of exclusive access: if another process holds the database, it
    # is switching it already (the mode is persistent), so carry on.
    if cur.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
        try:
            cur.execute("PRAGMA journal_mode=WAL")
        except sqlite3.OperationalError:
            pass
    cur.execute("PRAGMA synchronous=FULL")
    # Up to 64 MiB of page cache (2 MiB by default), taken only as pages are
    # read: a hit reads a few pages, while gc and `ls` over a large index
    # rewrite or scan most of it and would otherwise go back to the OS per page.
    cur.execute("PRAGMA cache_size=-65536")
    cur.close()


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
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_MIGRATION_LOCK})
        yield conn


def upgrade(engine: Engine, revision: str = "head") -> SchemaStatus:
    """Apply migrations up to `revision`; safe to call from many processes at once."""
    from alembic import command

    with _migration_lock(engine) as conn:
        status = schema_status(engine)
        if status.state is SchemaState.AHEAD:
            status.require_current()
        if status.state is SchemaState.CURRENT and revision == "head":
            return status
        command.upgrade(_alembic_config(conn), revision)
    log.debug("index at %s upgraded to %s", redact_url(str(engine.url)), revision)
    return schema_status(engine)
