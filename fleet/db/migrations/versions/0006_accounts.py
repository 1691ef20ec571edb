"""Operator accounts and the console: users, sessions, api_tokens, audit_log, login_failures,
alert_acks.

Revision ID: 0006
Revises: 0005
Create Date: 2025-03-01

Written out in full (not imported from fleet.db.account_tables) so that later schema edits never
change what this revision does.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
_PK = sa.Integer().with_variant(sa.BigInteger(), "postgresql")


def _ts(name: str, *, nullable: bool = False) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def _user_fk(table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        ["username"], ["users.username"], name=f"fk_{table}_username_users", ondelete="CASCADE"
    )


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("username", sa.String(64), nullable=False),
        sa.Column("password_hash", sa.String(256), nullable=True),
        sa.Column("role", sa.String(16), nullable=False),
        _ts("created_at"),
        _ts("disabled_at", nullable=True),
        sa.PrimaryKeyConstraint("username", name="pk_users"),
    )
    op.create_table(
        "sessions",
        sa.Column("id_hash", sa.String(64), nullable=False),
        sa.Column("username", sa.String(64), nullable=False),
        sa.Column("csrf_token", sa.String(64), nullable=False),
        _ts("created_at"),
        _ts("expires_at"),
        sa.Column("address", sa.String(64), nullable=True),
        sa.PrimaryKeyConstraint("id_hash", name="pk_sessions"),
        _user_fk("sessions"),
    )
    op.create_index("ix_sessions_username", "sessions", ["username"])
    op.create_index("ix_sessions_expires_at", "sessions", ["expires_at"])
    op.create_table(
        "api_tokens",
        sa.Column("id", _PK, autoincrement=True, nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("username", sa.String(64), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("label", sa.String(64), nullable=False),
        _ts("created_at"),
        _ts("last_used_at", nullable=True),
        _ts("revoked_at", nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_api_tokens"),
        sa.UniqueConstraint("token_hash", name="uq_api_tokens_token_hash"),
        _user_fk("api_tokens"),
    )
    op.create_index("ix_api_tokens_username", "api_tokens", ["username"])
    op.create_table(
        "audit_log",
        sa.Column("id", _PK, autoincrement=True, nullable=False),
        _ts("at"),
        sa.Column("actor", sa.String(64), nullable=False),
        sa.Column("via", sa.String(16), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("target", sa.String(200), nullable=True),
        sa.Column("address", sa.String(64), nullable=True),
        sa.Column("detail", _JSON, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_audit_log"),
    )
    op.create_index("ix_audit_log_at", "audit_log", ["at"])
    op.create_index("ix_audit_log_actor_at", "audit_log", ["actor", "at"])
    op.create_table(
        "login_failures",
        sa.Column("username", sa.String(64), nullable=False),
        sa.Column("address", sa.String(64), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        _ts("last_failure_at"),
        sa.PrimaryKeyConstraint("username", "address", name="pk_login_failures"),
    )
    op.create_table(
        "alert_acks",
        sa.Column("alert_id", sa.String(160), nullable=False),
        sa.Column("acked_by", sa.String(64), nullable=False),
        _ts("acked_at"),
        sa.Column("note", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("alert_id", name="pk_alert_acks"),
        sa.ForeignKeyConstraint(
            ["alert_id"], ["alerts.id"], name="fk_alert_acks_alert_id_alerts", ondelete="CASCADE"
        ),
    )


def downgrade() -> None:
    for table in ("alert_acks", "login_failures", "audit_log", "api_tokens", "sessions",
                  "users"):
        op.drop_table(table)
