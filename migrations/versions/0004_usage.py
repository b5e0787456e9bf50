"""Usage per namespace, UTC day and fingerprint: what `artstore stats --by` shows.

One row per (namespace, day, fingerprint digest) with summed hits, misses, misses
whose compile was then below ARTSTORE_MIN_COMPILE_SECS, all below-threshold
compiles, bytes fetched, compile seconds saved, lease waits and lease takeovers.
Nothing existing changes: `counters` and `entries.hits` keep the namespace totals
that clients of every version write.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "usage",
        sa.Column("namespace", sa.String(63), primary_key=True),
        sa.Column("day", sa.Date(), primary_key=True),
        sa.Column("fingerprint", sa.String(64), primary_key=True),
        sa.Column("hits", sa.BigInteger(), nullable=False),
        sa.Column("misses", sa.BigInteger(), nullable=False),
        sa.Column("misses_below_threshold", sa.BigInteger(), nullable=False),
        sa.Column("below_threshold", sa.BigInteger(), nullable=False),
        sa.Column("bytes_fetched", sa.BigInteger(), nullable=False),
        sa.Column("compile_secs_saved", sa.Float(), nullable=False),
        sa.Column("lease_waits", sa.BigInteger(), nullable=False),
        sa.Column("lease_takeovers", sa.BigInteger(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("usage")
