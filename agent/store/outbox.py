"""The store's alert outbox and counters: alert sequence numbers, alerts with their episode
marks, the MQTT publisher's queue and marks, inspection and pruning.

:class:`StoreOutbox` is a base of :class:`agent.store.sqlite.Store`. Durability: the alert
writes and the counters run with ``synchronous=FULL`` (module docstring of
:mod:`agent.store.sqlite`).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agent.errors import StoreError
from agent.records import Alert
from agent.store import episodes
from agent.store import maintenance as mt
from agent.store.budget import StoreBudget
from agent.store.connection import _ALERT_SEQ_PREFIX
from agent.store.episodes import EpisodeMark, OpenEpisode


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



class StoreOutbox(StoreBudget):
    """Counters and the alert outbox of :class:`agent.store.sqlite.Store`."""

    #: The largest alert row id committed, None until known (:meth:`last_row_hint`).
    _last_row: int | None = None
    _row_lock = threading.Lock()  # shared by every store: held for a comparison only

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

        A store that replaced a quarantined one continues above its creation time in ms
        (``_ALERT_SEQ_BASE``).

        Raises:
            StoreError: The write failed.
        """
        floor = max(self._seq_base, self.ids.mark(stream))
        if floor:
            self.raise_alert_seq(stream, floor)
        seq = self.next_seq(_ALERT_SEQ_PREFIX + stream)
        self.ids.record(stream, seq)
        return seq

    def add_alert(self, alert: Alert, episode: EpisodeMark | None = None) -> bool:
        """Store an alert in the outbox; idempotent on ``alert_id``.

        ``episode``: what the event does to its stream's open episode, written in the same
        transaction (:mod:`agent.store.episodes`); not written when the alert was already
        stored.

        Returns:
            True when inserted, False when an alert with this id was already stored (unchanged).

        Raises:
            ValueError: The payload holds a non-finite number (not valid JSON).
            StoreError: The write failed (disk full: the caller still holds the alert).
        """
        payload = json.dumps(
            alert.to_payload(), ensure_ascii=False, separators=(",", ":"), allow_nan=False
        )
        try:
            try:
                inserted = self._insert_alert(alert, payload, episode)
            except StoreError as exc:
                if not mt.is_disk_full(exc) or not self._make_room():
                    raise
                inserted = self._insert_alert(alert, payload, episode)
        except StoreError:
            self._alerts_not_stored += 1
            self._maintain()
            raise
        self._maintain()
        return inserted

    def add_new_alert(
        self, stream: str, make: Callable[[int], Alert], seq_floor: int = 0,
        episode: EpisodeMark | None = None,
    ) -> Alert:
        """Take the next alert sequence number of ``stream`` and store ``make(seq)``, atomically.

        One durable transaction (one fsync) instead of :meth:`next_alert_seq` followed by
        :meth:`add_alert` (two): the sequence number and the outbox row commit together, so a
        crash can neither lose the row nor reuse the number.

        Args:
            stream: Stream name.
            make: Builds the alert from its sequence number.
            seq_floor: The number is above this one too (sequence numbers the caller used while
                the store refused writes; they are persisted by this transaction).
            episode: What the event does to its stream's open episode, written in the same
                transaction (:mod:`agent.store.episodes`).

        Returns:
            The stored alert.

        Raises:
            ValueError: The payload holds a non-finite number.
            StoreError: The write failed (disk full after trying to make room).
        """
        try:
            try:
                alert = self._insert_new_alert(stream, make, seq_floor, episode)
            except StoreError as exc:
                if not mt.is_disk_full(exc) or not self._make_room():
                    raise
                alert = self._insert_new_alert(stream, make, seq_floor, episode)
        except StoreError:
            self._alerts_not_stored += 1
            self._maintain()
            raise
        self._maintain()
        return alert

    def add_numbered_alerts(
        self, items: Sequence[tuple[Alert, str, EpisodeMark | None]]
    ) -> list[int]:
        """Store alerts numbered already (:meth:`agent.store.ids.IdLedger.take`) in ONE durable
        transaction: a group commit of the alerts raised while the previous one ran.

        Each alert's stream counter is raised to its ``seq`` and its episode mark is written in
        the same transaction; an alert whose id is stored already is left alone.

        Args:
            items: ``(alert, payload, episode mark)`` in raising order; ``payload`` is
                ``alert.to_payload()`` as compact JSON text.

        Returns:
            The outbox row id of each alert (0 for an id stored already), in order.

        Raises:
            StoreError: The write failed (disk full after trying to make room); nothing of
                the group is stored.
        """
        if not items:
            return []
        try:
            try:
                rows = self._insert_numbered(items)
            except StoreError as exc:
                if not mt.is_disk_full(exc) or not self._make_room():
                    raise
                rows = self._insert_numbered(items)
        except StoreError:
            self._alerts_not_stored += len(items)
            self._maintain()
            raise
        top: dict[str, int] = {}
        for alert, _, _ in items:
            top[alert.stream] = max(top.get(alert.stream, 0), alert.seq)
        for stream, seq in top.items():
            self.ids.record(stream, seq)
        self._maintain()
        return rows

    def _insert_numbered(
        self, items: Sequence[tuple[Alert, str, EpisodeMark | None]]
    ) -> list[int]:
        rows: list[int] = []
        with self._use("add_alert", transaction=True, durable=True) as conn:
            for alert, payload, episode in items:
                conn.execute(
                    "INSERT INTO counters (name, value) VALUES (?, ?) "
                    "ON CONFLICT (name) DO UPDATE SET value = MAX(value, excluded.value)",
                    (_ALERT_SEQ_PREFIX + alert.stream, int(alert.seq)),
                )
                cur = conn.execute(
                    "INSERT OR IGNORE INTO alerts (alert_id, stream, seq, payload, created_at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (alert.alert_id, alert.stream, alert.seq, payload, self._clock()),
                )
                inserted = cur.rowcount == 1
                rows.append(int(cur.lastrowid or 0) if inserted else 0)
                if inserted and episode is not None:
                    episodes.apply(conn, alert, episode, self._clock())
        self._note_row(max(rows))
        return rows

    def last_row_hint(self) -> int:
        """The largest alert row id committed, from memory (no lock, no I/O; read from the
        store on the first call): outbox rows up to it are visible to :meth:`pending_alerts`.

        Raises:
            StoreError: The first call's read failed.
        """
        hint = self._last_row
        if hint is None:
            hint = self.last_alert_row()
            self._note_row(hint)
        return hint

    def _note_row(self, row: int) -> None:
        """Remember ``row`` as committed (after the commit)."""
        with self._row_lock:
            if self._last_row is None or row > self._last_row:
                self._last_row = row

    def last_alert_seq(self, stream: str) -> int:
        """The last alert sequence number of ``stream`` taken (0 for none); a read only.

        Raises:
            StoreError: The read failed.
        """
        try:
            with self._use("alert_seq") as conn:
                row = conn.execute(
                    "SELECT value FROM counters WHERE name = ?", (_ALERT_SEQ_PREFIX + stream,)
                ).fetchone()
        except StoreError:
            if self.deferred is None:
                raise
            row = None  # not open (disk full): the id ledger knows what was issued
        return max(self._seq_base, self.ids.mark(stream), 0 if row is None else int(row[0]))

    def raise_alert_seq(self, stream: str, floor: int) -> None:
        """Make sure the next alert sequence number of ``stream`` is above ``floor`` (durable).

        Raises:
            StoreError: The write failed.
        """
        with self._use("alert_seq", transaction=True, durable=True) as conn:
            conn.execute(
                "INSERT INTO counters (name, value) VALUES (?, ?) "
                "ON CONFLICT (name) DO UPDATE SET value = MAX(value, excluded.value)",
                (_ALERT_SEQ_PREFIX + stream, int(floor)),
            )
        self.ids.record(stream, int(floor))

    def _insert_new_alert(
        self, stream: str, make: Callable[[int], Alert], seq_floor: int = 0,
        episode: EpisodeMark | None = None,
    ) -> Alert:
        with self._use("add_alert", transaction=True, durable=True) as conn:
            name = _ALERT_SEQ_PREFIX + stream
            conn.execute(
                "INSERT INTO counters (name, value) VALUES (?, ? + 1) "
                "ON CONFLICT (name) DO UPDATE SET value = MAX(value, excluded.value - 1) + 1",
                (name, max(int(seq_floor), self._seq_base, self.ids.mark(stream))),
            )
            row = conn.execute("SELECT value FROM counters WHERE name = ?", (name,)).fetchone()
            alert = make(int(row[0]))
            payload = json.dumps(
                alert.to_payload(), ensure_ascii=False, separators=(",", ":"), allow_nan=False
            )
            conn.execute(
                "INSERT INTO alerts (alert_id, stream, seq, payload, created_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (alert.alert_id, alert.stream, alert.seq, payload, self._clock()),
            )
            if episode is not None:
                episodes.apply(conn, alert, episode, self._clock())
            row_id = int(conn.execute("SELECT last_insert_rowid()").fetchone()[0])
        self._note_row(row_id)
        self.ids.record(stream, alert.seq)
        return alert

    def _insert_alert(self, alert: Alert, payload: str,
                      episode: EpisodeMark | None = None) -> bool:
        with self._use("add_alert", transaction=True, durable=True) as conn:
            cur = conn.execute(
                "INSERT OR IGNORE INTO alerts (alert_id, stream, seq, payload, created_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (alert.alert_id, alert.stream, alert.seq, payload, self._clock()),
            )
            if cur.rowcount == 1 and episode is not None:
                episodes.apply(conn, alert, episode, self._clock())
            inserted = cur.rowcount == 1
            row_id = int(cur.lastrowid or 0)
        if inserted:
            self._note_row(row_id)
        return inserted

    def open_episodes(self) -> dict[str, OpenEpisode]:
        """Every stream's open episode (raised, not cleared), by stream.

        Raises:
            StoreError: The read failed.
        """
        with self._use("load_episodes") as conn:
            return episodes.load(conn)

    def forget_episode(self, stream: str) -> None:
        """Forget ``stream``'s open episode (the stream left the config).

        Raises:
            StoreError: The write failed.
        """
        with self._use("forget_episode", transaction=True) as conn:
            episodes.forget(conn, stream)

    def last_alert_row(self) -> int:
        """The largest alert row id (0 for none): where the outbox ends now.

        Raises:
            StoreError: The read failed.
        """
        with self._use("pending_alerts") as conn:
            return int(conn.execute("SELECT COALESCE(MAX(id), 0) FROM alerts").fetchone()[0])

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

    def mqtt_dead_letter(self, row_id: int, reason: str, at: float) -> bool:
        """Take an alert the broker cannot take (too large, rejected) out of the MQTT outbox.

        One transaction: a ``dead_letter`` row of kind ``"mqtt"`` (the stored payload and
        ``reason``) and ``published_at = at`` on the alert, so the drain passes it; the alert
        is still uploaded to the fleet like any other.

        Returns:
            True when the alert was still pending (False: gone or already published).

        Raises:
            StoreError: The write failed; nothing changed.
        """
        with self._use("mqtt_dead_letter", transaction=True) as conn:
            cur = conn.execute(
                "UPDATE alerts SET published_at = ? WHERE id = ? AND published_at IS NULL",
                (at, int(row_id)),
            )
            if cur.rowcount != 1:
                return False
            conn.execute(
                "INSERT INTO dead_letter (kind, record_id, payload, reason, failed_at) "
                "SELECT 'mqtt', alert_id, payload, ?, ? FROM alerts WHERE id = ?",
                (reason, at, int(row_id)),
            )
        return True

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
