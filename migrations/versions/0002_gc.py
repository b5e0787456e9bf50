"""Eviction: reader accesses, quotas, leases; (last_access, id) index for gc.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from artifactstore.index.models import UTCDateTime

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.drop_index("ix_entries_namespace_last_access", table_name="entries")
    op.create_index(
        "ix_entries_namespace_last_access_id", "entries", ["namespace", "last_access", "id"]
    )
    op.create_table(
        "accesses",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("namespace", sa.String(63), nullable=False),
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("hits", sa.BigInteger(), nullable=False),
        sa.Column("last_access", UTCDateTime(), nullable=False),
    )
    op.create_index("ix_accesses_namespace_key", "accesses", ["namespace", "key"])
    op.create_table(
        "quotas",
        sa.Column("namespace", sa.String(63), primary_key=True),
        sa.Column("max_bytes", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
    )
    op.create_table(
        "leases",
        sa.Column("name", sa.String(127), primary_key=True),
        sa.Column("holder", sa.String(255), nullable=False),
        sa.Column("token", sa.String(32), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("leases")
    op.drop_table("quotas")
    op.drop_index("ix_accesses_namespace_key", table_name="accesses")
    op.drop_table("accesses")
    op.drop_index("ix_entries_namespace_last_access_id", table_name="entries")
    op.create_index("ix_entries_namespace_last_access", "entries", ["namespace", "last_access"])
