"""Time partitions of ``aggregates`` and ``alerts`` on PostgreSQL (migration ``0009``).

Both tables are declaratively partitioned by ``RANGE`` on their record time: ``aggregates`` by
``interval_start`` in ISO weeks (Monday 00:00 UTC; a 10,000-device fleet stores ~100 M
aggregates a week), ``alerts`` by ``window_start`` in calendar months. Partitions are named
``<table>_p<YYYYMMDD of their lower bound>``; ``<table>_default`` (the DEFAULT partition) takes
any row outside every partition (a device clock years off, data older than the partitions the
migration made), so ingest never fails for want of a partition.

:class:`PartitionMaintainer` (called by the housekeeping thread of every serving process, at
most hourly) creates the partitions of the current period and :data:`AHEAD` more, under a
transaction-scoped advisory lock so replicas never race on the catalog. A new partition is
made beside the table, the DEFAULT partition's rows of its range are moved into it, then it is
attached: attaching a range that the DEFAULT partition still holds rows of would fail.

:func:`drop_older` is retention's part (:class:`fleet.db.retention.Retention`): a partition
whose upper bound is at or before the cutoff is detached and dropped (no row-by-row delete, no
dead tuples, no vacuum); rows older than the cutoff in the boundary partition and in the
DEFAULT partition are then deleted in batches as before.

SQLite stays unpartitioned: every function here is only called on PostgreSQL.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import Connection, Engine, text

_log = logging.getLogger(__name__)

#: Periods created ahead of the current one.
AHEAD = 2
#: Least time between two runs of :meth:`PartitionMaintainer.maybe_run` (seconds).
MAINTAIN_EVERY_S = 3600.0
#: How long partition DDL waits for a table lock before giving up until the next run (ingest
#: queued behind an ACCESS EXCLUSIVE lock request waits too, so keep this short).
LOCK_TIMEOUT = "2s"
#: ``pg_advisory_xact_lock`` key of partition maintenance (any constant shared by replicas).
ADVISORY_KEY = 0x0F1EE7_0009


@dataclass(frozen=True)
class PartitionSpec:
    """How one table is partitioned: ``column`` in ``period`` ranges."""

    table: str
    column: str
    period: Literal["week", "month"]

    def floor(self, when: dt.datetime) -> dt.datetime:
        """Start of the period holding ``when`` (aware UTC).

        >>> thursday = dt.datetime(2026, 1, 8, 13, tzinfo=dt.timezone.utc)
        >>> SPECS["aggregates"].floor(thursday).isoformat()
        '2026-01-05T00:00:00+00:00'
        >>> SPECS["alerts"].floor(thursday).isoformat()
        '2026-01-01T00:00:00+00:00'
        """
        day = when.astimezone(dt.timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
        if self.period == "week":
            return day - dt.timedelta(days=day.weekday())
        return day.replace(day=1)

    def next(self, start: dt.datetime) -> dt.datetime:
        """Start of the period after the one starting at ``start``."""
        if self.period == "week":
            return start + dt.timedelta(days=7)
        return (start.replace(day=28) + dt.timedelta(days=4)).replace(day=1)

    def name(self, start: dt.datetime) -> str:
        return f"{self.table}_p{start:%Y%m%d}"


SPECS: dict[str, PartitionSpec] = {
    "aggregates": PartitionSpec("aggregates", "interval_start", "week"),
    "alerts": PartitionSpec("alerts", "window_start", "month"),
}


@dataclass(frozen=True)
class Partition:
    """One range partition: rows with ``lower <= time < upper``."""

    name: str
    lower: dt.datetime
    upper: dt.datetime


def is_partitioned(conn: Connection, table: str) -> bool:
    """True when ``table`` is a partitioned table (PostgreSQL, after migration ``0009``)."""
    if conn.dialect.name != "postgresql":
        return False
    kind = conn.execute(text(
        "SELECT c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relname = :t AND n.nspname = current_schema()"), {"t": table}).scalar()
    return kind == "p"


def partitions(conn: Connection, spec: PartitionSpec) -> list[Partition]:
    """The range partitions of ``spec.table`` (not the DEFAULT one), oldest first."""
    names = conn.execute(text(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = to_regclass(:t)"), {"t": spec.table}).scalars().all()
    found = []
    pattern = re.compile(rf"^{spec.table}_p(\d{{8}})$")
    for name in names:
        match = pattern.match(name)
        if match:
            lower = dt.datetime.strptime(match.group(1), "%Y%m%d").replace(tzinfo=dt.timezone.utc)
            found.append(Partition(name, lower, spec.next(lower)))
    return sorted(found, key=lambda p: p.lower)


def ensure(conn: Connection, spec: PartitionSpec, since: dt.datetime,
           until: dt.datetime) -> list[str]:
    """Create the missing partitions of every period from the one holding ``since`` to the one
    holding ``until`` (inclusive), moving rows of their ranges out of the DEFAULT partition;
    returns the names created. Runs in the caller's transaction."""
    have = {p.name for p in partitions(conn, spec)}
    made = []
    start = spec.floor(since)
    while start <= until:
        end = spec.next(start)
        name = spec.name(start)
        if name not in have:
            _create(conn, spec, name, start, end)
            made.append(name)
        start = end
    return made


