"""Signed entries: the signing key's name and the signature of each entry.

Both nullable: entries written before 0003, and by writers without a signing key,
are unsigned. Readers verify the object's own signature frame; these columns let
`artstore ls` and `artstore verify` name the signer without reading objects.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("entries") as batch:
        batch.add_column(sa.Column("signer", sa.String(63), nullable=True))
        batch.add_column(sa.Column("signature", sa.String(128), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("entries") as batch:
        batch.drop_column("signature")
        batch.drop_column("signer")
