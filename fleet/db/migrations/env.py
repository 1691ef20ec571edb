"""Alembic environment: always runs on the connection :func:`fleet.db.migrate.upgrade` passes."""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from fleet.db.schema import metadata

connection = context.config.attributes.get("connection")
if not isinstance(connection, Connection):
    raise RuntimeError("run migrations through fleet.db.migrate.upgrade (edge-fleet db upgrade)")
context.configure(
    connection=connection,
    target_metadata=metadata,
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
