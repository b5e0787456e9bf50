"""SQL that differs between SQLite and PostgreSQL, in one place for every query module."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Connection,
    Engine,
    Integer,
    String,
    any_,
    func,
    literal,
    select,
)


def upsert(engine: Engine, model: Any) -> Any:
    """An INSERT that takes `on_conflict_do_nothing` / `on_conflict_do_update`, which
    SQLAlchemy has only per dialect."""
    # Imported here: each dialect module costs tens of ms at start-up.
    if engine.dialect.name == "postgresql":
        from sqlalchemy.dialects import postgresql

        return postgresql.insert(model)
    from sqlalchemy.dialects import sqlite

    return sqlite.insert(model)


@contextmanager
def write_transaction(engine: Engine) -> Iterator[Connection]:
    """A transaction holding the write lock from its first statement.

    On SQLite a transaction that reads first and writes later can fail with
    SQLITE_BUSY when another process commits in between; BEGIN IMMEDIATE waits
    for the lock instead. PostgreSQL locks rows as statements touch them.
    """
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        else:
            conn.begin()
        try:
            yield conn
        except BaseException:
            conn.rollback()
            raise
        conn.commit()


def one_of(engine: Engine, column: Any, values: Sequence[Any]) -> ColumnElement[bool]:
    """`column IN (values)` as one bound parameter rather than one per value:
    `= ANY(array)` on PostgreSQL, a json_each() table on SQLite. Both plan and bind
    in constant time, where thousands of placeholders cost seconds."""
    if engine.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import ARRAY

        item = BigInteger() if isinstance(column.type, Integer) else String()
        clause: ColumnElement[bool] = column == any_(literal(list(values), type_=ARRAY(item)))
        return clause
    table = func.json_each(literal(json.dumps(list(values)), type_=String())).table_valued("value")
    clause = column.in_(select(table.c.value))
    return clause
