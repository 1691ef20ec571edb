"""Fleet operations: device health, webhooks, webhook deliveries; console-query indexes.

Revision ID: 0005
Revises: 0004
Create Date: 2026-01-01

Written out in full (not imported from fleet.db.ops_tables) so that later schema edits never
change what this revision does.

Indexes for the console's queries and for retention by age:

* ``alerts (window_start)``: the fleet-wide alerts timeline and alert retention;
* ``aggregates (interval_start)``: aggregate retention by age;
* on PostgreSQL ``aggregates (device_id, stream, interval_start) INCLUDE (max_score, count,
  alert_count)``: a device's score series is an index-only scan (no heap page per row).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
_PK = sa.Integer().with_variant(sa.BigInteger(), "postgresql")


def _ts(name: str, *, nullable: bool = False) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "device_health",
        sa.Column("device_id", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("summary", _JSON, nullable=False),
        _ts("received_at"),
        _ts("state_since"),
        sa.PrimaryKeyConstraint("device_id", name="pk_device_health"),
        sa.ForeignKeyConstraint(
            ["device_id"], ["devices.device_id"], name="fk_device_health_device_id_devices",
            ondelete="CASCADE",
        ),
    )
    op.create_table(
        "webhooks",
        sa.Column("id", _PK, autoincrement=True, nullable=False),
        sa.Column("url", sa.String(2048), nullable=False),
        sa.Column("events", _JSON, nullable=False),
        sa.Column("secret", sa.String(256), nullable=False),
        _ts("created_at"),
        sa.PrimaryKeyConstraint("id", name="pk_webhooks"),
    )
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", _PK, autoincrement=True, nullable=False),
        sa.Column("webhook_id", _PK, nullable=False),
        sa.Column("event", sa.String(32), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        _ts("next_attempt_at"),
        _ts("lease_until", nullable=True),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.String(512), nullable=True),
        _ts("created_at"),
        _ts("finished_at", nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_webhook_deliveries"),
        sa.ForeignKeyConstraint(
            ["webhook_id"], ["webhooks.id"], name="fk_webhook_deliveries_webhook_id_webhooks",
            ondelete="CASCADE",
        ),
    )
    op.create_index("ix_webhook_deliveries_state_next_attempt_at", "webhook_deliveries",
                    ["state", "next_attempt_at"])
    op.create_index("ix_webhook_deliveries_created_at", "webhook_deliveries", ["created_at"])
    op.create_index("ix_alerts_window_start", "alerts", ["window_start"])
    op.create_index("ix_aggregates_interval_start", "aggregates", ["interval_start"])
    if op.get_bind().dialect.name == "postgresql":
        op.create_index(
            "ix_aggregates_series", "aggregates", ["device_id", "stream", "interval_start"],
            postgresql_include=["max_score", "count", "alert_count"],
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.drop_index("ix_aggregates_series", table_name="aggregates")
    op.drop_index("ix_aggregates_interval_start", table_name="aggregates")
    op.drop_index("ix_alerts_window_start", table_name="alerts")
    op.drop_table("webhook_deliveries")
    op.drop_table("webhooks")
    op.drop_table("device_health")
