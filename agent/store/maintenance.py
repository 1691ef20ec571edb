"""Keeping the SQLite store healthy: integrity check at open, disk budget, WAL size.

Integrity (:func:`open_checked`): every open runs ``PRAGMA quick_check``. A file that fails it,
or is not a database at all, is renamed to ``<name>.corrupt-<UTC timestamp>`` together with its
``-wal`` and ``-shm`` files (kept for forensics, never deleted), and a fresh store is created
in its place. The caller logs one ERROR line and counts ``store_quarantined_total``.

Space reclaim: a new file is created with ``auto_vacuum = INCREMENTAL`` (this must be set before
the first table exists), so deleted pages go back to the file system with
``PRAGMA incremental_vacuum``. A file created before that (``auto_vacuum = NONE``) is converted
once at open with ``VACUUM`` when the file system has room for a copy; otherwise it keeps
``NONE`` and freed pages are reused by later writes instead of being returned (the budget below
counts live pages only, so eviction still stops at the right point).

Full disk: ``<db>-reserve`` (:data:`RESERVE_BYTES` of zeros) is kept next to the database. On
SQLITE_FULL the store deletes it, so the checkpoint and the DELETEs of an eviction step have room
(in WAL mode even a DELETE needs disk), and recreates it at the next maintenance when it fits.

Disk budget: the store's size is its live pages
(``(page_count - freelist_count) * page_size``) plus the ``-wal`` file. Above the budget, rows
are evicted oldest first, one class after the other, until the size is under
``LOW_WATER x budget``:

1. camera alert snapshots (:mod:`agent.store.snapshots`; the largest rows and the least
   needed: the alert they show stays);
2. aggregates already uploaded;
3. aggregates not uploaded yet (oldest intervals first);
4. alerts already published to MQTT and uploaded (or published, when no uploader is configured);
5. every other alert, oldest first (last resort: unacknowledged alerts).

WAL bound (:func:`wal_limit_bytes`): ``min(JOURNAL_SIZE_LIMIT, budget / 8, file system / 16)``,
never below ``MIN_WAL_BYTES``. SQLite's own auto-checkpoint (PASSIVE, on commit) is set to that
many pages, ``journal_size_limit`` truncates the file to it after each checkpoint, and the store
runs ``wal_checkpoint(TRUNCATE)`` whenever the file is past it (also after a failed write), at
least every ``CHECKPOINT_EVERY_S`` and after every eviction step. The bound matters most on a
small or full disk: copying the WAL back into the database needs room for its pages, so a WAL
that filled the disk could never be checkpointed again (nor could a DELETE append to it). The
reserve file (:func:`reserve_bytes`) is at least twice the WAL bound, so releasing it always gives
a checkpoint room to finish.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import math
import os
import shutil
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from agent.store import codes

#: Eviction stops when the store is this fraction of the budget (hysteresis).
LOW_WATER = 0.9
#: SQLite truncates the WAL to this many bytes after a checkpoint.
JOURNAL_SIZE_LIMIT = 4 * 1024 * 1024
#: Longest time between two ``wal_checkpoint(TRUNCATE)``, seconds.
CHECKPOINT_EVERY_S = 30.0
#: Smallest number of rows deleted per eviction step.
MIN_EVICT_ROWS = 64

#: Bytes kept in ``<db>-reserve``: released on a full disk so eviction itself has room to run
#: (at least; see :func:`reserve_bytes`).
RESERVE_BYTES = 256 * 1024
#: Smallest WAL bound, bytes (16 pages of 4 KiB).
MIN_WAL_BYTES = 64 * 1024

_CORRUPT_CODES = (codes.SQLITE_CORRUPT, codes.SQLITE_NOTADB)


@dataclass(frozen=True, slots=True)
class EvictionClass:
    """One eviction priority: which rows of which table go first."""

    kind: str  # metric label: "snapshot" | "aggregate" | "alert"
    table: str
    where: str


def eviction_classes(uploads: bool) -> tuple[EvictionClass, ...]:
    """The eviction order (see the module docstring).

    Args:
        uploads: An uploader is configured (alerts must also be uploaded before they count as
            done).
    """
    done = "published_at IS NOT NULL" + (" AND uploaded_at IS NOT NULL" if uploads else "")
    return (
        EvictionClass("snapshot", "snapshots", "1 = 1"),
        EvictionClass("aggregate", "aggregates", "uploaded_at IS NOT NULL"),
        EvictionClass("aggregate", "aggregates", "uploaded_at IS NULL"),
        EvictionClass("alert", "alerts", done),
        EvictionClass("alert", "alerts", "1 = 1"),
    )


def is_corruption(exc: sqlite3.Error) -> bool:
    """True for "database disk image is malformed" and "file is not a database"."""
    if codes.primary_code(exc) in _CORRUPT_CODES:
        return True
    text = str(exc).lower()
    return "not a database" in text or "malformed" in text


def is_disk_full(exc: BaseException) -> bool:
    """True when ``exc`` (or its cause) is SQLITE_FULL."""
    cause = exc if isinstance(exc, sqlite3.Error) else exc.__cause__
    return codes.primary_code(cause) == codes.SQLITE_FULL


def quick_check(conn: sqlite3.Connection) -> str | None:
    """Run ``PRAGMA quick_check``; return None when healthy, else the first problem.

    Raises:
        sqlite3.DatabaseError: The file is not a database (SQLITE_NOTADB) or unreadable.
    """
    rows = conn.execute("PRAGMA quick_check").fetchall()
    if len(rows) == 1 and rows[0][0] == "ok":
        return None
    return "; ".join(str(r[0]) for r in rows[:3])


def quarantine(path: str, now: float) -> str:
    """Rename a corrupt database and its ``-wal``/``-shm`` files out of the way.

    Args:
        path: The database file.
        now: Wall clock, epoch seconds UTC (names the quarantine files).

    Returns:
        The new name of the database file.

    Raises:
        OSError: A rename failed.
    """
    stamp = dt.datetime.fromtimestamp(now, tz=dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    target = f"{path}.corrupt-{stamp}"
    n = 1
    while os.path.exists(target):
        n += 1
        target = f"{path}.corrupt-{stamp}-{n}"
    for suffix in ("-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.replace(path + suffix, target + suffix)
    if os.path.exists(path):
        os.replace(path, target)
    return target


def prepare_new_file(conn: sqlite3.Connection) -> None:
    """On a database without tables, switch on incremental auto-vacuum (before the first table)."""
    has_tables = conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0]
    if not has_tables:
        conn.execute("PRAGMA auto_vacuum = INCREMENTAL")


def ensure_incremental_vacuum(conn: sqlite3.Connection, path: str) -> bool:
    """Convert an existing file to ``auto_vacuum = INCREMENTAL`` with one ``VACUUM``.

    Only when the file system has room for a full copy (VACUUM writes one).

    Returns:
        True when the file now uses incremental auto-vacuum.

    Raises:
        sqlite3.Error: VACUUM failed (the file is unchanged).
    """
    mode = int(conn.execute("PRAGMA auto_vacuum").fetchone()[0])
    if mode == 2:
        return True
    if path == ":memory:":
        return False
    size = os.path.getsize(path) if os.path.exists(path) else 0
    free = shutil.disk_usage(Path(path).parent).free
    if free < 2 * size + 1024 * 1024:
        return False
    conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
    conn.execute("VACUUM")
    return int(conn.execute("PRAGMA auto_vacuum").fetchone()[0]) == 2


def wal_limit_bytes(path: str, budget: int | None) -> int:
    """The WAL bound for a store at ``path`` (see the module docstring), bytes.

    ``min(JOURNAL_SIZE_LIMIT, budget / 8, file system size / 16)``, at least ``MIN_WAL_BYTES``.
    """
    limit = JOURNAL_SIZE_LIMIT
    if budget is not None:
        limit = min(limit, budget // 8)
    if path != ":memory:":
        with contextlib.suppress(OSError):
            limit = min(limit, shutil.disk_usage(Path(path).parent).total // 16)
    return max(MIN_WAL_BYTES, limit)


def reserve_bytes(wal_limit: int) -> int:
    """Size of the ``<db>-reserve`` file: room for a checkpoint of a WAL past its bound.

    >>> reserve_bytes(64 * 1024) == RESERVE_BYTES
    True
    >>> reserve_bytes(4 * 1024 * 1024)
    8388608
    """
    return max(RESERVE_BYTES, 2 * wal_limit)


def ensure_reserve(path: str, size: int = RESERVE_BYTES) -> bool:
    """Create the ``<db>-reserve`` file of ``size`` bytes if missing; True when present."""
    if path == ":memory:":
        return False
    reserve = path + "-reserve"
    try:
        if os.path.getsize(reserve) >= size:
            return True
    except OSError:
        pass
    try:
        with open(reserve, "wb") as f:
            f.write(b"\0" * size)
            f.flush()
            os.fsync(f.fileno())
    except OSError:
        with contextlib.suppress(OSError):
            os.remove(reserve)
        return False
    return True


def release_reserve(path: str) -> bool:
    """Delete the ``<db>-reserve`` file; True when it existed."""
    try:
        os.remove(path + "-reserve")
    except OSError:
        return False
    return True


def free_bytes(path: str) -> int:
    """Bytes free on the file system of ``path`` (0 when unknown)."""
    try:
        return shutil.disk_usage(Path(path).parent).free
    except OSError:
        return 0


def wal_bytes(path: str) -> int:
    """Size of the ``-wal`` file in bytes (0 when absent)."""
    try:
        return os.path.getsize(path + "-wal")
    except OSError:
        return 0


def store_bytes(conn: sqlite3.Connection, path: str) -> int:
    """Live bytes of the store: ``(page_count - freelist_count) * page_size`` plus the WAL."""
    pages = int(conn.execute("PRAGMA page_count").fetchone()[0])
    free = int(conn.execute("PRAGMA freelist_count").fetchone()[0])
    size = int(conn.execute("PRAGMA page_size").fetchone()[0])
    return (pages - free) * size + wal_bytes(path)


def rows_to_evict(
    over_bytes: int, used_bytes: int, total_rows: int, wal_limit: int | None = None
) -> int:
    """How many rows to delete in one step to shed ``over_bytes`` (an estimate, >= 1).

    At least :data:`MIN_EVICT_ROWS`, and, with ``wal_limit``, no more rows than fill a quarter
    of the WAL bound: the DELETE of one step is one transaction, and all of its pages go to the
    WAL before any checkpoint can run, so an unbounded step would carry the WAL past its bound.

    >>> rows_to_evict(1000, 100_000, 1000)
    64
    >>> rows_to_evict(50_000, 100_000, 1000)
    550
    >>> rows_to_evict(50_000, 100_000, 1000, wal_limit=64 * 1024)
    163
    """
    per_row = used_bytes / max(1, total_rows)
    rows = max(MIN_EVICT_ROWS, math.ceil(over_bytes / max(1.0, per_row) * 1.1))
    if wal_limit is not None:
        rows = min(rows, max(1, int(wal_limit / 4 / max(1.0, per_row))))
    return rows


def evict(conn: sqlite3.Connection, cls: EvictionClass, limit: int) -> int:
    """Delete up to ``limit`` rows of ``cls``, oldest first, in one transaction; return the count.

    Raises:
        sqlite3.Error: The delete failed (rolled back).
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        cur = conn.execute(
            f"DELETE FROM {cls.table} WHERE id IN "  # noqa: S608 - fixed names, not input
            f"(SELECT id FROM {cls.table} WHERE {cls.where} ORDER BY id LIMIT ?)",
            (limit,),
        )
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return max(0, cur.rowcount)


def reclaim(conn: sqlite3.Connection, wal_limit: int | None = None) -> None:
    """Return free pages to the file system and truncate the WAL (best effort on busy).

    With ``wal_limit`` (bytes), pages are returned in steps of at most a quarter of the WAL
    bound, each followed by a ``wal_checkpoint(TRUNCATE)``: ``incremental_vacuum`` moves pages
    from the end of the file into the free slots, and every moved page is a WAL frame.

    Raises:
        sqlite3.Error: A statement failed.
    """
    if wal_limit is None:
        # executescript steps the pragma to completion; execute() would free one page per call.
        conn.executescript("PRAGMA incremental_vacuum;")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        return
    page = int(conn.execute("PRAGMA page_size").fetchone()[0])
    step = max(1, wal_limit // 4 // max(1, page))
    free = int(conn.execute("PRAGMA freelist_count").fetchone()[0])
    while True:
        conn.executescript(f"PRAGMA incremental_vacuum({step:d});")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        left = int(conn.execute("PRAGMA freelist_count").fetchone()[0])
        if left == 0 or left >= free:  # done, or nothing more to return (auto_vacuum NONE)
            return
        free = left
