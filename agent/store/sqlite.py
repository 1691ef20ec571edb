"""The agent's SQLite store: alert outbox, aggregates and restart-safe counters.

One :class:`Store` per agent, shared by the pipeline thread (``add_alert``, ``add_aggregate``,
``next_alert_seq``) and the MQTT publisher thread (``pending_alerts``, ``mark_published``,
``outbox_stats``).

Threading: ONE connection opened with ``check_same_thread=False`` and guarded by a lock. Every
call holds the lock for one short statement or transaction (sub-millisecond to a few ms), so the
pipeline and the publisher never interleave inside a transaction, and ``close`` can run from any
thread. WAL mode still matters: other processes (an operator's ``sqlite3`` shell, a future
uploader process) read without blocking the writer, and a crash never corrupts the file.

Durability: the file runs in WAL mode with ``synchronous=NORMAL`` (a crash of the agent loses
nothing; a power cut may lose the last commits). The two writes that must survive a power cut run
with ``synchronous=FULL`` for their own transaction: ``next_alert_seq`` (an alert id must never be
reused after a restart) and ``add_alert`` (an alert may be published as soon as it is stored).
Alerts are rare, so the extra fsync costs nothing measurable.

Schema and migrations: :mod:`agent.store.schema`.

Errors: every ``sqlite3`` failure becomes :class:`agent.errors.StoreError` (retryable) with the
operation and path as context; a full disk says so in the message. When ``metrics`` is given the
store counts ``store_errors_total{op}`` itself; callers must not count the same error again.
"""

from __future__ import annotations

import json
import math
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.errors import StoreError
from agent.metrics import Metrics
from agent.records import Aggregate, Alert
from agent.store.schema import migrate

Clock = Callable[[], float]

_ALERT_SEQ_PREFIX = "alert_seq:"


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """One alert waiting for the broker's PUBACK.

    Attributes:
        id: Row id; outbox order (ascending = order of insertion).
        alert_id: ``<device>:<stream>:<seq>``, unique.
        stream: Stream name (metric label).
        payload: The MQTT payload: ``Alert.to_payload()`` as compact JSON text (encode as UTF-8).
        created_at: When the alert was stored, epoch seconds UTC.
    """

    id: int
    alert_id: str
    stream: str
    payload: str
    created_at: float


