"""Age-based retention: of model status reports (:class:`StatusRetention`) and of every table
the operator names (:class:`Retention`, ``edge-fleet serve --retention alerts=365d,...``).

Every :class:`~cloud_sync.protocol.ModelStatusReport` a device sends is one row; without
pruning the table grows for as long as the fleet runs. :class:`StatusRetention` deletes the rows
received more than ``max_age_s`` ago. It is called after each stored report and does the work at
most once per ``every_s`` per process (one ``DELETE ... WHERE received_at < cutoff``), so a fleet
that receives reports prunes them hourly, with no background thread and with any number of
worker processes (each prunes at most hourly; the deletes are idempotent). The per-device state
of a rollout lives in ``rollout_devices`` and is never pruned.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable

from sqlalchemy import Engine, MetaData, Table, delete, inspect, literal, select
from sqlalchemy.exc import OperationalError

from fleet.db.model_tables import model_status_reports
from fleet.db.partitions import LOCK_TIMEOUT, SPECS, PartitionSpec, drop_older, is_partitioned
from fleet.db.schema import UtcDateTime

#: Default age after which a status report is deleted (days).
DEFAULT_STATUS_RETENTION_DAYS = 90.0
#: How often one process prunes at most (seconds).
PRUNE_EVERY_S = 3600.0

_log = logging.getLogger(__name__)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class StatusRetention:
    """Deletes status reports older than ``max_age_s``, at most once per ``every_s``.

    Args:
        engine: The fleet database.
        max_age_s: Age (by ``received_at``) past which a report is deleted, seconds (> 0).
        every_s: Least time between two prunes of this instance, seconds.
        clock: Wall clock (aware UTC).

    Raises:
        ValueError: ``max_age_s`` is not positive.
    """

    def __init__(
        self,
        engine: Engine,
        max_age_s: float,
        *,
        every_s: float = PRUNE_EVERY_S,
        clock: Callable[[], dt.datetime] = _now,
    ) -> None:
        if not max_age_s > 0:
            raise ValueError("max_age_s must be positive")
        self._engine = engine
        self.max_age_s = max_age_s
        self.every_s = every_s
        self._clock = clock
        self._last: dt.datetime | None = None
        self._lock = threading.Lock()

    def prune(self) -> int:
        """Delete every report older than ``max_age_s`` now; returns the rows deleted."""
        cutoff = self._clock() - dt.timedelta(seconds=self.max_age_s)
        with self._engine.begin() as conn:
            deleted = conn.execute(
                delete(model_status_reports).where(model_status_reports.c.received_at < cutoff)
            ).rowcount
        if deleted:
            _log.info("deleted %d model status report(s) received before %s", deleted,
                      cutoff.isoformat(timespec="seconds"))
        return int(deleted or 0)

    def maybe_prune(self) -> int:
        """:meth:`prune` when the last prune of this instance is ``every_s`` old (or none yet)."""
        now = self._clock()
        with self._lock:
            if self._last is not None and (now - self._last).total_seconds() < self.every_s:
                return 0
            self._last = now
        return self.prune()


# --- every table ---------------------------------------------------------------------------------

#: What ``--retention NAME=AGE`` can name: table and the column its age is counted by. Alerts and
#: aggregates age by their record time (``window_start``, ``interval_start``: indexed, and what
#: the console shows), the others by when the fleet received or created them. ``audit`` is the
#: operator audit log (``audit_log.at``); a name whose table does not exist is skipped.
RETENTION_TABLES: dict[str, tuple[str, str]] = {
    "alerts": ("alerts", "window_start"),
    "aggregates": ("aggregates", "interval_start"),
    "samples": ("samples", "received_at"),
    "status_reports": ("model_status_reports", "received_at"),
    "health": ("device_health", "received_at"),
    "audit": ("audit_log", "at"),
    "webhook_deliveries": ("webhook_deliveries", "created_at"),
}
#: Defaults (seconds; 0 keeps forever): user data is kept until an operator says otherwise;
#: health rows of devices silent a month and finished webhook deliveries after 30 days.
DEFAULT_RETENTION_S: dict[str, float] = {
    "alerts": 0.0, "aggregates": 0.0, "samples": 0.0,
    "status_reports": DEFAULT_STATUS_RETENTION_DAYS * 86400, "health": 30 * 86400.0,
    "audit": 0.0, "webhook_deliveries": 30 * 86400.0,
}
#: Tables pruned with a retention name, by the same age: PostgreSQL's alert id table (migration
#: ``0009``; deleting an id deletes its acknowledgement).
_COMPANIONS: dict[str, tuple[str, str]] = {"alerts": ("alert_ids", "window_start")}
#: Rows one DELETE removes at most (short transactions: ingest is never blocked for long).
BATCH_ROWS = 10_000
#: Batches one run removes at most per table (the rest waits for the next run).
MAX_BATCHES = 100
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_retention(spec: str) -> dict[str, float]:
    """``alerts=365d,aggregates=90d,...`` -> seconds per name (``0`` or ``keep``: forever).

    >>> parse_retention("alerts=365d, aggregates=12h,samples=keep")
    {'alerts': 31536000.0, 'aggregates': 43200.0, 'samples': 0.0}

    Raises:
        ValueError: an unknown name, a repeated one, or an age that is not ``<number><s|m|h|d|w>``.
    """
    out: dict[str, float] = {}
    for item in (p.strip() for p in spec.split(",")):
        if not item:
            continue
        name, sep, age = (x.strip() for x in item.partition("="))
        if not sep or name not in RETENTION_TABLES or name in out:
            raise ValueError(f"retention {item!r}: use NAME=AGE with NAME one of "
                             f"{', '.join(RETENTION_TABLES)} (each once)")
        if age in ("0", "keep"):
            out[name] = 0.0
            continue
        try:
            value = float(age[:-1]) * _UNITS[age[-1:]]
        except (KeyError, ValueError):
            raise ValueError(f"retention {item!r}: age must be like 90d, 12h, 30m, 3600s, 2w "
                             "or keep") from None
        if not 0 < value <= 100 * 365 * 86400:
            raise ValueError(f"retention {item!r}: age must be positive, at most 100 years")
        out[name] = value
    return out


class Retention:
    """Deletes rows older than each table's age, in batches, at most once per ``every_s``.

    Each batch is one ``DELETE ... WHERE <pk> IN (SELECT <pk> ... WHERE <time> < cutoff LIMIT
    n)`` in its own transaction, so a large backlog of old rows never holds a long lock. On
    PostgreSQL, alerts and aggregates are partitioned by time: the partitions wholly older than
    the cutoff are first detached and dropped (:func:`fleet.db.partitions.drop_older`), so the
    batches only delete in the boundary and DEFAULT partitions. Pending
    webhook deliveries are never deleted (only delivered and dead ones). Safe to run from every
    worker process at once (the deletes are idempotent).

    Args:
        engine: The fleet database.
        ages_s: Seconds per name of :data:`RETENTION_TABLES`; 0 or absent keeps forever.
        every_s: Least time between two runs of :meth:`maybe_run`, seconds.
        batch_rows: Rows per DELETE.
        clock: Aware UTC now.
    """

    def __init__(self, engine: Engine, ages_s: dict[str, float], *,
                 every_s: float = PRUNE_EVERY_S, batch_rows: int = BATCH_ROWS,
                 clock: Callable[[], dt.datetime] = _now) -> None:
        unknown = set(ages_s) - set(RETENTION_TABLES)
        if unknown:
            raise ValueError(f"unknown retention names: {sorted(unknown)}")
        self._engine = engine
        self.ages_s = {k: v for k, v in ages_s.items() if v > 0}
        self.every_s = every_s
        self.batch_rows = batch_rows
        self._clock = clock
        self._last: dt.datetime | None = None
        self._lock = threading.Lock()
        self._tables: dict[str, Table | None] = {}

    def _table(self, name: str) -> Table | None:
        if name not in self._tables:
            table_name = RETENTION_TABLES[name][0]
            if not inspect(self._engine).has_table(table_name):
                _log.info("retention of %s: no table %s here, skipped", name, table_name)
                self._tables[name] = None
            else:
                self._tables[name] = Table(table_name, MetaData(), autoload_with=self._engine)
        return self._tables[name]

    def run(self) -> dict[str, int]:
        """Prune every configured table now; returns the rows deleted per name."""
        now = self._clock()
        done: dict[str, int] = {}
        for name, age in self.ages_s.items():
            table = self._table(name)
            if table is None:
                continue
            done[name] = self._prune(name, table, now - dt.timedelta(seconds=age))
        return done

    def _prune(self, name: str, table: Table, cutoff: dt.datetime) -> int:
        spec = SPECS.get(name)
        if spec is not None and self._engine.dialect.name == "postgresql":
            self._drop_partitions(spec, cutoff)
        total = self._delete(name, table, RETENTION_TABLES[name][1], cutoff)
        companion = _COMPANIONS.get(name)
        if companion is not None and inspect(self._engine).has_table(companion[0]):
            ids = Table(companion[0], MetaData(), autoload_with=self._engine)
            self._delete(name, ids, companion[1], cutoff)
        return total

    def _drop_partitions(self, spec: PartitionSpec, cutoff: dt.datetime) -> None:
        """PostgreSQL: detach and drop the partitions wholly older than ``cutoff`` (what is left
        older than it, in the boundary and DEFAULT partitions, :meth:`_delete` deletes)."""
        try:
            with self._engine.begin() as conn:
                if not is_partitioned(conn, spec.table):
                    return
                conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
                gone = drop_older(conn, spec, cutoff)
        except OperationalError as exc:  # lock_timeout: ingest was busy, try next run
            _log.warning("retention: partitions of %s not dropped now: %s", spec.table, exc)
            return
        if gone:
            _log.info("retention: dropped partition(s) %s (all rows older than %s)",
                      ", ".join(gone), cutoff.isoformat(timespec="seconds"))

    def _delete(self, name: str, table: Table, column: str, cutoff: dt.datetime) -> int:
        time_col = table.c[column]
        pk = next(iter(table.primary_key.columns))
        is_old = time_col < literal(cutoff, UtcDateTime())
        old = select(pk).where(is_old)
        if name == "webhook_deliveries":
            old = old.where(table.c.state != "pending")
        total = 0
        for _ in range(MAX_BATCHES):
            with self._engine.begin() as conn:
                n = int(conn.execute(  # is_old again: prunes a partitioned table's partitions
                    delete(table).where(pk.in_(old.limit(self.batch_rows).scalar_subquery()),
                                        is_old)
                ).rowcount or 0)
            total += n
            if n < self.batch_rows:
                break
        if total:
            _log.info("retention: deleted %d %s row(s) older than %s", total, name,
                      cutoff.isoformat(timespec="seconds"))
        return total

    def maybe_run(self) -> dict[str, int]:
        """:meth:`run` when the last run is ``every_s`` old (or none yet), else ``{}``."""
        now = self._clock()
        with self._lock:
            if self._last is not None and (now - self._last).total_seconds() < self.every_s:
                return {}
            self._last = now
        return self.run()
