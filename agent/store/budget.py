"""The store's disk budget: size, WAL checkpoints, eviction while over the budget and on a
full disk (the eviction order and the arithmetic: :mod:`agent.store.maintenance`).

:class:`StoreBudget` is a base of :class:`agent.store.sqlite.Store`.
"""

from __future__ import annotations

import contextlib
import sqlite3

from agent.errors import StoreError
from agent.store import maintenance as mt
from agent.store import snapshots
from agent.store.connection import StoreConnection, log

#: Most eviction steps per eviction class on one full-disk write.
_MAKE_ROOM_STEPS = 64


class StoreBudget(StoreConnection):
    """Budget checks and eviction of :class:`agent.store.sqlite.Store`."""

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
            mt.reclaim(conn, self.wal_limit_bytes)
            self._last_checkpoint = self._monotonic()

    def _maintain(self) -> None:
        """After a write: run :meth:`enforce_budget` when the interval has passed, and between
        two runs truncate the WAL as soon as it is past its bound (never raises). SQLite's own
        auto-checkpoint does not complete while the database file cannot grow (a full disk),
        and a second of fast writes would then carry the WAL far past its bound; one ``stat``
        per write keeps it there."""
        if self.path == ":memory:":
            return
        if self._monotonic() < self._next_check:
            if mt.wal_bytes(self.path) > self.wal_limit_bytes:
                # A failure here is reported by the next enforce_budget (at most once per
                # interval), not once per write.
                with contextlib.suppress(StoreError), self._use("checkpoint") as conn:
                    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
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
                mt.reclaim(conn, self.wal_limit_bytes)  # a checkpoint alone may be enough
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
                    step = mt.rows_to_evict(used - target, used, total, self.wal_limit_bytes)
                n = mt.evict(conn, cls, step)
                if n == 0:
                    break
                evicted += n
                self._count_eviction(cls.kind, n)
                mt.reclaim(conn, self.wal_limit_bytes)
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
        the WAL has room to reach its bound; True if anything was evicted.

        Each step deletes at most a quarter of the WAL bound's worth of rows, so the WAL stays
        within its bound while the disk is full."""
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
                        mt.reclaim(conn, self.wal_limit_bytes)
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
        room = min(mt.free_bytes(self.path) / 2, self.wal_limit_bytes / 4)  # its WAL frames
        return max(1, min(4 * mt.MIN_EVICT_ROWS, int(room / max(1.0, per_row))))
