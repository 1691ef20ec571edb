"""Camera alert snapshots in the store (table ``snapshots``, schema version 6).

One row per camera alert that got a snapshot: ``alert_id`` (the alert it shows, UNIQUE),
``stream``, ``created_at`` (epoch s), ``meta`` (JSON: ``width``/``height`` of the JPEG in pixels,
the alert's ``score`` and ``threshold``, and for the heatmap its colour ``scale_min``/``scale_max``
and ``patch_max`` in score units), ``jpeg`` (the frame), ``heatmap`` (the overlay PNG, NULL when
the model's patch map was not available), then the delivery state:

* ``mqtt_state``: NULL = not published yet; ``published`` (written to the broker connection,
  ``published_at`` set); ``superseded`` (a newer snapshot of the stream came first: the retained
  topic only holds the latest); ``oversize`` (over the broker's message limit: kept here, never
  retried); ``failed`` (three attempts lost with their connection);
* ``upload_state``: NULL = not uploaded yet; ``uploaded`` (``uploaded_at`` set); ``refused: <why>``
  (the fleet said no: an older fleet without the snapshot routes, or it refused the bytes; kept
  here, never retried).

Why in SQLite rather than files beside it: one byte budget counts everything (the live pages
include the BLOBs), eviction is one ``DELETE`` in the same order machinery as the other rows, and
there is no index to drift from files (no orphan file after a crash between the two writes, no
dangling row after one). Snapshots are tens of kilobytes (the max edge bounds them), the size
SQLite stores as BLOBs as fast as the file system ("Internal Versus External BLOBs in SQLite",
sqlite.org/intern-v-extern-blob.html). The row is written in its own transaction after the alert
is stored (not fsynced on its own): a crash may lose a snapshot, never the alert.

Functions take an open connection; :class:`agent.store.sqlite.Store` holds the lock.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MIGRATION: tuple[str, ...] = (
    """
    CREATE TABLE snapshots (
        id           INTEGER PRIMARY KEY AUTOINCREMENT,
        alert_id     TEXT    NOT NULL UNIQUE,
        stream       TEXT    NOT NULL,
        created_at   REAL    NOT NULL,
        meta         TEXT    NOT NULL,
        jpeg         BLOB    NOT NULL,
        heatmap      BLOB,
        mqtt_state   TEXT,
        published_at REAL,
        upload_state TEXT,
        uploaded_at  REAL
    )
    """,
    "CREATE INDEX snapshots_unpublished ON snapshots (stream, id) WHERE mqtt_state IS NULL",
    "CREATE INDEX snapshots_unuploaded ON snapshots (id) WHERE upload_state IS NULL",
)

_COLUMNS = "id, alert_id, stream, created_at, meta, jpeg, heatmap"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One stored snapshot (see the module docstring for the fields)."""

    row_id: int
    alert_id: str
    stream: str
    created_at: float
    meta: dict[str, Any]
    jpeg: bytes
    heatmap: bytes | None


def _snapshot(row: tuple[Any, ...]) -> Snapshot:
    meta = json.loads(row[4])
    return Snapshot(int(row[0]), str(row[1]), str(row[2]), float(row[3]),
                    meta if isinstance(meta, dict) else {}, bytes(row[5]),
                    None if row[6] is None else bytes(row[6]))


def add(conn: sqlite3.Connection, alert_id: str, stream: str, meta: dict[str, Any],
        jpeg: bytes, heatmap: bytes | None, now: float) -> bool:
    """Insert one snapshot; False when the alert already has one (kept as it is)."""
    cur = conn.execute(
        "INSERT OR IGNORE INTO snapshots (alert_id, stream, created_at, meta, jpeg, heatmap) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        (alert_id, stream, now, json.dumps(meta, allow_nan=False), jpeg, heatmap))
    return cur.rowcount == 1


def get(conn: sqlite3.Connection, alert_id: str) -> Snapshot | None:
    """The snapshot of ``alert_id``, or None."""
    row = conn.execute(f"SELECT {_COLUMNS} FROM snapshots WHERE alert_id = ?",  # noqa: S608
                       (alert_id,)).fetchone()
    return None if row is None else _snapshot(row)


def to_publish(conn: sqlite3.Connection) -> list[Snapshot]:
    """The newest unpublished snapshot of every stream; older unpublished ones are marked
    ``superseded`` (the retained topic only holds the latest)."""
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM snapshots WHERE id IN (SELECT MAX(id) FROM snapshots "  # noqa: S608
        "WHERE mqtt_state IS NULL GROUP BY stream) ORDER BY id").fetchall()
    newest = [int(r[0]) for r in rows]
    if newest:
        marks = ",".join("?" * len(newest))
        conn.execute(f"UPDATE snapshots SET mqtt_state = 'superseded' WHERE mqtt_state IS NULL "  # noqa: S608
                     f"AND id NOT IN ({marks})", newest)
    return [_snapshot(r) for r in rows]


def mark_mqtt(conn: sqlite3.Connection, row_id: int, state: str | None,
              at: float | None) -> None:
    """Set ``mqtt_state`` (and ``published_at`` when ``at`` is given)."""
    conn.execute("UPDATE snapshots SET mqtt_state = ?, published_at = ? WHERE id = ?",
                 (state, at, row_id))


def to_upload(conn: sqlite3.Connection, limit: int) -> list[Snapshot]:
    """Snapshots not uploaded yet whose alert the fleet has acknowledged, oldest first (the
    fleet stores a snapshot only beside its alert)."""
    rows = conn.execute(
        "SELECT s.id, s.alert_id, s.stream, s.created_at, s.meta, s.jpeg, s.heatmap "
        "FROM snapshots s JOIN alerts a ON a.alert_id = s.alert_id "
        "WHERE s.upload_state IS NULL AND a.uploaded_at IS NOT NULL ORDER BY s.id LIMIT ?",
        (limit,)).fetchall()
    return [_snapshot(r) for r in rows]


def mark_upload(conn: sqlite3.Connection, row_id: int, state: str, at: float | None) -> None:
    """Set ``upload_state`` (and ``uploaded_at`` when ``at`` is given)."""
    conn.execute("UPDATE snapshots SET upload_state = ?, uploaded_at = ? WHERE id = ?",
                 (state, at, row_id))


def states(conn: sqlite3.Connection, alert_ids: Sequence[str]) -> dict[str, tuple[Any, Any]]:
    """``alert_id -> (mqtt_state, upload_state)`` of the given alerts' snapshots."""
    if not alert_ids:
        return {}
    marks = ",".join("?" * len(alert_ids))
    rows = conn.execute(f"SELECT alert_id, mqtt_state, upload_state FROM snapshots "  # noqa: S608
                        f"WHERE alert_id IN ({marks})", list(alert_ids)).fetchall()
    return {str(r[0]): (r[1], r[2]) for r in rows}


def rows_to_evict(conn: sqlite3.Connection, over_bytes: int) -> int:
    """How many of the oldest snapshots to delete to shed ``over_bytes`` (at least 1).

    Snapshots are far larger than alert or aggregate rows, so the step is sized by their own
    average size, not the store's (which would delete far too many at once).
    """
    n, total = conn.execute(
        "SELECT COUNT(*), COALESCE(SUM(LENGTH(jpeg) + COALESCE(LENGTH(heatmap), 0)), 0) "
        "FROM snapshots").fetchone()
    if not n:
        return 1
    per_row = max(1.0, float(total) / float(n))
    return max(1, math.ceil(over_bytes / per_row * 1.1))
