"""Alembic migration scripts (loaded by path by alembic, not imported)."""
