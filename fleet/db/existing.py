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

import contextlib
import sqlite3
from pathlib import Path

from sqlalchemy import Engine, inspect
from sqlalchemy.exc import DatabaseError, OperationalError

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


#: The first 16 bytes of every SQLite 3 database file (https://www.sqlite.org/fileformat.html,
#: 1.3 "The Database Header").
SQLITE_HEADER = b"SQLite format 3\x00"


def check_path(db_url: str, *, create: bool) -> None:
    """Before connecting: a SQLite database must be an existing, non-empty SQLite file; with
    ``create`` it may also be missing or empty, but an existing path must still be a readable
    SQLite file or an empty file (``--create-db`` never writes into something else).

    Args:
        db_url: The SQLAlchemy URL the command would open.
        create: ``--create-db`` was given: a missing or empty file is created and migrated.

    Raises:
        MissingDatabase: The file does not exist, or is empty (0 bytes), and not ``create``.
        ConfigError: The path is a directory or another non-file, cannot be read (or its
            folder cannot be searched), or is not a SQLite database; the URL is invalid.
    """
    path = sqlite_path(db_url)
    if path is None:
        return
    try:
        if not path.exists():
            if create:
                return
            raise MissingDatabase(f"no fleet database at {path}: {_HINT}")
        if not path.is_file():
            raise ConfigError(f"{path} is not a file (a fleet database is one SQLite file)")
        with path.open("rb") as f:
            head = f.read(len(SQLITE_HEADER))
    except OSError as exc:
        raise ConfigError(f"cannot read the fleet database {path}: {exc.strerror}") from None
    if not head:
        if not create:
            raise MissingDatabase(f"{path} is an empty file, not a fleet database: {_HINT}")
        return
    if head != SQLITE_HEADER:
        raise ConfigError(f"{path} is not a SQLite database (and so not a fleet database); "
                          "check --db / --state-dir (or $EDGE_FLEET_DB)")
    # read-only: the fleet's engine sets WAL mode when it connects, a write into the file
    try:
        with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro",
                                                uri=True)) as conn:
            tables = [r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")]
    except sqlite3.Error as exc:
        raise ConfigError(f"cannot read the fleet database {path}: {exc}") from None
    if "alembic_version" not in tables:
        _refuse_schemaless(str(path), tables, create=create)


def _refuse_schemaless(where: str, tables: list[str], *, create: bool) -> None:
    """A database without the fleet's schema: refused when it holds other tables (even with
    ``create``: the migrations would write into another program's database), or when empty and
    not ``create``."""
    if tables:
        raise ConfigError(
            f"{where} holds no fleet database (no fleet schema): it holds tables of something "
            f"else ({', '.join(sorted(tables)[:5])}) and is not touched; give --db / --state-dir "
            "a fleet database or a new path")
    if not create:
        raise MissingDatabase(f"{where} holds no fleet database (no fleet schema): {_HINT}")


def check_schema(engine: Engine, *, create: bool) -> None:
    """After connecting: the database must hold the fleet's schema (any migration revision; an
    older one is migrated by the caller). Catches an empty PostgreSQL database and a SQLite file
    of something else (an agent's ``agent.db``). With ``create`` an empty database is accepted,
    but never one that holds another program's tables (the migrations would write into it).

    Raises:
        MissingDatabase: No fleet schema (no ``alembic_version`` revision), and not ``create``.
        ConfigError: No fleet schema, ``create``, and the database holds other tables.
        StorageUnavailable: The database cannot be reached.
    """
    from fleet.db.migrate import current_revision  # noqa: PLC0415 (alembic: CLI only)

    try:
        revision = current_revision(engine)
        foreign = [] if revision is not None else inspect(engine).get_table_names()
    except (OperationalError, DatabaseError) as exc:
        raise StorageUnavailable(f"database unreachable: {exc.orig}") from exc
    if revision is not None:
        return
    where = sqlite_path(str(engine.url)) or engine.url.render_as_string(hide_password=True)
    _refuse_schemaless(str(where), foreign, create=create)
