"""Models: ``corrupt_at`` and ``corrupt_reason``, set when a stored archive fails its sha256.

Revision ID: 0010
Revises: 0009
Create Date: 2026-01-05

Both nullable (every stored package stays as it is); :mod:`fleet.registry.integrity` sets them
when a download finds the archive damaged, and clears them when the same package is pushed again.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("models", sa.Column("corrupt_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("models", sa.Column("corrupt_reason", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.drop_column("corrupt_reason")
        batch.drop_column("corrupt_at")