def _create(conn: Connection, spec: PartitionSpec, name: str, lower: dt.datetime,
            upper: dt.datetime) -> None:
    t, col = spec.table, spec.column  # names from SPECS, never from input
    bounds = {"lo": lower, "hi": upper}
    conn.exec_driver_sql(f'CREATE TABLE "{name}" (LIKE "{t}" INCLUDING DEFAULTS)')
    moved = conn.execute(text(
        f'WITH m AS (DELETE FROM "{t}_default" WHERE {col} >= :lo AND {col} < :hi '  # noqa: S608
        f'RETURNING *) INSERT INTO "{name}" SELECT * FROM m'), bounds).rowcount
    conn.exec_driver_sql(_attach_sql(t, name, lower, upper))
    if moved:
        _log.info("partition %s: moved %d row(s) from %s_default", name, moved, t)


def _attach_sql(table: str, name: str, lower: dt.datetime, upper: dt.datetime) -> str:
    """``ATTACH PARTITION`` takes literal bounds only (no parameters)."""
    return (f'ALTER TABLE "{table}" ATTACH PARTITION "{name}" FOR VALUES FROM '
            f"('{lower.isoformat()}') TO ('{upper.isoformat()}')")


def drop_older(conn: Connection, spec: PartitionSpec, cutoff: dt.datetime) -> list[str]:
    """Detach and drop every partition whose rows are all older than ``cutoff`` (its upper
    bound at or before it); returns the names dropped. Runs in the caller's transaction."""
    gone = []
    for part in partitions(conn, spec):
        if part.upper <= cutoff:
            conn.exec_driver_sql(f'ALTER TABLE "{spec.table}" DETACH PARTITION "{part.name}"')
            conn.exec_driver_sql(f'DROP TABLE "{part.name}"')
            gone.append(part.name)
    return gone


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class PartitionMaintainer:
    """Creates the partitions of the current period and :data:`AHEAD` more, at most once per
    ``every_s`` (a no-op on SQLite and before migration ``0009``).

    Args:
        engine: The fleet database.
        ahead: Periods created past the current one.
        every_s: Least time between two runs of :meth:`maybe_run`.
        clock: Aware UTC now.
    """

    def __init__(self, engine: Engine, *, ahead: int = AHEAD, every_s: float = MAINTAIN_EVERY_S,
                 clock: Callable[[], dt.datetime] = _now) -> None:
        self._engine = engine
        self.ahead = ahead
        self.every_s = every_s
        self._clock = clock
        self._last: dt.datetime | None = None
        self._lock = threading.Lock()

    def run(self) -> list[str]:
        """Create the missing partitions now; returns their names."""
        if self._engine.dialect.name != "postgresql":
            return []
        now = self._clock()
        made: list[str] = []
        with self._engine.begin() as conn:
            conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": ADVISORY_KEY})
            for spec in SPECS.values():
                if not is_partitioned(conn, spec.table):
                    continue
                until = now
                for _ in range(self.ahead):
                    until = spec.next(spec.floor(until))
                made += ensure(conn, spec, now, until)
        if made:
            _log.info("created partition(s): %s", ", ".join(made))
        return made

    def maybe_run(self) -> list[str]:
        """:meth:`run` when the last run is ``every_s`` old (or none yet), else ``[]``."""
        now = self._clock()
        with self._lock:
            if self._last is not None and (now - self._last).total_seconds() < self.every_s:
                return []
            self._last = now
        return self.run()