def _finite_or_none(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def _describe(exc: sqlite3.Error) -> str:
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    if primary == sqlite3.SQLITE_FULL:
        return f"disk full: the SQLite store cannot grow ({exc})"
    if primary in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
        return f"SQLite store is locked by another writer ({exc})"
    if primary == sqlite3.SQLITE_IOERR:
        return f"I/O error on the SQLite store ({exc})"
    if primary in (sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PERM):
        return f"SQLite store is not writable ({exc})"
    return f"SQLite store failed ({exc})"


class Store:
    """SQLite-backed outbox, aggregate buffer and counters.

    Args:
        path: Database file; its parent directory is created if missing. ``":memory:"`` works
            for tests (no WAL then).
        clock: Wall clock, epoch seconds UTC; stamps ``created_at``.
        metrics: Optional; when given, ``store_errors_total{op}`` and ``aggregates_total{stream}``
            are counted here.
        busy_timeout_s: How long a write waits for another process's lock before failing.

    Raises:
        StoreError: The file cannot be opened, is not a database, or its schema is newer than
            this code.
    """

    def __init__(
        self,
        path: str | Path,
        clock: Clock = time.time,
        *,
        metrics: Metrics | None = None,
        busy_timeout_s: float = 5.0,
    ) -> None:
        self.path = str(path)
        self._clock = clock
        self._metrics = metrics
        self._lock = threading.RLock()
        try:
            if self.path != ":memory:":
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(
                self.path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
            )
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open the SQLite store: {exc}", path=self.path) from exc
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000):d}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            migrate(conn)
        except sqlite3.Error as exc:
            conn.close()
            raise StoreError(_describe(exc), op="open", path=self.path) from exc
        except RuntimeError as exc:
            conn.close()
            raise StoreError(str(exc), op="open", path=self.path) from exc
        self._conn: sqlite3.Connection | None = conn

    # -- plumbing -------------------------------------------------------------------------------

    @contextmanager
    def _use(self, op: str, *, transaction: bool = False, durable: bool = False) -> Iterator[
        sqlite3.Connection
    ]:
        """Hold the lock, optionally in a ``BEGIN IMMEDIATE`` transaction; wrap sqlite3 errors."""
        with self._lock:
            conn = self._conn
            if conn is None:
                raise StoreError("the store is closed", op=op, path=self.path)
            try:
                if durable:
                    conn.execute("PRAGMA synchronous = FULL")
                try:
                    if transaction:
                        conn.execute("BEGIN IMMEDIATE")
                        try:
                            yield conn
                            conn.execute("COMMIT")
                        except BaseException:
                            if conn.in_transaction:
                                conn.execute("ROLLBACK")
                            raise
                    else:
                        yield conn
                finally:
                    if durable:
                        conn.execute("PRAGMA synchronous = NORMAL")
            except sqlite3.Error as exc:
                if self._metrics is not None:
                    self._metrics.store_errors_total.labels(op=op).inc()
                raise StoreError(_describe(exc), op=op, path=self.path) from exc

    # -- counters -------------------------------------------------------------------------------

    def next_seq(self, name: str) -> int:
        """Increment and return the counter ``name`` (1 on first use); durable across restarts.

        Raises:
            StoreError: The write failed (disk full, locked).
        """
        with self._use("next_seq", transaction=True, durable=True) as conn:
            conn.execute(
                "INSERT INTO counters (name, value) VALUES (?, 1) "
                "ON CONFLICT (name) DO UPDATE SET value = value + 1",
                (name,),
            )
            row = conn.execute("SELECT value FROM counters WHERE name = ?", (name,)).fetchone()
        return int(row[0])

    def next_alert_seq(self, stream: str) -> int:
        """Return the next alert sequence number of ``stream`` (1, 2, ...; never reused).

        Raises:
            StoreError: The write failed.
        """
        return self.next_seq(_ALERT_SEQ_PREFIX + stream)

    # -- alerts / outbox ------------------------------------------------------------------------

    def add_alert(self, alert: Alert) -> bool:
        """Store an alert in the outbox; idempotent on ``alert_id``.

        Returns:
            True when inserted, False when an alert with this id was already stored (unchanged).

        Raises:
            ValueError: The payload holds a non-finite number (not valid JSON).
            StoreError: The write failed (disk full: the caller still holds the alert).
        """
        payload = json.dumps(
            alert.to_payload(), ensure_ascii=False, separators=(",", ":"), allow_nan=False
        )
        with self._use("add_alert", durable=True) as conn:
            cur = conn.execute(
                "INSERT OR IGNORE INTO alerts (alert_id, stream, seq, payload, created_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (alert.alert_id, alert.stream, alert.seq, payload, self._clock()),
            )
            return cur.rowcount == 1

    def pending_alerts(self, limit: int, after_id: int = 0) -> list[OutboxRow]:
        """Return up to ``limit`` unpublished alerts with ``id > after_id``, oldest first.

        Raises:
            StoreError: The read failed.
        """
        with self._use("pending_alerts") as conn:
            rows = conn.execute(
                "SELECT id, alert_id, stream, payload, created_at FROM alerts "
                "WHERE published_at IS NULL AND id > ? ORDER BY id LIMIT ?",
                (after_id, limit),
            ).fetchall()
        return [OutboxRow(int(r[0]), r[1], r[2], r[3], float(r[4])) for r in rows]

    def mark_published(self, row_ids: Sequence[int], at: float) -> int:
        """Set ``published_at = at`` (epoch seconds) on rows not yet published, in one transaction.

        Returns:
            How many rows changed (rows already published are left alone and not counted).

        Raises:
            StoreError: The write failed; no row changed.
        """
        if not row_ids:
            return 0
        with self._use("mark_published", transaction=True) as conn:
            before = conn.total_changes
            conn.executemany(
                "UPDATE alerts SET published_at = ? WHERE id = ? AND published_at IS NULL",
                [(at, int(i)) for i in row_ids],
            )
            return conn.total_changes - before

    def outbox_stats(self) -> tuple[int, float | None]:
        """Return ``(depth, oldest created_at or None)`` of the unpublished alerts.

        Raises:
            StoreError: The read failed.
        """
        with self._use("outbox_stats") as conn:
            depth, oldest = conn.execute(
                "SELECT COUNT(*), MIN(created_at) FROM alerts WHERE published_at IS NULL"
            ).fetchone()
        return int(depth), (None if oldest is None else float(oldest))

    def alerts(
        self,
        stream: str | None = None,
        *,
        after_id: int = 0,
        limit: int = 1000,
        pending_only: bool = False,
    ) -> list[dict[str, Any]]:
        """Return stored alerts for inspection, oldest first.

        Each dict has ``id, alert_id, stream, seq, payload`` (the parsed JSON payload),
        ``created_at, published_at, uploaded_at`` (epoch seconds or None).

        Raises:
            StoreError: The read failed.
        """
        sql = (
            "SELECT id, alert_id, stream, seq, payload, created_at, published_at, uploaded_at "
            "FROM alerts WHERE id > ?"
        )
        params: list[object] = [after_id]
        if stream is not None:
            sql += " AND stream = ?"
            params.append(stream)
        if pending_only:
            sql += " AND published_at IS NULL"
        sql += " ORDER BY id LIMIT ?"
        params.append(limit)
        with self._use("alerts") as conn:
            rows = conn.execute(sql, params).fetchall()
        keys = ("id", "alert_id", "stream", "seq", "payload", "created_at", "published_at",
                "uploaded_at")
        out = [dict(zip(keys, r, strict=True)) for r in rows]
        for item in out:
            item["payload"] = json.loads(item["payload"])
        return out

    def prune_published(self, older_than_s: float, *, require_uploaded: bool = True) -> int:
        """Delete alerts published more than ``older_than_s`` seconds ago.

        Args:
            older_than_s: Minimum age of ``published_at``, seconds.
            require_uploaded: Keep rows the cloud uploader has not taken yet (the default; pass
                False only when no uploader is configured).

        Returns:
            Rows deleted.

        Raises:
            StoreError: The write failed.
        """
        sql = "DELETE FROM alerts WHERE published_at IS NOT NULL AND published_at < ?"
        if require_uploaded:
            sql += " AND uploaded_at IS NOT NULL"
        with self._use("prune_published") as conn:
            return conn.execute(sql, (self._clock() - older_than_s,)).rowcount

    # -- aggregates -----------------------------------------------------------------------------

    def add_aggregate(self, agg: Aggregate) -> bool:
        """Store an aggregate; idempotent on ``aggregate_id``. Non-finite numbers become NULL.

        Returns:
            True when inserted, False when already stored (unchanged).

        Raises:
            StoreError: The write failed.
        """
        channels = json.dumps(
            [
                {
                    "channel": c.channel,
                    "count": int(c.count),
                    "min": _finite_or_none(c.min),
                    "max": _finite_or_none(c.max),
                    "mean": _finite_or_none(c.mean),
                    "std": _finite_or_none(c.std),
                }
                for c in agg.channels
            ],
            ensure_ascii=False,
            separators=(",", ":"),
        )
        with self._use("add_aggregate") as conn:
            cur = conn.execute(
                "INSERT OR IGNORE INTO aggregates (aggregate_id, device_id, stream, interval_start,"
                " interval_s, count, channels, max_score, windows, alert_count) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    agg.aggregate_id,
                    agg.device_id,
                    agg.stream,
                    agg.interval_start,
                    agg.interval_s,
                    agg.count,
                    channels,
                    _finite_or_none(agg.max_score),
                    agg.windows,
                    agg.alert_count,
                ),
            )
            inserted = cur.rowcount == 1
        if inserted and self._metrics is not None:
            self._metrics.aggregates_total.labels(stream=agg.stream).inc()
        return inserted

    def aggregates(
        self, stream: str | None = None, since: float | None = None
    ) -> list[dict[str, Any]]:
        """Return stored aggregates ordered by ``interval_start`` (then id).

        Args:
            stream: Only this stream.
            since: Only intervals starting at or after this time, epoch seconds UTC.

        Returns:
            Dicts with the ``aggregates`` columns; ``channels`` is the parsed list of
            ``{channel, count, min, max, mean, std}``; ``max_score`` is None when nothing was
            scored.

        Raises:
            StoreError: The read failed.
        """
        sql = (
            "SELECT id, aggregate_id, device_id, stream, interval_start, interval_s, count,"
            " channels, max_score, windows, alert_count, uploaded_at FROM aggregates WHERE 1 = 1"
        )
        params: list[object] = []
        if stream is not None:
            sql += " AND stream = ?"
            params.append(stream)
        if since is not None:
            sql += " AND interval_start >= ?"
            params.append(since)
        sql += " ORDER BY interval_start, id"
        with self._use("aggregates") as conn:
            cur = conn.execute(sql, params)
            keys = [d[0] for d in cur.description]
            rows = cur.fetchall()
        out = [dict(zip(keys, r, strict=True)) for r in rows]
        for item in out:
            item["channels"] = json.loads(item["channels"])
        return out

    # -- lifecycle ------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection (idempotent); later calls raise :class:`StoreError`."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
