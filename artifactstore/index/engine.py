"""Engines of the index: bounded waits, pooled connections closed when idle, and
readers that cannot write (SQLite: a read-only open or an authorizer; PostgreSQL: READ
ONLY transactions), each refusal one line naming the fix.

Apart from the schema (`index.db`: migrations and their lock) so that how a
connection is opened reads on its own.
"""

from __future__ import annotations

import functools
import logging
import os
import time
import weakref
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, Connection, ExceptionContext, make_url

from artifactstore.errors import (
    ConfigError,
    PrivilegeRefused,
    ReadOnlyError,
    StoreUnavailable,
    one_line,
)

log = logging.getLogger("artifactstore")


def open_engine(
    url: str,
    *,
    timeout_secs: float = 10.0,
    read_only: bool = False,
    pool_size: int = 4,
    namespace: str | None = None,
) -> Engine:
    """An engine with bounded waits: a dead database costs at most about timeout_secs.

    `read_only`: this process is a reader (ARTSTORE_READ_ONLY). A SQLite index is
    also opened read-only, whatever the settings, when this process may not write
    it: see `_open_sqlite`. `read_only_reason` tells such engines apart.
    `pool_size`: PostgreSQL connections kept (as many again in overflow); see
    `release_idle` for when they are closed. `namespace`: the one this process uses,
    named in the fix when row-level security refuses it.
    """
    try:
        parsed = make_url(url)
    except Exception:  # ArgumentError, ValueError: the message may quote the password
        raise ConfigError(
            "malformed index URL: use sqlite:///path/index.db or "
            "postgresql+psycopg://user@host:5432/dbname"
        ) from None
    kwargs: dict[str, Any] = {"future": True}
    if parsed.get_backend_name() == "sqlite":
        return _open_sqlite(parsed, timeout_secs=timeout_secs, read_only=read_only)
    kwargs["pool_pre_ping"] = True
    kwargs["pool_size"] = pool_size
    kwargs["max_overflow"] = pool_size
    kwargs["pool_timeout"] = timeout_secs
    kwargs["connect_args"] = {
        # Whole seconds, per address the host name resolves to; libpq and psycopg wait
        # at least 2 whatever is asked.
        "connect_timeout": max(2, round(timeout_secs)),
        # Operators (and tests) tell readers' connections from writers' by this.
        "application_name": "artifactstore-reader" if read_only else "artifactstore-writer",
        # A database host that dies mid-query (no RST) is noticed in about 25 s, not
        # after the kernel's 2-hour keepalive default.
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 5,
        "keepalives_count": 3,
        # No server-side prepared statements (psycopg prepares a query run 5 times on one
        # connection): PgBouncer's transaction pooling hands each transaction any server
        # connection, where a statement prepared on another does not exist.
        "prepare_threshold": None,
    }
    try:
        engine = create_engine(parsed, **kwargs)
    except ImportError as exc:  # the dialect's driver, imported by create_engine
        raise ConfigError(
            f"the index is {parsed.get_backend_name()} but its driver is not installed "
            f"({one_line(exc)}): pip install 'artifactstore[postgres]'"
        ) from None
    lock_ms = max(1, int(timeout_secs * 1000))

    @event.listens_for(engine, "begin")
    def _transaction_settings(conn: Connection) -> None:
        # A lock held elsewhere (an operator's LOCK TABLE, a migration, a long
        # transaction) fails the statement after the bound, server-side, instead of
        # hanging it: the CLI has no other bound, and a hung call in a program keeps
        # its pooled connection. Per transaction (SET LOCAL, no snapshot taken), never
        # per session: PgBouncer's transaction pooling gives each transaction any server
        # connection, where a session's SET would be missing or another client's.
        conn.exec_driver_sql(f"SET LOCAL lock_timeout = {lock_ms}")
        if read_only:
            # The server refuses every write of a reader, whatever its role may do:
            # only `append_accesses` turns its transaction READ WRITE.
            conn.exec_driver_sql("SET TRANSACTION READ ONLY")

    @event.listens_for(engine, "checkin")
    def _note_use(_dbapi_conn: Any, _record: Any) -> None:
        _LAST_USE[engine] = time.monotonic()

    why = _READ_ONLY_SETTING
    if read_only:
        _READ_ONLY[engine] = why
    event.listen(engine, "handle_error", functools.partial(_refused_pg_write, why, namespace))
    return engine


