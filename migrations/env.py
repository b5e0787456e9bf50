"""Alembic environment: runs on a connection handed in by artifactstore, or on a URL.

`artstore db upgrade` passes its own connection (config.attributes["connection"]);
developers may also run `alembic -x url=sqlite:///... upgrade head` from the repo.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from artifactstore.index.models import Base

target_metadata = Base.metadata
config = context.config


def _run(connection) -> None:  # type: ignore[no-untyped-def]
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option(
        "sqlalchemy.url"
    )
    if context.is_offline_mode():
        context.configure(url=url, target_metadata=target_metadata, literal_binds=True)
        with context.begin_transaction():
            context.run_migrations()
    else:
        engine = create_engine(url)
        with engine.begin() as conn:
            _run(conn)
