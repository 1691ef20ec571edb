"""The ``camera_files`` table (schema version 5): a watched camera folder's files already scored.

One row per stream and file name (relative to the folder, the name's bytes as ``os.fsencode``
gives them: a name that is not UTF-8 is kept exactly), with the file's size and ``st_mtime_ns``
when it was scored. Functions over a connection the :class:`~agent.store.sqlite.Store` holds (its
lock, transaction and error mapping). What the rows mean: :mod:`agent.sources.camera_watch`.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Sequence

_MARK = ("INSERT OR REPLACE INTO camera_files (stream, name, size, mtime_ns, scored_at)"
         " VALUES (?, ?, ?, ?, ?)")
_LOAD = "SELECT name, size, mtime_ns FROM camera_files WHERE stream = ?"
_FORGET = "DELETE FROM camera_files WHERE stream = ? AND name = ?"


def mark(conn: sqlite3.Connection, stream: str, name: str, size: int, mtime_ns: int,
         at: float) -> None:
    """Insert or replace the row of ``(stream, name)``."""
    conn.execute(_MARK, (stream, os.fsencode(name), int(size), int(mtime_ns), float(at)))


def load(conn: sqlite3.Connection, stream: str) -> dict[str, tuple[int, int]]:
    """Every row of ``stream``: name -> ``(size, mtime_ns)``."""
    return {os.fsdecode(bytes(name)): (int(size), int(mtime))
            for name, size, mtime in conn.execute(_LOAD, (stream,))}


def forget(conn: sqlite3.Connection, stream: str, names: Sequence[str]) -> None:
    """Delete the rows of ``names`` (call inside a transaction)."""
    conn.executemany(_FORGET, [(stream, os.fsencode(n)) for n in names])