# PostgreSQL engines -> when a connection last went back to their pool (monotonic).
_LAST_USE: weakref.WeakKeyDictionary[Engine, float] = weakref.WeakKeyDictionary()


def release_idle(engine: Engine, idle_secs: float) -> bool:
    """Close a PostgreSQL engine's pooled connections when none was used for `idle_secs`.

    The server has a fixed number of connections for every client of every team: a
    program holds them only while it writes (its background writer calls this each
    tick). SQLite's are files, kept. True if connections were closed."""
    last = _LAST_USE.get(engine)
    if last is None or time.monotonic() - last < idle_secs:
        return False
    pool = engine.pool
    if getattr(pool, "checkedout", lambda: 1)() or not getattr(pool, "checkedin", lambda: 0)():
        return False
    # A connection checked out meanwhile stays valid: it goes back to the old pool,
    # which closes it on return.
    engine.dispose(close=True)
    _LAST_USE.pop(engine, None)
    return True


def allow_access_append(conn: Connection) -> None:
    """Open a reader's transaction for its one permitted write, the access append.

    A read-only engine refuses every other write (SQLite: the authorizer; PostgreSQL:
    READ ONLY transactions, set as each begins; a SET takes no snapshot, so this may
    still turn it READ WRITE); on a writer's engine this changes nothing."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql("SET TRANSACTION READ WRITE")


# Engines that refuse index writes -> the one line saying why and what to do.
_READ_ONLY: weakref.WeakKeyDictionary[Engine, str] = weakref.WeakKeyDictionary()
_READ_ONLY_SETTING = "the index is read-only here: unset ARTSTORE_READ_ONLY to write"


def read_only_reason(engine: Engine) -> str | None:
    """Why `engine` refuses index writes (a line naming the fix), or None if it writes."""
    return _READ_ONLY.get(engine)


def _open_sqlite(url: URL, *, timeout_secs: float, read_only: bool) -> Engine:
    """A SQLite engine, opened so that a process that must not or cannot write still reads.

    - The file or its directory is not writable by this process (a published
      store, a user other than its owner, a read-only mount): SQLite URI
      `mode=ro` where a writer's WAL index (`-shm`) exists, so that its commits
      are seen consistently; else `immutable=1`. A WAL database needs a `-shm`:
      `mode=ro` would create it (in a read-only directory it cannot, and the open
      fails), owned by this user with the index's read-only mode, which makes the
      owner's next open read-only too. `immutable=1` creates nothing but skips
      locking: a writer starting meanwhile could show this reader a stale or torn
      view, which costs misses or an error, never a wrong load (objects are
      verified by digest and fingerprint).
    - `read_only` on a writable file: a normal connection whose authorizer refuses
      every write but appending to `accesses`, as the PostgreSQL reader role does,
      so that readers' hits still reach LRU.
    No read-only open creates anything: not the directory, not an empty index,
    and no PRAGMA writes (the switch to WAL is left to writers).
    """
    kwargs: dict[str, Any] = {
        "future": True,
        "connect_args": {"timeout": max(timeout_secs, 1.0)},
    }
    database = url.database
    if not database or database == ":memory:" or database.startswith("file:"):
        engine = create_engine(url, **kwargs)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    path = Path(database)
    not_writable = (
        f"the index {path} is read-only for this user: "
        f"run as a writer (a user who may write {path.parent})"
    )
    params = _sqlite_uri_params(path, read_only=read_only)
    if params is not None:
        log.debug("index %s is not writable here: opened read-only (%s)", path, params)
        uri = "file:" + quote(os.path.abspath(path))
        url = url.set(database=uri, query={**url.query, **params, "uri": "true"})
    elif not read_only:
        path.parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, **kwargs)
    why = not_writable
    if params is not None:
        event.listen(engine, "connect", _sqlite_reader_pragmas)
        _READ_ONLY[engine] = why
    elif read_only:
        event.listen(engine, "connect", _sqlite_reader_pragmas)
        event.listen(engine, "connect", _refuse_writes_but_accesses)
        why = _READ_ONLY_SETTING
        _READ_ONLY[engine] = why
    else:
        event.listen(engine, "connect", _sqlite_pragmas)
    # Also on a writer's engine: a file system may refuse writes that os.access allowed.
    event.listen(engine, "handle_error", functools.partial(_refused_write, why))
    return engine


def _sqlite_uri_params(path: Path, *, read_only: bool) -> dict[str, str] | None:
    """SQLite URI parameters to open `path` read-only, or None when this process may write it."""
    if not path.exists():
        if read_only:
            raise StoreUnavailable(
                f"no index at {path} yet: a reader (ARTSTORE_READ_ONLY) does not create "
                "one; let a writer open the store first"
            )
        return None  # a writer creates it (or fails to, saying why)
    if os.access(path.parent, os.W_OK | os.X_OK) and os.access(path, os.W_OK):
        return None
    if Path(f"{path}-shm").exists():  # see _open_sqlite for why only then
        return {"mode": "ro"}
    return {"mode": "ro", "immutable": "1"}


def _refused_write(why: str, context: ExceptionContext) -> None:
    """SQLite refused a write (SQLITE_READONLY, or our authorizer's SQLITE_AUTH): one line."""
    code = getattr(context.original_exception, "sqlite_errorcode", None)
    if isinstance(code, int) and code & 0xFF in (8, 23):  # SQLITE_READONLY*, SQLITE_AUTH
        raise ReadOnlyError(why) from None


def _refused_pg_write(why: str, namespace: str | None, context: ExceptionContext) -> None:
    """PostgreSQL refused a statement: this reader's READ ONLY transaction, or a role
    without the privilege or the namespace (infra/policies/). One line naming the fix:
    which grant is missing, for a read as for a write (index/diagnosis.py)."""
    code = getattr(context.original_exception, "sqlstate", None)
    if code == "25006":  # read_only_sql_transaction
        raise ReadOnlyError(why) from None
    if code == "42501":  # insufficient_privilege, or a row-level security policy
        from artifactstore.index.diagnosis import diagnose

        statement = (context.statement or "").lstrip().upper()
        write = not statement.startswith(("SELECT", "WITH", "SHOW"))
        url = context.engine.url.render_as_string(hide_password=True) if context.engine else ""
        found = diagnose(context.original_exception, url, namespace=namespace, write=write)
        raise PrivilegeRefused(str(found)) from None


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
    cur.close()
    _sqlite_reader_pragmas(dbapi_conn, _record)


def _sqlite_reader_pragmas(dbapi_conn: Any, _record: Any) -> None:
    """Connection settings only: none of these writes to the database."""
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA synchronous=FULL")
    # Up to 64 MiB of page cache (2 MiB by default), taken only as pages are
    # read: a hit reads a few pages, while gc and `ls` over a large index
    # rewrite or scan most of it and would otherwise go back to the OS per page.
    cur.execute("PRAGMA cache_size=-65536")
    cur.close()


def _refuse_writes_but_accesses(dbapi_conn: Any, _record: Any) -> None:
    """The SQLite reader's backstop, like ReadOnlyBlobStore: no code path writes the index."""
    import sqlite3

    writes = {
        sqlite3.SQLITE_INSERT,
        sqlite3.SQLITE_UPDATE,
        sqlite3.SQLITE_DELETE,
        sqlite3.SQLITE_CREATE_INDEX,
        sqlite3.SQLITE_CREATE_TABLE,
        sqlite3.SQLITE_CREATE_TRIGGER,
        sqlite3.SQLITE_CREATE_VIEW,
        sqlite3.SQLITE_DROP_INDEX,
        sqlite3.SQLITE_DROP_TABLE,
        sqlite3.SQLITE_DROP_TRIGGER,
        sqlite3.SQLITE_DROP_VIEW,
        sqlite3.SQLITE_ALTER_TABLE,
        sqlite3.SQLITE_REINDEX,
        sqlite3.SQLITE_ANALYZE,
        sqlite3.SQLITE_CREATE_VTABLE,
        sqlite3.SQLITE_DROP_VTABLE,
    }

    def authorize(action: int, arg1: str | None, _a2: Any, dbname: str | None, _s: Any) -> int:
        if action not in writes or dbname == "temp":
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_INSERT and arg1 == "accesses":  # models.Access
            return sqlite3.SQLITE_OK
        return sqlite3.SQLITE_DENY

    dbapi_conn.set_authorizer(authorize)
