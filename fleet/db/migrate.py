"""Schema migrations with alembic, driven programmatically.

Why alembic rather than a hand-rolled version list: the same scripts must run on SQLite and
PostgreSQL, and alembic gives dialect-aware DDL (``batch_alter_table`` for SQLite's limited
``ALTER``), a version table, ``downgrade`` and autogenerate diffs against :mod:`fleet.db.schema`
for future revisions, at the price of one ``env.py``. The scripts live inside the package
(``fleet/db/migrations``) so an installed wheel can migrate without an ``alembic.ini``.

``upgrade`` is idempotent: run at head it does nothing. ``edge-fleet serve`` runs it on start;
on PostgreSQL under an advisory lock, so replicas that start together migrate one at a time
(the later ones find the database at head).
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, text
from sqlalchemy.exc import OperationalError, SQLAlchemyError

from fleet.errors import MigrationError, StorageUnavailable

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
#: ``pg_advisory_xact_lock`` key held while migrating: replicas started at once on a fresh
#: database would otherwise both create ``alembic_version`` (the second fails).
_MIGRATE_LOCK = 0x0F1EE7_0001


def _config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    return cfg


def head_revision() -> str:
    """The newest revision shipped with this package."""
    head = ScriptDirectory.from_config(_config()).get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at (``None`` before the first upgrade)."""
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Migrate the database to ``revision`` in one transaction (a no-op when already there).

    Raises:
        StorageUnavailable: The database cannot be reached.
        MigrationError: A migration failed.
    """
    cfg = _config()
    try:
        with engine.begin() as conn:
            if conn.dialect.name == "postgresql":  # replicas starting together: one migrates
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATE_LOCK})
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
    except OperationalError as exc:
        raise StorageUnavailable(f"database unreachable: {exc.orig}") from exc
    except SQLAlchemyError as exc:
        raise MigrationError(f"migration to {revision} failed: {exc}") from exc


def downgrade(engine: Engine, revision: str) -> None:
    """Migrate the database back to ``revision`` in one transaction (operators and tests; the
    service never downgrades).

    Raises:
        StorageUnavailable: The database cannot be reached.
        MigrationError: A migration failed.
    """
    cfg = _config()
    try:
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, revision)
    except OperationalError as exc:
        raise StorageUnavailable(f"database unreachable: {exc.orig}") from exc
    except SQLAlchemyError as exc:
        raise MigrationError(f"migration to {revision} failed: {exc}") from exc
