"""Model registry and rollouts: models, rollouts, rollout_devices, model_status_reports.

Revision ID: 0002
Revises: 0001
Create Date: 2025-02-01

Written out in full (not imported from fleet.db.model_tables) so that later schema edits never
change what this revision does.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
_PK = sa.Integer().with_variant(sa.BigInteger(), "postgresql")


def _ts(name: str, *, nullable: bool = False) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "models",
        sa.Column("pk", _PK, autoincrement=True, nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("archive", sa.LargeBinary(), nullable=False),
        sa.Column("archive_sha256", sa.String(64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("manifest", _JSON, nullable=False),
        sa.Column("key_id", sa.String(64), nullable=False),
        _ts("uploaded_at"),
        sa.Column("uploaded_by", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("pk", name="pk_models"),
        sa.UniqueConstraint("name", "version", name="uq_models_name"),
    )
    op.create_table(
        "rollouts",
        sa.Column("id", _PK, autoincrement=True, nullable=False),
        sa.Column("model_name", sa.String(64), nullable=False),
        sa.Column("model_version", sa.BigInteger(), nullable=False),
        sa.Column("target_tag", sa.String(64), nullable=True),
        sa.Column("target_devices", _JSON, nullable=False),
        sa.Column("stream", sa.String(64), nullable=True),
        sa.Column("canary_percent", sa.Float(), nullable=True),
        sa.Column("halt_after_failures", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("resume_state", sa.String(16), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        _ts("created_at"),
        _ts("updated_at"),
        sa.PrimaryKeyConstraint("id", name="pk_rollouts"),
        sa.ForeignKeyConstraint(
            ["model_name", "model_version"], ["models.name", "models.version"],
            name="fk_rollouts_model_name_models",
        ),
    )
    op.create_index("ix_rollouts_state", "rollouts", ["state"])
    op.create_table(
        "rollout_devices",
        sa.Column("rollout_id", _PK, nullable=False),
        sa.Column("device_id", sa.String(64), nullable=False),
        sa.Column("canary", sa.Boolean(), nullable=False),
        sa.Column("assigned", sa.Boolean(), nullable=False),
        sa.Column("previous_version", sa.BigInteger(), nullable=True),
        sa.Column("state", sa.String(16), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        _ts("reported_at", nullable=True),
        _ts("updated_at"),
        sa.PrimaryKeyConstraint("rollout_id", "device_id", name="pk_rollout_devices"),
        sa.ForeignKeyConstraint(
            ["rollout_id"], ["rollouts.id"], name="fk_rollout_devices_rollout_id_rollouts",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["device_id"], ["devices.device_id"], name="fk_rollout_devices_device_id_devices",
            ondelete="CASCADE",
        ),
    )
    op.create_index("ix_rollout_devices_device_id", "rollout_devices", ["device_id"])
    op.create_table(
        "model_status_reports",
        sa.Column("pk", _PK, autoincrement=True, nullable=False),
        sa.Column("device_id", sa.String(64), nullable=False),
        sa.Column("rollout_id", sa.BigInteger(), nullable=True),
        sa.Column("stream", sa.String(64), nullable=True),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("details", _JSON, nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        _ts("received_at"),
        sa.PrimaryKeyConstraint("pk", name="pk_model_status_reports"),
        sa.ForeignKeyConstraint(
            ["device_id"], ["devices.device_id"],
            name="fk_model_status_reports_device_id_devices", ondelete="CASCADE",
        ),
    )
    op.create_index(
        "ix_model_status_reports_device_id_received_at",
        "model_status_reports",
        ["device_id", "received_at"],
    )


def downgrade() -> None:
    op.drop_table("model_status_reports")
    op.drop_table("rollout_devices")
    op.drop_table("rollouts")
    op.drop_table("models")
