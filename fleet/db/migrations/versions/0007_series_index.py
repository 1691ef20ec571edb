"""The console's series index covers the columns the console plots.

Revision ID: 0007
Revises: 0006
Create Date: 2026-01-02

On PostgreSQL ``ix_aggregates_series`` becomes ``aggregates (device_id, stream,
interval_start) INCLUDE (max_score, windows, alert_count)``: the columns of
``GET /v1/devices/{id}/series`` (``fleet.db.console_queries.ConsoleQueries.series``), so a
device's plot is an index-only scan (0005 included ``count``, which the console does not read).
SQLite keeps the plain ``(device_id, stream, interval_start)`` index of 0001.
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_KEY = ["device_id", "stream", "interval_start"]


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.drop_index("ix_aggregates_series", table_name="aggregates")
        op.create_index("ix_aggregates_series", "aggregates", _KEY,
                        postgresql_include=["max_score", "windows", "alert_count"])


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.drop_index("ix_aggregates_series", table_name="aggregates")
        op.create_index("ix_aggregates_series", "aggregates", _KEY,
                        postgresql_include=["max_score", "count", "alert_count"])
