"""SQLite result codes of a :class:`sqlite3.Error`, on Python 3.10 as on 3.11+.

Python 3.11 gives every :class:`sqlite3.Error` its extended result code
(``sqlite_errorcode``) and names the codes as module constants (``sqlite3.SQLITE_FULL`` ...).
Python 3.10 has neither, so :func:`primary_code` reads the code from the message SQLite
writes for it (``sqlite3_errstr()`` of the primary code, which ``sqlite3_errmsg()`` returns
for these errors), and the constants are defined here with SQLite's own values
(https://www.sqlite.org/rescode.html; they are part of SQLite's stable C API).
"""

from __future__ import annotations

import sqlite3

#: Primary result codes (sqlite3.h).
SQLITE_PERM = 3
SQLITE_BUSY = 5
SQLITE_LOCKED = 6
SQLITE_READONLY = 8
SQLITE_IOERR = 10
SQLITE_CORRUPT = 11
SQLITE_FULL = 13
SQLITE_CANTOPEN = 14
SQLITE_NOTADB = 26

#: ``sqlite3_errstr()`` of each primary code (SQLite's ``sqlite3ErrStr`` table), lower case;
#: the Python 3.10 fallback of :func:`primary_code`.
_MESSAGES: tuple[tuple[str, int], ...] = (
    ("database or disk is full", SQLITE_FULL),
    ("database is locked", SQLITE_BUSY),
    ("database table is locked", SQLITE_LOCKED),
    ("disk i/o error", SQLITE_IOERR),
    ("attempt to write a readonly database", SQLITE_READONLY),
    ("unable to open database file", SQLITE_CANTOPEN),
    ("access permission denied", SQLITE_PERM),
    ("database disk image is malformed", SQLITE_CORRUPT),
    ("file is not a database", SQLITE_NOTADB),
)


def primary_code(exc: BaseException | None) -> int | None:
    """The primary SQLite result code of ``exc`` (its extended code ``& 0xFF``), or None.

    Args:
        exc: Any exception; only a :class:`sqlite3.Error` has a code.

    Returns:
        ``sqlite_errorcode & 0xFF`` on Python 3.11+; on 3.10 the code whose SQLite message
        the error's text contains; None for other exceptions or an unknown text.

    >>> primary_code(sqlite3.OperationalError("database or disk is full")) == SQLITE_FULL
    True
    >>> primary_code(ValueError("database or disk is full")) is None
    True
    """
    if not isinstance(exc, sqlite3.Error):
        return None
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF
    text = str(exc).lower()
    return next((c for msg, c in _MESSAGES if msg in text), None)
