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

Schema and migrations: :mod:`agent.store.schema`. Integrity check at open (a corrupt file is
renamed aside and a fresh store started), the disk budget with its eviction order, and WAL
bounds: :mod:`agent.store.maintenance`.

Cloud upload (the uploader thread): ``pending_uploads`` (alerts first, then aggregates, each
oldest first; ``pending_upload_records`` is the same queue as wire JSON, :mod:`agent.store.wire`,
``pending_upload_columns`` the same with the aggregates as schema-2 columns),
``mark_uploaded`` (rows the fleet acknowledged), ``dead_letter`` (rows it rejected),
``upload_backlog`` and ``oldest_pending_upload``.

Aggregates: ``add_aggregate`` stores an interval the store already holds (the agent restarted
within it) as the interval's next part, and drops an exact repeat (a replay of the same file):
:mod:`agent.store.parts`.

Watched camera folders (a camera thread and the main loop): ``scored_files``,
``mark_file_scored`` and ``forget_scored_files``: :mod:`agent.store.camera_files`.

Camera alert snapshots (the snapshot worker, the MQTT snapshot publisher and the snapshot
uploader): ``add_snapshot``, ``snapshots_to_publish``, ``snapshots_to_upload`` and their marks:
:mod:`agent.store.snapshots`; evicted first under the budget.

Calibrations (the pipeline thread): ``save_calibration`` (durable, when a stream finishes its
calibration or a model update swaps one in) and ``calibration`` (at start):
:mod:`agent.store.calibrations`.

