"""Retraining samples uploaded by devices: samples.

Revision ID: 0003
Revises: 0002
Create Date: 2025-02-15

Written out in full (not imported from fleet.db.sample_tables) so that later schema edits never
change what this revision does.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
_PK = sa.Integer().with_variant(sa.BigInteger(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "samples",
        sa.Column("pk", _PK, autoincrement=True, nullable=False),
        sa.Column("device_id", sa.String(64), nullable=False),
        sa.Column("stream", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("channels", _JSON, nullable=False),
        sa.Column("model_name", sa.String(64), nullable=True),
        sa.Column("model_version", sa.BigInteger(), nullable=True),
        sa.Column("config_hash", sa.String(128), nullable=False),
        sa.Column("sample_rate_hz", sa.Float(), nullable=True),
        sa.Column("shape", _JSON, nullable=False),
        sa.Column("windows", _JSON, nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("pk", name="pk_samples"),
        sa.ForeignKeyConstraint(
            ["device_id"], ["devices.device_id"], name="fk_samples_device_id_devices",
            ondelete="CASCADE",
        ),
    )
    op.create_index(
        "ix_samples_device_id_stream_kind_received_at",
        "samples",
        ["device_id", "stream", "kind", "received_at"],
    )


def downgrade() -> None:
    op.drop_table("samples")
