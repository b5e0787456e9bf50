"""Initial index: entries, objects, fingerprints, counters.

Revision ID: 0001
Revises:
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from artifactstore.index.models import UTCDateTime

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "entries",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("namespace", sa.String(63), nullable=False),
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("raw_size", sa.BigInteger(), nullable=False),
        sa.Column("module_name", sa.String(255), nullable=False),
        sa.Column("platform", sa.String(32), nullable=False),
        sa.Column("platform_version", sa.String(255), nullable=False),
        sa.Column("device_kind", sa.String(255), nullable=False),
        sa.Column("device_count", sa.Integer(), nullable=False),
        sa.Column("jax_version", sa.String(32), nullable=False),
        sa.Column("jaxlib_version", sa.String(32), nullable=False),
        sa.Column("cpu_arch", sa.String(32), nullable=False),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("compile_secs", sa.Float(), nullable=False),
        sa.Column("producer_host", sa.String(255), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("last_access", UTCDateTime(), nullable=False),
        sa.Column("hits", sa.BigInteger(), nullable=False, server_default="0"),
        sa.UniqueConstraint("namespace", "key", name="uq_entries_namespace_key"),
    )
    op.create_index("ix_entries_namespace_last_access", "entries", ["namespace", "last_access"])
    op.create_index("ix_entries_namespace_digest", "entries", ["namespace", "digest"])
    op.create_index("ix_entries_namespace_jaxlib", "entries", ["namespace", "jaxlib_version"])
    op.create_table(
        "objects",
        sa.Column("namespace", sa.String(63), primary_key=True),
        sa.Column("digest", sa.String(64), primary_key=True),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
    )
    op.create_table(
        "fingerprints",
        sa.Column("digest", sa.String(64), primary_key=True),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
    )
    op.create_table(
        "counters",
        sa.Column("namespace", sa.String(63), primary_key=True),
        sa.Column("name", sa.String(32), primary_key=True),
        sa.Column("value", sa.BigInteger(), nullable=False, server_default="0"),
    )


def downgrade() -> None:
    op.drop_table("counters")
    op.drop_table("fingerprints")
    op.drop_table("objects")
    op.drop_index("ix_entries_namespace_jaxlib", table_name="entries")
    op.drop_index("ix_entries_namespace_digest", table_name="entries")
    op.drop_index("ix_entries_namespace_last_access", table_name="entries")
    op.drop_table("entries")
