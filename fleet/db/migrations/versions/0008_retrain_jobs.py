"""Retraining jobs: the queue ``edge-fleet worker`` processes claim from.

Revision ID: 0008
Revises: 0007
Create Date: 2026-01-03

Written out in full (not imported from fleet.db.job_tables) so that later schema edits never
change what this revision does. ``uq_retrain_jobs_pending`` is a partial unique index (SQLite
and PostgreSQL both have them): at most one queued or running job per device stream.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_PK = sa.Integer().with_variant(sa.BigInteger(), "postgresql")
_PENDING = sa.text("state IN ('queued', 'running')")


def _ts(name: str, *, nullable: bool = False) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "retrain_jobs",
        sa.Column("id", _PK, autoincrement=True, nullable=False),
        sa.Column("device_id", sa.String(64), nullable=False),
        sa.Column("stream", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("requested_by", sa.String(64), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("time_limit_s", sa.Float(), nullable=False),
        _ts("run_after"),
        sa.Column("lease_owner", sa.String(128), nullable=True),
        _ts("lease_until", nullable=True),
        sa.Column("progress", sa.String(200), nullable=True),
        sa.Column("progress_fraction", sa.Float(), nullable=True),
        sa.Column("result_name", sa.String(64), nullable=True),
        sa.Column("result_version", sa.BigInteger(), nullable=True),
        sa.Column("rollout_id", sa.BigInteger(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        _ts("created_at"),
        _ts("started_at", nullable=True),
        _ts("updated_at"),
        _ts("finished_at", nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_retrain_jobs"),
        sa.ForeignKeyConstraint(
            ["device_id"], ["devices.device_id"], name="fk_retrain_jobs_device_id_devices",
            ondelete="CASCADE",
        ),
    )
    op.create_index("ix_retrain_jobs_state_run_after", "retrain_jobs", ["state", "run_after"])
    op.create_index("uq_retrain_jobs_pending", "retrain_jobs", ["device_id", "stream"],
                    unique=True, postgresql_where=_PENDING, sqlite_where=_PENDING)


def downgrade() -> None:
    op.drop_index("uq_retrain_jobs_pending", table_name="retrain_jobs")
    op.drop_index("ix_retrain_jobs_state_run_after", table_name="retrain_jobs")
    op.drop_table("retrain_jobs")
