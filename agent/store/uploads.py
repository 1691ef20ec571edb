"""The store's cloud upload queue (the uploader thread): alerts first, then aggregates, each
oldest first, as dicts, as wire JSON (:mod:`agent.store.wire`) or with the aggregates as
schema-2 columns; acknowledgements, dead letters, backlog.

:class:`StoreUploads` is a base of :class:`agent.store.sqlite.Store`.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from agent.store import wire
from agent.store.budget import StoreBudget

RecordKind = Literal["alert", "aggregate"]

_TABLES: dict[str, str] = {"alert": "alerts", "aggregate": "aggregates"}


@dataclass(frozen=True, slots=True)
class UploadRow:
    """One stored record the fleet has not acknowledged yet.

    Attributes:
        kind: ``"alert"`` or ``"aggregate"``.
        row_id: Row id in its table (what :meth:`Store.mark_uploaded` takes).
        record_id: The record's stable wire id (``alert_id`` / ``aggregate_id``).
        body: The wire body: an ``AlertBody`` or ``AggregateBody`` of
            :mod:`cloud_sync.protocol` as a dict (NaN stored as None, ``interval_start`` in epoch
            seconds).
    """

    kind: RecordKind
    row_id: int
    record_id: str
    body: dict[str, Any]


def id_runs(row_ids: Sequence[int]) -> list[tuple[int, int]]:
    """Sorted, de-duplicated ids as inclusive runs of consecutive integers.

    Every id of a run is in ``row_ids``, so ``id BETWEEN lo AND hi`` touches only those rows.

    >>> id_runs([5, 1, 2, 3, 3, 7, 8])
    [(1, 3), (5, 5), (7, 8)]
    """
    runs: list[tuple[int, int]] = []
    for i in sorted({int(x) for x in row_ids}):
        if runs and i == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return runs


def _table(kind: str) -> str:
    try:
        return _TABLES[kind]
    except KeyError:
        raise ValueError(f"unknown record kind {kind!r} (alert or aggregate)") from None


class StoreUploads(StoreBudget):
    """The cloud upload queue of :class:`agent.store.sqlite.Store`."""

    def pending_uploads(self, limit: int) -> list[UploadRow]:
        """Return up to ``limit`` records the fleet has not acknowledged: alerts first (oldest
        first: live alerts go before the aggregate backlog), then aggregates, oldest first.

        Raises:
            StoreError: The read failed.
        """
        out: list[UploadRow] = []
        with self._use("pending_uploads") as conn:
            for row_id, alert_id, payload in conn.execute(
                "SELECT id, alert_id, payload FROM alerts WHERE uploaded_at IS NULL "
                "ORDER BY id LIMIT ?",
                (limit,),
            ):
                body = json.loads(payload)
                if isinstance(body, dict):
                    body.pop("snapshot", None)  # wire.ALERT_UPLOAD_BODY
                out.append(UploadRow("alert", int(row_id), alert_id, body))
            if len(out) >= limit:
                return out
            rows = conn.execute(
                "SELECT id, aggregate_id, device_id, stream, interval_start, interval_s, count,"
                " channels, max_score, windows, alert_count FROM aggregates "
                "WHERE uploaded_at IS NULL ORDER BY id LIMIT ?",
                (limit - len(out),),
            ).fetchall()
        for r in rows:
            body = {
                "device_id": r[2],
                "stream": r[3],
                "interval_start": float(r[4]),
                "interval_s": float(r[5]),
                "count": int(r[6]),
                "channels": json.loads(r[7]),
                "max_score": None if r[8] is None else float(r[8]),
                "windows": int(r[9]),
                "alert_count": int(r[10]),
            }
            out.append(UploadRow("aggregate", int(r[0]), r[1], body))
        return out

    def pending_upload_records(
        self, limit: int, after: tuple[int, int] = (0, 0)
    ) -> list[wire.WireRow]:
        """:meth:`pending_uploads` as wire JSON text (:mod:`agent.store.wire`), from row ids on.

        Args:
            limit: Most records returned.
            after: ``(alert row id, aggregate row id)``: only rows with larger ids (the uploader
                reads the next batch while the current one, not yet acknowledged, is in flight).

        Raises:
            StoreError: The read failed.
        """
        channels = wire.JSON_OR_NULL.format(col="channels")
        with self._use("pending_uploads") as conn:
            out = _pending_alert_rows(conn, limit, after[0])
            if len(out) >= limit:
                return out
            columns = ("id, aggregate_id, device_id, stream, interval_start, interval_s, count,"
                       f" {channels}, max_score, windows, alert_count")
            rows = conn.execute(
                f"SELECT {columns} FROM aggregates "  # noqa: S608 - fixed text
                "WHERE uploaded_at IS NULL AND id > ? ORDER BY id LIMIT ?",
                (after[1], limit - len(out)),
            ).fetchall()
        record = wire.aggregate_record
        out.extend(wire.WireRow("aggregate", r[0], r[1], record(r[1:])) for r in rows)
        return out

    def pending_upload_columns(
        self, limit: int, after: tuple[int, int] = (0, 0)
    ) -> tuple[list[wire.WireRow], wire.AggregateColumnsText | None]:
        """:meth:`pending_upload_records` for a schema-2 batch: the alerts as record JSON, the
        aggregates after them as columns (:func:`agent.store.wire.aggregate_columns`; None when
        the batch holds none). Same queue, order, ``limit`` and ``after``.

        Raises:
            StoreError: The read failed.
        """
        with self._use("pending_uploads") as conn:
            alerts = _pending_alert_rows(conn, limit, after[0])
            if len(alerts) >= limit:
                return alerts, None
            rows = conn.execute(
                f"SELECT {wire.AGGREGATE_SELECT} FROM aggregates "  # noqa: S608 - fixed text
                "WHERE uploaded_at IS NULL AND id > ? ORDER BY id LIMIT ?",
                (after[1], limit - len(alerts)),
            ).fetchall()
        return alerts, (wire.aggregate_columns(rows) if rows else None)

    def mark_uploaded(self, kind: RecordKind, row_ids: Sequence[int], at: float) -> int:
        """Set ``uploaded_at = at`` (epoch seconds) on rows the fleet acknowledged.

        Returns:
            Rows changed (rows already marked, or gone, are not counted).

        Raises:
            ValueError: Unknown ``kind``.
            StoreError: The write failed; no row changed.
        """
        table = _table(kind)
        if not row_ids:
            return 0
        # Runs of consecutive ids (a drained backlog is one run) become one range update each.
        with self._use("mark_uploaded", transaction=True) as conn:
            before = conn.total_changes
            conn.executemany(
                f"UPDATE {table} SET uploaded_at = ? "  # noqa: S608 - fixed table names
                "WHERE id BETWEEN ? AND ? AND uploaded_at IS NULL",
                [(at, lo, hi) for lo, hi in id_runs(row_ids)],
            )
            changed = conn.total_changes - before
        self._maintain()
        return changed

    def dead_letter(self, kind: RecordKind, row_ids: Sequence[int], reason: str) -> int:
        """Move rows the fleet rejected to ``dead_letter`` (never resent), in one transaction.

        Aggregates and already published alerts are deleted from their table; an alert still
        waiting for its MQTT PUBACK stays in the outbox, marked uploaded, so MQTT delivery is
        unaffected. An aggregate's payload holds its channels as JSON, or as the stored text
        when that is not JSON (such a row used to fail the move and stay in the queue).

        Args:
            kind: ``"alert"`` or ``"aggregate"``.
            row_ids: Row ids in that table.
            reason: The fleet's reason (stored with each row).

        Returns:
            Rows moved.

        Raises:
            ValueError: Unknown ``kind``.
            StoreError: The write failed; nothing moved.
        """
        _table(kind)  # validates kind
        if not row_ids:
            return 0
        now = self._clock()
        ids = [(int(i),) for i in row_ids]
        if kind == "alert":
            select = "SELECT 'alert', alert_id, payload, ?, ? FROM alerts WHERE id = ?"
            delete = "DELETE FROM alerts WHERE id = ? AND published_at IS NOT NULL"
            keep = "UPDATE alerts SET uploaded_at = ? WHERE id = ?"
        else:
            select = (
                "SELECT 'aggregate', aggregate_id, json_object('device_id', device_id,"
                " 'stream', stream, 'interval_start', interval_start, 'interval_s', interval_s,"
                " 'count', count, 'channels', CASE WHEN json_valid(channels) THEN"
                " json(channels) ELSE channels END, 'max_score', max_score,"
                " 'windows', windows, 'alert_count', alert_count), ?, ? "
                "FROM aggregates WHERE id = ?"
            )
            delete = "DELETE FROM aggregates WHERE id = ?"
            keep = ""
        with self._use("dead_letter", transaction=True) as conn:
            before = conn.total_changes
            conn.executemany(
                "INSERT INTO dead_letter (kind, record_id, payload, reason, failed_at) " + select,
                [(reason, now, i) for (i,) in ids],
            )
            moved = conn.total_changes - before
            if keep:
                conn.executemany(keep, [(now, i) for (i,) in ids])
            conn.executemany(delete, ids)
        return moved

    def dead_letters(self, limit: int = 1000) -> list[dict[str, Any]]:
        """Return dead-lettered records, oldest first (``payload`` parsed).

        Raises:
            StoreError: The read failed.
        """
        with self._use("dead_letters") as conn:
            rows = conn.execute(
                "SELECT id, kind, record_id, payload, reason, failed_at FROM dead_letter "
                "ORDER BY id LIMIT ?",
                (limit,),
            ).fetchall()
        keys = ("id", "kind", "record_id", "payload", "reason", "failed_at")
        out = [dict(zip(keys, r, strict=True)) for r in rows]
        for item in out:
            item["payload"] = json.loads(item["payload"])
        return out

    def upload_backlog(self) -> tuple[int, int]:
        """Return ``(alerts, aggregates)`` not yet acknowledged by the fleet.

        Raises:
            StoreError: The read failed.
        """
        with self._use("upload_backlog") as conn:
            alerts = conn.execute(
                "SELECT COUNT(*) FROM alerts WHERE uploaded_at IS NULL"
            ).fetchone()[0]
            aggregates = conn.execute(
                "SELECT COUNT(*) FROM aggregates WHERE uploaded_at IS NULL"
            ).fetchone()[0]
        return int(alerts), int(aggregates)

    def oldest_pending_upload(self) -> float | None:
        """Wall-clock time of the oldest record the fleet has not acknowledged, or None.

        An alert counts from ``created_at``; an aggregate from the end of its interval.

        Raises:
            StoreError: The read failed.
        """
        with self._use("oldest_pending_upload") as conn:
            a = conn.execute(
                "SELECT created_at FROM alerts WHERE uploaded_at IS NULL ORDER BY id LIMIT 1"
            ).fetchone()
            g = conn.execute(
                "SELECT interval_start + interval_s FROM aggregates WHERE uploaded_at IS NULL "
                "ORDER BY id LIMIT 1"
            ).fetchone()
        times = [float(r[0]) for r in (a, g) if r is not None]
        return min(times) if times else None


def _pending_alert_rows(conn: sqlite3.Connection, limit: int, after: int) -> list[wire.WireRow]:
    """Up to ``limit`` unuploaded alerts with row id > ``after``, oldest first, as wire rows."""
    payload = wire.ALERT_UPLOAD_BODY
    return [
        wire.WireRow("alert", int(row_id), alert_id, wire.alert_record(alert_id, body))
        for row_id, alert_id, body in conn.execute(
            f"SELECT id, alert_id, {payload} FROM alerts "  # noqa: S608 - fixed text
            "WHERE uploaded_at IS NULL AND id > ? ORDER BY id LIMIT ?",
            (after, limit),
        )
    ]
