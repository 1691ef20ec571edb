"""The store's connection: opening (integrity check, quarantine, deferred open on a full
disk), the lock, transactions and the mapping of ``sqlite3`` errors to
:class:`agent.errors.StoreError`.

:class:`StoreConnection` is the base of :class:`agent.store.sqlite.Store` (whose docstring gives
the arguments and the errors raised at open); the method groups built on it live in
:mod:`agent.store.budget`, :mod:`agent.store.outbox`, :mod:`agent.store.aggregates` and
:mod:`agent.store.uploads`.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from agent.errors import StoreError
from agent.metrics import Metrics
from agent.store import codes
from agent.store import maintenance as mt
from agent.store.deferred import Deferred, bare_message, no_room
from agent.store.ids import IdLedger
from agent.store.schema import migrate

Clock = Callable[[], float]

log = logging.getLogger("agent.store")

_ALERT_SEQ_PREFIX = "alert_seq:"
#: Counter holding the least alert sequence number of a store that replaced a quarantined one
#: (:meth:`Store._open`): every stream's alert numbers continue above it.
_ALERT_SEQ_BASE = "alert_seq_base"


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


class StoreConnection:
    """One SQLite connection behind a lock (see :class:`agent.store.sqlite.Store` for the
    arguments and the errors raised at open)."""

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
        #: Largest aggregates row id when the store was opened: rows above it are this
        #: process's (ids only grow), so an interval stored again is no restart within it.
        self._aggregates_base = 0
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
            (top,) = conn.execute("SELECT MAX(id) FROM aggregates").fetchone()
            self._aggregates_base = int(top or 0)
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

    def close(self) -> None:
        """Close the connection (idempotent); later calls raise :class:`StoreError`."""
        with self._lock:
            self.deferred = None
            if self._conn is not None:
                self._conn.close()
                self._conn = None
