"""Camera alert snapshots uploaded by devices: alert_snapshots.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01

Written out in full (not imported from fleet.db.snapshot_tables) so that later schema edits
never change what this revision does.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_PK = sa.Integer().with_variant(sa.BigInteger(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "alert_snapshots",
        sa.Column("pk", _PK, autoincrement=True, nullable=False),
        sa.Column("device_id", sa.String(64), nullable=False),
        sa.Column("alert_id", sa.String(160), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("content_type", sa.String(32), nullable=False),
        sa.Column("width", sa.Integer(), nullable=False),
        sa.Column("height", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("pk", name="pk_alert_snapshots"),
        sa.ForeignKeyConstraint(
            ["device_id"], ["devices.device_id"], name="fk_alert_snapshots_device_id_devices",
            ondelete="CASCADE",
        ),
        sa.UniqueConstraint("alert_id", "kind", name="uq_alert_snapshots_alert_id_kind"),
    )


def downgrade() -> None:
    op.drop_table("alert_snapshots")
