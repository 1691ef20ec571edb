"""Storage: schema (SQLAlchemy Core), engines, migrations (alembic), repositories."""
