"""Store identity: the id of the object store each namespace of this index belongs to.

The object store keeps the same id in its `identity` object (artifactstore.store.identity);
commands that change the index or delete objects refuse when the two differ. Nothing
existing changes: a namespace without a row is bound by the first command or writer
of this version that finds it plausibly one store with its bucket.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "identities",
        sa.Column("namespace", sa.String(63), primary_key=True),
        sa.Column("store_id", sa.String(64), nullable=False),
        sa.Column("bound_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("identities")
