"""Initial schema: devices, alerts, aggregates.

Revision ID: 0001
Revises:
Create Date: 2025-01-01

Written out in full (not imported from fleet.db.schema) so that later schema edits never change
what this revision does.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
_PK = sa.Integer().with_variant(sa.BigInteger(), "postgresql")


def _ts(name: str, *, nullable: bool = False) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "devices",
        sa.Column("device_id", sa.String(64), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=True),
        sa.Column("tags", _JSON, nullable=False),
        _ts("created_at"),
        _ts("revoked_at", nullable=True),
        _ts("last_seen", nullable=True),
        sa.Column("agent_version", sa.String(64), nullable=True),
        sa.Column("model_name", sa.String(64), nullable=True),
        sa.Column("model_version", sa.BigInteger(), nullable=True),
        sa.Column("backlog_alerts", sa.BigInteger(), nullable=True),
        sa.Column("backlog_aggregates", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("device_id", name="pk_devices"),
        sa.UniqueConstraint("token_hash", name="uq_devices_token_hash"),
    )
    op.create_table(
        "alerts",
        sa.Column("pk", _PK, autoincrement=True, nullable=False),
        sa.Column("id", sa.String(160), nullable=False),
        sa.Column("device_id", sa.String(64), nullable=False),
        sa.Column("stream", sa.String(64), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("score", sa.Float(), nullable=False),
        sa.Column("threshold", sa.Float(), nullable=False),
        _ts("window_start"),
        _ts("window_end"),
        _ts("raised_at"),
        sa.Column("model_name", sa.String(64), nullable=False),
        sa.Column("model_version", sa.BigInteger(), nullable=False),
        sa.Column("payload", _JSON, nullable=False),
        _ts("received_at"),
        sa.PrimaryKeyConstraint("pk", name="pk_alerts"),
        sa.UniqueConstraint("id", name="uq_alerts_id"),
        sa.ForeignKeyConstraint(
            ["device_id"], ["devices.device_id"], name="fk_alerts_device_id_devices",
            ondelete="CASCADE",
        ),
    )
    op.create_index(
        "ix_alerts_device_id_stream_window_start", "alerts", ["device_id", "stream", "window_start"]
    )
    op.create_table(
        "aggregates",
        sa.Column("pk", _PK, autoincrement=True, nullable=False),
        sa.Column("id", sa.String(160), nullable=False),
        sa.Column("device_id", sa.String(64), nullable=False),
        sa.Column("stream", sa.String(64), nullable=False),
        _ts("interval_start"),
        sa.Column("interval_s", sa.Float(), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.Column("channels", _JSON, nullable=False),
        sa.Column("max_score", sa.Float(), nullable=True),
        sa.Column("windows", sa.BigInteger(), nullable=False),
        sa.Column("alert_count", sa.BigInteger(), nullable=False),
        _ts("received_at"),
        sa.PrimaryKeyConstraint("pk", name="pk_aggregates"),
        sa.UniqueConstraint("id", name="uq_aggregates_id"),
        sa.ForeignKeyConstraint(
            ["device_id"], ["devices.device_id"], name="fk_aggregates_device_id_devices",
            ondelete="CASCADE",
        ),
    )
    op.create_index(
        "ix_aggregates_device_id_stream_interval_start",
        "aggregates",
        ["device_id", "stream", "interval_start"],
    )


def downgrade() -> None:
    op.drop_table("aggregates")
    op.drop_table("alerts")
    op.drop_table("devices")
