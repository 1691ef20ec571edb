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

Adapted baselines of univariate streams (the pipeline thread): ``save_baseline`` (every minute
and at shutdown), ``baseline`` and ``forget_baseline`` (at start): :mod:`agent.store.baselines`.

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

Modules by role: the connection, lock and error mapping :mod:`agent.store.connection`; the
disk budget :mod:`agent.store.budget`; counters and the alert outbox :mod:`agent.store.outbox`;
aggregates :mod:`agent.store.aggregates`; the cloud upload queue :mod:`agent.store.uploads`.
:class:`Store` is all of them in one object, with the calibrations, camera files and snapshots.

Failures are remembered for health (:meth:`Store.failure`): the last error, when, how many, and
how many alerts could not be stored (the agent delivers those over MQTT from memory).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agent.errors import StoreError
from agent.pipeline.baseline_restore import StoredBaseline
from agent.pipeline.restore import StoredCalibration
from agent.store import baselines, calibrations, camera_files, snapshots
from agent.store.aggregates import StoreAggregates
from agent.store.connection import Clock, StoreFailure
from agent.store.outbox import OutboxRow, StoreOutbox
from agent.store.uploads import RecordKind, StoreUploads, UploadRow, id_runs

__all__ = [
    "Clock",
    "OutboxRow",
    "RecordKind",
    "Store",
    "StoreFailure",
    "UploadRow",
    "id_runs",
]


class Store(StoreOutbox, StoreAggregates, StoreUploads):
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

    # -- adapted baselines ------------------------------------------------------------------------

    def save_baseline(self, rec: StoredBaseline, *, durable: bool = False) -> None:
        """Keep ``rec`` as its stream's adapted baseline (replaces the previous one). Not
        fsynced unless ``durable`` (the shutdown's save): a power cut may lose the last save.

        Raises:
            StoreError: The write failed, or a value is not finite (nothing written).
        """
        with self._use("save_baseline", durable=durable) as conn:
            try:
                baselines.save(conn, rec)
            except ValueError as exc:
                raise StoreError(f"baseline of stream {rec.stream}: {exc}", op="save_baseline",
                                 path=self.path) from exc

    def baseline(self, stream: str) -> StoredBaseline | None:
        """The stored adapted baseline of ``stream``, or None.

        Raises:
            StoreError: The read failed, or the row does not parse.
        """
        with self._use("load_baseline") as conn:
            try:
                return baselines.load(conn, stream)
            except ValueError as exc:
                raise StoreError(f"stored baseline of stream {stream}: {exc}",
                                 op="load_baseline", path=self.path) from exc

    def forget_baseline(self, stream: str) -> None:
        """Delete the stored adapted baseline of ``stream``.

        Raises:
            StoreError: The write failed.
        """
        with self._use("forget_baseline") as conn:
            baselines.forget(conn, stream)

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

    # -- lifecycle ------------------------------------------------------------------------------

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