Errors: every ``sqlite3`` failure becomes :class:`agent.errors.StoreError` (retryable) with the
operation and path as context; a full disk says so in the message. When ``metrics`` is given the
store counts ``store_errors_total{op}`` itself; callers must not count the same error again.
When ``add_alert`` hits a full disk the store first evicts a step of aggregates (budget order)
and retries once: alerts are worth more than summaries. ``add_aggregate`` on a full disk evicts a
step too (the aggregate that failed is the caller's to count; the next ones find room), so a disk
smaller than the budget behaves like the budget.

Alert ids: every alert number issued is also kept in an id ledger outside the database
(:mod:`agent.store.ids`), so a database that silently lost its last commits does not issue them
again.

Failures are remembered for health (:meth:`Store.failure`): the last error, when, how many, and
how many alerts could not be stored (the agent delivers those over MQTT from memory).
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from agent.errors import StoreError
from agent.metrics import Metrics
from agent.pipeline.restore import StoredCalibration
from agent.records import Aggregate, Alert, iso_utc
from agent.store import calibrations, camera_files, codes, episodes, parts, snapshots, wire
from agent.store import maintenance as mt
from agent.store.deferred import Deferred, bare_message, no_room
from agent.store.episodes import EpisodeMark, OpenEpisode
from agent.store.ids import IdLedger
from agent.store.schema import migrate

Clock = Callable[[], float]
RecordKind = Literal["alert", "aggregate"]

log = logging.getLogger("agent.store")

_TABLES: dict[str, str] = {"alert": "alerts", "aggregate": "aggregates"}

_ALERT_SEQ_PREFIX = "alert_seq:"
#: Counter holding the least alert sequence number of a store that replaced a quarantined one
#: (:meth:`Store._open`): every stream's alert numbers continue above it.
_ALERT_SEQ_BASE = "alert_seq_base"
#: Most eviction steps per eviction class on one full-disk write.
_MAKE_ROOM_STEPS = 64


@dataclass(frozen=True, slots=True)
class StoreFailure:
    """The store's failures so far (for health and the shutdown line).

    Attributes:
        count: Statements that failed since the store was opened.
        last_error: The last failure's description (``disk full: ...``), None if none yet.
        last_mono: ``monotonic()`` of the last failure, None if none yet.
        alerts_not_stored: Alerts ``add_new_alert``/``add_alert`` could not store.
    """

    count: int
    last_error: str | None
    last_mono: float | None
    alerts_not_stored: int


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


def _finite_or_none(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def _describe(exc: sqlite3.Error) -> str:
    primary = codes.primary_code(exc)
    if primary == codes.SQLITE_FULL:
        return f"disk full: the SQLite store cannot grow ({exc})"
    if primary in (codes.SQLITE_BUSY, codes.SQLITE_LOCKED):
        return f"SQLite store is locked by another writer ({exc})"
    if primary == codes.SQLITE_IOERR:
        return f"I/O error on the SQLite store ({exc})"
    if primary in (codes.SQLITE_READONLY, codes.SQLITE_CANTOPEN, codes.SQLITE_PERM):
        return f"SQLite store is not writable ({exc})"
    return f"SQLite store failed ({exc})"


def _table(kind: str) -> str:
    try:
        return _TABLES[kind]
    except KeyError:
        raise ValueError(f"unknown record kind {kind!r} (alert or aggregate)") from None


class Store:
    """SQLite-backed outbox, aggregate buffer and counters.

    Args:
        path: Database file; its parent directory is created if missing. ``":memory:"`` works
            for tests (no WAL then).
        clock: Wall clock, epoch seconds UTC; stamps ``created_at``.
        metrics: Optional; when given, ``store_errors_total{op}``, ``aggregates_total{stream}``,
            ``dropped_total{kind, reason="budget"}``, ``store_bytes`` and
            ``store_quarantined_total`` are counted here.
        busy_timeout_s: How long a write waits for another process's lock before failing.
        budget_bytes: Disk budget in bytes (live pages plus WAL); None = unlimited. Checked at
            most every ``maintenance_interval_s`` after writes (and by :meth:`enforce_budget`).
        uploads: A cloud uploader is configured: alerts count as done only once uploaded too
            (eviction order, :mod:`agent.store.maintenance`).
        monotonic: Monotonic clock (maintenance intervals).
        maintenance_interval_s: Least seconds between two budget checks / WAL checkpoints.

    Raises:
        StoreError: The file cannot be opened or created, or its schema is newer than this code.
            A corrupt file or one that is not a database is renamed to
            ``<name>.corrupt-<UTC timestamp>`` and a fresh store is created instead (one ERROR
            log line; ``store_quarantined_total``); ``quarantined`` then holds the new name.
            A file that cannot be opened for want of disk space raises nothing: the reserve
            file is released and, if that is not enough, the store starts unopened
            (``deferred``; every call raises StoreError until an attempt, at most every second,
            opens it: :mod:`agent.store.deferred`).
    """

    def __init__(
        self,
        path: str | Path,
        clock: Clock = time.time,
        *,
        metrics: Metrics | None = None,
        busy_timeout_s: float = 5.0,
        budget_bytes: int | None = None,
        uploads: bool = True,
        monotonic: Clock = time.monotonic,
        maintenance_interval_s: float = 1.0,
    ) -> None:
        self.path = str(path)
        self._clock = clock
        self._metrics = metrics
        self._lock = threading.RLock()
        self.budget_bytes = budget_bytes
        self._classes = mt.eviction_classes(uploads)
        self._monotonic = monotonic
        self._maintenance_interval_s = maintenance_interval_s
        self._next_check = 0.0
        self._last_checkpoint = monotonic()
        self._evicting = False
        self._episode_evicted: dict[str, int] = {}
        self._failures = 0
        self._last_error: tuple[str, float] | None = None
        self._alerts_not_stored = 0
        self.wal_limit_bytes = mt.wal_limit_bytes(self.path, budget_bytes)
        self._reserve_bytes = mt.reserve_bytes(self.wal_limit_bytes)
        self.quarantined: str | None = None
        self._seq_base = 0  # alert numbers continue above it (set by _open; see _ALERT_SEQ_BASE)
        #: Alert numbers issued, kept outside the database too (:mod:`agent.store.ids`).
        self.ids = IdLedger(None if self.path == ":memory:" else self.path + ".ids")
        self._busy_timeout_s = busy_timeout_s
        self._quarantine_base: int | None = None  # id floor of a fresh store not yet created
        #: Set while the store could not be opened for want of disk space (agent.store.deferred).
        self.deferred: Deferred | None = None
        self._conn: sqlite3.Connection | None = None
        try:
            self._conn = self._open_with_room()
        except StoreError as exc:
            if not no_room(exc, self.path):
                raise
            self._defer(exc)

    def _open_with_room(self) -> sqlite3.Connection:
        """Open; on a full disk delete the reserve file and try once more."""
        try:
            return self._open(self._busy_timeout_s)
        except StoreError as exc:
            if not no_room(exc, self.path) or not mt.release_reserve(self.path):
                raise
            log.warning("SQLite store %s: disk full at open; reserve file released", self.path)
            return self._open(self._busy_timeout_s)

    def _defer(self, exc: StoreError) -> None:
        now = self._monotonic()
        self.deferred = Deferred(bare_message(exc), now)
        self._failures += 1
        self._last_error = (bare_message(exc), now)
        if self._metrics is not None:
            self._metrics.store_errors_total.labels(op="open").inc()
        log.error(
            "SQLite store %s cannot be opened: %s; running without it (alerts go over MQTT "
            "from memory, aggregates are dropped and counted) and trying again every second",
            self.path, bare_message(exc),
        )

    def _reopen(self, op: str) -> sqlite3.Connection:
        """A call on an unopened store: try to open it (at most every second) or raise."""
        d = self.deferred
        assert d is not None
        now = self._monotonic()
        if d.due(now):
            try:
                conn = self._open_with_room()
            except StoreError as exc:
                if not no_room(exc, self.path):
                    log.error("SQLite store %s: %s", self.path, exc)
                d.failed(bare_message(exc), now)
            else:
                log.warning("SQLite store %s opened after %.0f s (%d attempts): the disk has "
                            "room again", self.path, now - d.since, d.attempts)
                self.deferred = None
                self._conn = conn
                return conn
        self._failures += 1
        self._last_error = (d.error, now)
        if self._metrics is not None:
            self._metrics.store_errors_total.labels(op=op).inc()
        raise StoreError(f"store not open: {d.error}", op=op, path=self.path)

    def _connect(self, busy_timeout_s: float) -> sqlite3.Connection:
        try:
            if self.path != ":memory:":
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(
                self.path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
            )
            conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000):d}")
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open the SQLite store: {exc}", path=self.path) from exc
        return conn

    def _open(self, busy_timeout_s: float) -> sqlite3.Connection:
        conn = self._connect(busy_timeout_s)
        try:
            problem = mt.quick_check(conn)
        except sqlite3.DatabaseError as exc:
            if not mt.is_corruption(exc):
                conn.close()
                raise StoreError(_describe(exc), op="open", path=self.path) from exc
            problem = str(exc)
        if problem is not None and self.path != ":memory:":
            conn.close()
            try:
                self.quarantined = mt.quarantine(self.path, self._clock())
            except OSError as exc:
                raise StoreError(
                    f"corrupt SQLite store ({problem}) cannot be moved aside: {exc}",
                    path=self.path,
                ) from exc
            log.error(
                "SQLite store %s is corrupt (%s): moved to %s; starting on a fresh store",
                self.path, problem, self.quarantined,
            )
            if self._metrics is not None:
                self._metrics.store_quarantined_total.inc()
            conn = self._connect(busy_timeout_s)
            # The corrupt file held the alert sequence counters and is unreadable: numbering
            # again from 1 would reissue alert ids the broker's consumers and the fleet have
            # already seen (the fleet answers "duplicate" and the new alert is never stored).
            # Continue every stream above the wall clock in ms instead: unique as long as the
            # old store issued fewer alerts than milliseconds passed since it was created.
            self._quarantine_base = int(self._clock() * 1000)
        try:
            mt.prepare_new_file(conn)
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute(f"PRAGMA journal_size_limit = {self.wal_limit_bytes:d}")
            page = int(conn.execute("PRAGMA page_size").fetchone()[0])
            conn.execute(f"PRAGMA wal_autocheckpoint = {max(8, self.wal_limit_bytes // page):d}")
            migrate(conn)
            if self._quarantine_base is not None:
                conn.execute(
                    "INSERT INTO counters (name, value) VALUES (?, ?) "
                    "ON CONFLICT (name) DO UPDATE SET value = MAX(value, excluded.value)",
                    (_ALERT_SEQ_BASE, self._quarantine_base),
                )
            row = conn.execute(
                "SELECT value FROM counters WHERE name = ?", (_ALERT_SEQ_BASE,)
            ).fetchone()
            self._seq_base = 0 if row is None else int(row[0])
            if self.quarantined is None:
                self._check_tail(conn)
        except sqlite3.Error as exc:
            conn.close()
            raise StoreError(_describe(exc), op="open", path=self.path) from exc
        except RuntimeError as exc:
            conn.close()
            raise StoreError(str(exc), op="open", path=self.path) from exc
        try:
            if not mt.ensure_incremental_vacuum(conn, self.path) and self.path != ":memory:":
                log.warning(
                    "SQLite store %s uses auto_vacuum=NONE and there is no room to convert it: "
                    "evicted rows free pages for reuse but do not shrink the file", self.path,
                )
        except sqlite3.Error as exc:
            log.warning("SQLite store %s: cannot switch on incremental vacuum: %s", self.path, exc)
        mt.ensure_reserve(self.path, self._reserve_bytes)
        return conn

    def _check_tail(self, conn: sqlite3.Connection) -> None:
        """Log the streams whose stored alert counter lies below the ledger's: the database
        lost its last commits without reporting it (numbering continues above the ledger)."""
        behind = []
        for stream, mark in sorted(self.ids.marks.items()):
            row = conn.execute("SELECT value FROM counters WHERE name = ?",
                               (_ALERT_SEQ_PREFIX + stream,)).fetchone()
            stored = 0 if row is None else int(row[0])
            if stored < mark:
                behind.append(f"{stream} {stored} < {mark}")
        if behind:
            log.warning(
                "SQLite store %s lost its last commits without reporting corruption (alert "
                "counters behind the id ledger: %s); alert ids continue above the ledger, "
                "alerts of those commits are gone", self.path, ", ".join(behind),
            )

    # -- plumbing -------------------------------------------------------------------------------

    @contextmanager
    def _use(self, op: str, *, transaction: bool = False, durable: bool = False) -> Iterator[
        sqlite3.Connection
    ]:
        """Hold the lock, optionally in a ``BEGIN IMMEDIATE`` transaction; wrap sqlite3 errors."""
        with self._lock:
            conn = self._conn
            if conn is None and self.deferred is not None:
                conn = self._reopen(op)
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
                self._failures += 1
                self._last_error = (_describe(exc), self._monotonic())
                raise StoreError(_describe(exc), op=op, path=self.path) from exc

    def failure(self) -> StoreFailure:
        """The failures so far (any thread; no I/O)."""
        last = self._last_error
        return StoreFailure(self._failures, None if last is None else last[0],
                            None if last is None else last[1], self._alerts_not_stored)

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

    # -- calibrations ---------------------------------------------------------------------------

    def save_calibration(self, rec: StoredCalibration) -> None:
        """Keep ``rec`` as its stream's calibration (replaces the previous one); durable.

        Raises:
            StoreError: The write failed.
        """
        with self._use("save_calibration", transaction=True, durable=True) as conn:
            calibrations.save(conn, rec)

    def calibration(self, stream: str) -> StoredCalibration | None:
        """The stored calibration of ``stream``, or None.

        Raises:
            StoreError: The read failed, or the row does not parse.
        """
        with self._use("load_calibration") as conn:
            try:
                return calibrations.load(conn, stream)
            except ValueError as exc:
                raise StoreError(f"stored calibration of stream {stream}: {exc}",
                                 op="load_calibration", path=self.path) from exc

    # -- watched camera folders ----------------------------------------------------------------

    def scored_files(self, stream: str) -> dict[str, tuple[int, int]]:
        """The files of ``stream``'s watched folder already scored: name -> (size, mtime_ns).

        Raises:
            StoreError: The read failed.
        """
        with self._use("load_camera_files") as conn:
            return camera_files.load(conn, stream)

    def mark_file_scored(self, stream: str, name: str, size: int, mtime_ns: int) -> None:
        """Remember one file of ``stream``'s watched folder as scored (replaces the name's
        previous row). Not fsynced on its own: a power cut may forget the last marks (those
        files are scored again; :mod:`agent.sources.camera_watch`).

        Raises:
            StoreError: The write failed.
        """
        with self._use("mark_camera_file") as conn:
            camera_files.mark(conn, stream, name, size, mtime_ns, self._clock())

    def forget_scored_files(self, stream: str, names: Sequence[str]) -> None:
        """Forget files of ``stream``'s watched folder (gone from the folder).

        Raises:
            StoreError: The write failed.
        """
        with self._use("forget_camera_files", transaction=True) as conn:
            camera_files.forget(conn, stream, names)

    # -- camera alert snapshots -----------------------------------------------------------------

    def add_snapshot(self, alert_id: str, stream: str, meta: dict[str, Any], jpeg: bytes,
                     heatmap: bytes | None) -> bool:
        """Store the snapshot of ``alert_id`` (:mod:`agent.store.snapshots`); False when it
        already has one. Not fsynced on its own: a power cut may lose it, never the alert.

        Raises:
            StoreError: The write failed (the caller counts the snapshot as dropped).
        """
        with self._use("add_snapshot") as conn:
            added = snapshots.add(conn, alert_id, stream, meta, jpeg, heatmap, self._clock())
        self._maintain()
        return added

    def snapshot(self, alert_id: str) -> snapshots.Snapshot | None:
        """The stored snapshot of ``alert_id`` (None: none, or evicted).

        Raises:
            StoreError: The read failed.
        """
        with self._use("snapshot") as conn:
            return snapshots.get(conn, alert_id)

    def snapshots_to_publish(self) -> list[snapshots.Snapshot]:
        """The newest unpublished snapshot per stream (older ones become ``superseded``).

        Raises:
            StoreError: The read or write failed.
        """
        with self._use("snapshots_to_publish", transaction=True) as conn:
            return snapshots.to_publish(conn)

    def mark_snapshot_published(self, row_id: int, state: str | None, at: float | None) -> None:
        """Set a snapshot's MQTT state (``published`` with ``at``, ``oversize``, ``failed``;
        None: to be sent again).

        Raises:
            StoreError: The write failed.
        """
        with self._use("mark_snapshot") as conn:
            snapshots.mark_mqtt(conn, row_id, state, at)

    def snapshots_to_upload(self, limit: int) -> list[snapshots.Snapshot]:
        """Snapshots not uploaded yet whose alert the fleet acknowledged, oldest first.

        Raises:
            StoreError: The read failed.
        """
        with self._use("snapshots_to_upload") as conn:
            return snapshots.to_upload(conn, limit)

    def mark_snapshot_uploaded(self, row_id: int, state: str, at: float | None) -> None:
        """Set a snapshot's upload state (``uploaded`` with ``at``, or ``refused: <why>``).

        Raises:
            StoreError: The write failed.
        """
        with self._use("mark_snapshot") as conn:
            snapshots.mark_upload(conn, row_id, state, at)

    def snapshot_states(self, alert_ids: Sequence[str]) -> dict[str, tuple[Any, Any]]:
        """``alert_id -> (mqtt_state, upload_state)`` of those alerts' snapshots.

        Raises:
            StoreError: The read failed.
        """
        with self._use("snapshot_states") as conn:
            return snapshots.states(conn, alert_ids)

    # -- alerts / outbox ------------------------------------------------------------------------

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
            return cur.rowcount == 1

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

    # -- aggregates -----------------------------------------------------------------------------

    def add_aggregate(self, agg: Aggregate, policy: parts.RepeatPolicy = "same_readings") -> bool:
        """Store an aggregate under ``aggregate_id``, or as the next part of its interval.

        When the interval is already stored (the agent restarted within it), ``policy`` (by the
        stream's kind of source, :data:`agent.store.parts.RepeatPolicy`) decides: a live
        source's aggregate is the next part, ``<aggregate_id>:<k>``, logged once; a recorded
        input's is a duplicate when a stored part has the same readings (a replay of the same
        file stays idempotent), else the next part; a fast simulator's is a duplicate. Nothing
        is written for a duplicate. Non-finite numbers become NULL.

        Returns:
            True when stored (as any part), False when it duplicates a stored part.

        Raises:
            StoreError: The write failed (also: the interval has run out of part numbers).
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
        try:
            stored_as = self._insert_aggregate(agg, channels, policy)
        except StoreError as exc:
            if mt.is_disk_full(exc):
                self._make_room()  # for the next ones; this one is the caller's to count
            self._maintain()
            raise
        if stored_as is not None and stored_as != agg.aggregate_id:
            log.info(
                "stream %s: interval starting %s was already stored (the agent restarted within "
                "it); these readings are stored as part %s",
                agg.stream, iso_utc(agg.interval_start), stored_as,
            )
        if stored_as is not None and self._metrics is not None:
            self._metrics.aggregates_total.labels(stream=agg.stream).inc()
        self._maintain()
        return stored_as is not None

    def _insert_aggregate(
        self, agg: Aggregate, channels: str, policy: parts.RepeatPolicy
    ) -> str | None:
        """The id the aggregate was stored under, or None for a duplicate."""
        sql = (
            "INSERT {} INTO aggregates (aggregate_id, device_id, stream, interval_start,"
            " interval_s, count, channels, max_score, windows, alert_count) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )
        max_score = _finite_or_none(agg.max_score)
        row = (agg.device_id, agg.stream, agg.interval_start, agg.interval_s, agg.count,
               channels, max_score, agg.windows, agg.alert_count)
        with self._use("add_aggregate") as conn:
            if conn.execute(sql.format("OR IGNORE"), (agg.aggregate_id, *row)).rowcount == 1:
                return agg.aggregate_id
            try:
                part_id = parts.next_part_id(
                    conn, agg.aggregate_id, agg.interval_s, agg.count, channels, max_score,
                    agg.windows, agg.alert_count, policy,
                )
            except ValueError as exc:
                raise StoreError(str(exc), op="add_aggregate", path=self.path) from None
            if part_id is not None:
                conn.execute(sql.format(""), (part_id, *row))
            return part_id

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


    # -- cloud upload ---------------------------------------------------------------------------

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

    # -- disk budget ----------------------------------------------------------------------------

    def size_bytes(self) -> int:
        """Live bytes of the store: used pages plus the WAL file.

        Raises:
            StoreError: The read failed.
        """
        with self._use("size") as conn:
            used = mt.store_bytes(conn, self.path)
        if self._metrics is not None:
            self._metrics.store_bytes.set(used)
        return used

    def checkpoint(self) -> None:
        """Copy the WAL into the database, truncate it and return free pages to the file system.

        Raises:
            StoreError: The checkpoint failed.
        """
        with self._use("checkpoint") as conn:
            mt.reclaim(conn)
            self._last_checkpoint = self._monotonic()

    def _maintain(self) -> None:
        """After a write: run :meth:`enforce_budget` when the interval has passed (never raises)."""
        if self.path == ":memory:" or self._monotonic() < self._next_check:
            return
        mt.ensure_reserve(self.path, self._reserve_bytes)
        try:
            self.enforce_budget()
        except StoreError as exc:
            log.warning("store maintenance failed: %s", exc)

    def enforce_budget(self) -> int:
        """Checkpoint the WAL when due and evict rows while over the budget.

        Returns:
            Rows evicted by this call.

        Raises:
            StoreError: A statement failed (what was evicted before stays evicted).
        """
        now = self._monotonic()
        self._next_check = now + self._maintenance_interval_s
        evicted = 0
        with self._use("budget") as conn:
            if (
                mt.wal_bytes(self.path) > self.wal_limit_bytes
                or now - self._last_checkpoint >= mt.CHECKPOINT_EVERY_S
            ):
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
                self._last_checkpoint = now
            used = mt.store_bytes(conn, self.path)
            budget = self.budget_bytes
            if budget is not None and used > budget:
                mt.reclaim(conn)  # a checkpoint alone may be enough
                self._last_checkpoint = now
                used = mt.store_bytes(conn, self.path)
            if budget is not None and used > budget:
                evicted = self._evict_to(conn, int(budget * mt.LOW_WATER), used)
                used = mt.store_bytes(conn, self.path)
            elif self._evicting and (budget is None or used <= budget * mt.LOW_WATER):
                self._end_episode(used)
        if self._metrics is not None:
            self._metrics.store_bytes.set(used)
        return evicted

    def _evict_to(self, conn: sqlite3.Connection, target: int, used: int) -> int:
        evicted = 0
        for cls in self._classes:
            while used > target:
                if cls.table == "snapshots":
                    step = snapshots.rows_to_evict(conn, used - target)
                else:
                    total = sum(
                        int(conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0])  # noqa: S608
                        for t in ("alerts", "aggregates")
                    )
                    step = mt.rows_to_evict(used - target, used, total)
                n = mt.evict(conn, cls, step)
                if n == 0:
                    break
                evicted += n
                self._count_eviction(cls.kind, n)
                mt.reclaim(conn)
                self._last_checkpoint = self._monotonic()
                used = mt.store_bytes(conn, self.path)
        return evicted

    def _count_eviction(self, kind: str, n: int) -> None:
        if self._metrics is not None:
            self._metrics.dropped_total.labels(kind=kind, reason="budget").inc(n)
        if not self._evicting:
            self._evicting = True
            self._episode_evicted = {}
            log.warning(
                "SQLite store %s is over its budget (%s bytes) or the disk is full: evicting "
                "oldest rows (snapshots and uploaded aggregates first, unacknowledged alerts "
                "last)",
                self.path, self.budget_bytes,
            )
        self._episode_evicted[kind] = self._episode_evicted.get(kind, 0) + n

    def _end_episode(self, used: int) -> None:
        self._evicting = False
        log.warning(
            "SQLite store %s back under budget (%d bytes); evicted %s",
            self.path, used,
            ", ".join(f"{n} {k}(s)" for k, n in sorted(self._episode_evicted.items())),
        )

    def _make_room(self) -> bool:
        """On a full disk: evict aggregates (budget order) until the reserve file is back and
        the WAL has room to reach its bound; True if anything was evicted."""
        evicted = False
        with self._lock:
            conn = self._conn
            if conn is None:
                return False
            mt.release_reserve(self.path)
            try:
                # Truncating the WAL first gives the DELETE's own WAL frames room (the reserve
                # is at least twice the WAL bound, so this checkpoint has room to finish).
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
                for cls in self._classes[:3]:  # snapshots, then aggregates
                    # The DELETE itself needs WAL room: about half the free space.
                    step = self._room_step(conn)
                    for _ in range(_MAKE_ROOM_STEPS):
                        try:
                            n = mt.evict(conn, cls, step)
                        except sqlite3.Error as exc:  # rows bigger than the average: smaller
                            if not mt.is_disk_full(exc) or step == 1:
                                raise
                            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
                            step = max(1, step // 4)
                            continue
                        if not n:
                            break
                        evicted = True
                        self._count_eviction(cls.kind, n)
                        mt.reclaim(conn)
                        step = self._room_step(conn)
                        if (mt.ensure_reserve(self.path, self._reserve_bytes)
                                and mt.free_bytes(self.path) >= self.wal_limit_bytes):
                            return True
            except sqlite3.Error as exc:
                log.warning("disk full and eviction failed: %s", exc)
        return evicted

    def _room_step(self, conn: sqlite3.Connection) -> int:
        """Rows to delete in one full-disk eviction step: about half the free bytes' worth."""
        total = sum(
            int(conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0])  # noqa: S608
            for t in ("alerts", "aggregates")
        )
        per_row = mt.store_bytes(conn, self.path) / max(1, total)
        return max(1, min(4 * mt.MIN_EVICT_ROWS, int(mt.free_bytes(self.path) / 2 / per_row)))

    # -- lifecycle ------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection (idempotent); later calls raise :class:`StoreError`."""
        with self._lock:
            self.deferred = None
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
