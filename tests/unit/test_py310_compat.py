"""What Python 3.10 lacks and the agent and fleet use: ISO 8601 parsing and SQLite result codes.

Both paths are run on every interpreter: the 3.10 rewrite of RFC 3339 forms
(``cloud_sync.isotime._rewrite``) and the message fallback of the SQLite codes.
"""

from __future__ import annotations

import datetime as dt
import sqlite3
from pathlib import Path

import pytest

from agent.sources.replay import parse_timestamp
from agent.store import codes
from agent.store import maintenance as mt
from cloud_sync.isotime import _rewrite, fromisoformat

UTC = dt.timezone.utc


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("2024-03-09T11:14:33Z", dt.datetime(2024, 3, 9, 11, 14, 33, tzinfo=UTC)),
        ("2024-03-09T11:14:33.5Z", dt.datetime(2024, 3, 9, 11, 14, 33, 500000, tzinfo=UTC)),
        ("2024-03-09 11:14:33.123456789+0100",
         dt.datetime(2024, 3, 9, 11, 14, 33, 123456, tzinfo=dt.timezone(dt.timedelta(hours=1)))),
        ("2024-03-09T11:14:33,25-05",
         dt.datetime(2024, 3, 9, 11, 14, 33, 250000, tzinfo=dt.timezone(dt.timedelta(hours=-5)))),
        ("2024-03-09T11:14", dt.datetime(2024, 3, 9, 11, 14)),
        ("2024-03-09", dt.datetime(2024, 3, 9)),
    ],
)
def test_rfc3339_forms_parse_the_same_on_every_python(text: str, want: dt.datetime) -> None:
    assert fromisoformat(text) == want
    # the 3.10 path: what it hands to fromisoformat is in the subset 3.10 reads
    rewritten = _rewrite(text)
    assert dt.datetime.fromisoformat(rewritten) == want
    assert "Z" not in rewritten


@pytest.mark.parametrize(
    "text", ["", "yesterday", "2024-13-01T00:00:00Z", "12:00", "2024-03-09T11:14:33z"]
)
def test_not_a_timestamp_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        fromisoformat(text)


def test_replay_reads_a_z_timestamp() -> None:
    assert parse_timestamp("2020-03-09T10:14:33Z") == 1583748873.0


def test_sqlite_codes_from_the_error_or_its_message(tmp_path: Path) -> None:
    path = tmp_path / "ro.db"
    sqlite3.connect(path).execute("CREATE TABLE t (x)").connection.commit()
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    with pytest.raises(sqlite3.OperationalError) as info:
        conn.execute("INSERT INTO t VALUES (1)")
    conn.close()
    assert codes.primary_code(info.value) == codes.SQLITE_READONLY  # a real error
    # the Python 3.10 path: no sqlite_errorcode, the code read from SQLite's message
    assert codes.primary_code(sqlite3.OperationalError("database or disk is full")) == 13
    assert codes.primary_code(sqlite3.OperationalError("database is locked")) == 5
    assert codes.primary_code(sqlite3.DatabaseError("file is not a database")) == 26
    assert codes.primary_code(sqlite3.OperationalError("no such table: x")) is None
    assert codes.primary_code(OSError("database or disk is full")) is None


def test_disk_full_and_corruption_are_recognised_without_sqlite_errorcode() -> None:
    full = sqlite3.OperationalError("database or disk is full")
    assert mt.is_disk_full(full)
    assert mt.is_corruption(sqlite3.DatabaseError("database disk image is malformed"))
    assert not mt.is_disk_full(sqlite3.OperationalError("database is locked"))


def test_the_constants_are_sqlites() -> None:
    """Python 3.11 names them too: the values must agree."""
    for name in ("SQLITE_PERM", "SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_READONLY",
                 "SQLITE_IOERR", "SQLITE_CORRUPT", "SQLITE_FULL", "SQLITE_CANTOPEN",
                 "SQLITE_NOTADB"):
        if hasattr(sqlite3, name):
            assert getattr(codes, name) == getattr(sqlite3, name), name
