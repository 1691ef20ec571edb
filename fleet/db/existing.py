"""Refuse to open a fleet database that is not there, instead of creating an empty one.

The ``edge-fleet`` commands that work on the database (``device``, ``user``, ``token``,
``webhook``, ``jobs``, ``worker``, ``retrain``, ``audit``, ``db upgrade``) open it by ``--db`` or
``--state-dir``. SQLite creates a missing file on first connect, and the migrations would then
turn it into a fresh, empty fleet: a typo in the path made a second fleet, with the device just
enrolled in it and not in the one the server runs. These commands call :func:`check_path` before
they connect and :func:`check_schema` after, and go on only with ``--create-db`` (which creates and
migrates the database). ``edge-fleet serve`` creates and migrates as before.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError

from fleet.errors import ConfigError, StorageUnavailable
from fleet.settings import parse_db_url

#: What every refusal ends with: how to go on.
_HINT = ("check --db / --state-dir (or $EDGE_FLEET_DB), or give --create-db to create a new "
         "fleet database there")


class MissingDatabase(ConfigError):
    """The fleet database named is missing, an empty file or holds no fleet schema (exit 78)."""


def sqlite_path(db_url: str) -> Path | None:
    """The file a ``sqlite:///`` URL names (``~`` expanded); ``None`` for in-memory SQLite and
    for other databases.

    >>> sqlite_path("sqlite:///state/fleet.db"), sqlite_path("sqlite://")
    (PosixPath('state/fleet.db'), None)
    >>> sqlite_path("postgresql://u@h/fleet") is None
    True

    Raises:
        ConfigError: The URL is invalid (:func:`fleet.settings.parse_db_url`).
    """
    url = parse_db_url(db_url)
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return None
    return Path(url.database).expanduser()


def check_path(db_url: str, *, create: bool) -> None:
    """Before connecting: a SQLite database must be an existing, non-empty file.

    Args:
        db_url: The SQLAlchemy URL the command would open.
        create: ``--create-db`` was given: anything goes (the file is created and migrated).

    Raises:
        MissingDatabase: The file does not exist, or is empty (0 bytes), and not ``create``.
        ConfigError: The URL is invalid.
    """
    path = sqlite_path(db_url)
    if create or path is None:
        return
    if not path.exists():
        raise MissingDatabase(f"no fleet database at {path}: {_HINT}")
    if path.is_file() and path.stat().st_size == 0:
        raise MissingDatabase(f"{path} is an empty file, not a fleet database: {_HINT}")


def check_schema(engine: Engine, *, create: bool) -> None:
    """After connecting: the database must hold the fleet's schema (any migration revision; an
    older one is migrated by the caller). Catches an empty PostgreSQL database and a SQLite file
    of something else (an agent's ``agent.db``).

    Raises:
        MissingDatabase: No fleet schema (no ``alembic_version`` revision), and not ``create``.
        StorageUnavailable: The database cannot be reached.
    """
    if create:
        return
    from fleet.db.migrate import current_revision  # noqa: PLC0415 (alembic: CLI only)

    try:
        revision = current_revision(engine)
    except OperationalError as exc:
        raise StorageUnavailable(f"database unreachable: {exc.orig}") from exc
    if revision is None:
        where = sqlite_path(str(engine.url)) or engine.url.render_as_string(hide_password=True)
        raise MissingDatabase(f"{where} holds no fleet database (no fleet schema): {_HINT}")
