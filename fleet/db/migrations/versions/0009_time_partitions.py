"""PostgreSQL: aggregates and alerts partitioned by time; alert ids deduplicated in alert_ids.

Revision ID: 0009
Revises: 0008
Create Date: 2026-01-04

SQLite: nothing (it stays the unpartitioned embedded default). PostgreSQL, per table (see
:mod:`fleet.db.partitions`; written out here so later edits never change this revision):

1. rename the table to ``<table>_0008``; create ``<table>`` ``PARTITION BY RANGE`` on its time
   column with the same columns (the ``pk`` sequence is kept, so ids continue);
2. create the DEFAULT partition and one partition per period from the oldest row's period (at
   most :data:`_MAX_BACK` periods back) to :data:`_AHEAD` periods past now; older or later
   rows land in the DEFAULT partition;
3. copy every row (``INSERT ... SELECT``), drop the old table, then add the keys and indexes
   (built once over the copied rows, not maintained row by row).

Unique constraints of a partitioned table must contain the partition key, so:

* ``aggregates``: ``uq_aggregates_id`` becomes ``(id, interval_start)``; ingest's
  ``ON CONFLICT`` targets it. The id determines the time: ingest accepts an aggregate only when
  its id carries ``round(interval_start * 1000)`` (:func:`fleet.ingest.id_number`), and a retry
  resends the stored record, so one id is one row.
* ``alerts``: an alert id (``<device>:<stream>:<seq>``) carries no time, so ids are
  deduplicated in a small table ``alert_ids (id PRIMARY KEY, device_id, window_start)``: ingest
  inserts there first and stores only the alerts whose id was new. ``alert_acks`` now references
  ``alert_ids`` (retention deletes ids with their alerts; acknowledgements go with them).

Indexes: ``pk_<table>`` ``(pk, time)``; ``ix_aggregates_series`` (device, stream, time) INCLUDE
the plotted columns (0007); ``ix_aggregates_interval_start`` becomes a BRIN index (only
retention's boundary delete reads it; a B-tree of 100 M timestamps is ~2 GB); the plain
``(device_id, stream, interval_start)`` index of 0001 is dropped (``ix_aggregates_series`` has
the same key). ``alerts`` keeps ``(device_id, stream, window_start)`` and ``(window_start)``.

The copy holds an exclusive lock on both tables for its duration (minutes per 10 M rows on a
small host): run this migration in a maintenance window on a large fleet.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

_AHEAD = 2
_MAX_BACK = 104

_TABLES: dict[str, tuple[str, str]] = {  # table: (time column, period)
    "aggregates": ("interval_start", "week"),
    "alerts": ("window_start", "month"),
}


def _floor(when: dt.datetime, period: str) -> dt.datetime:
    day = when.astimezone(dt.timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "week":
        return day - dt.timedelta(days=day.weekday())
    return day.replace(day=1)


def _next(start: dt.datetime, period: str) -> dt.datetime:
    if period == "week":
        return start + dt.timedelta(days=7)
    return (start.replace(day=28) + dt.timedelta(days=4)).replace(day=1)


def _sql(statement: str) -> Any:
    return op.get_bind().exec_driver_sql(statement)


def _partition(table: str, column: str, period: str) -> None:
    """Steps 1-3 of the module docstring for ``table``, keys and indexes excepted."""
    old = f"{table}_0008"
    seq = _sql(f"SELECT pg_get_serial_sequence('{table}', 'pk')").scalar()
    _sql(f'ALTER TABLE "{table}" RENAME TO "{old}"')
    _sql(f"ALTER SEQUENCE {seq} OWNED BY NONE")
    _sql(f'CREATE TABLE "{table}" (LIKE "{old}" INCLUDING DEFAULTS) '
         f"PARTITION BY RANGE ({column})")
    _sql(f'CREATE TABLE "{table}_default" PARTITION OF "{table}" DEFAULT')
    now = dt.datetime.now(dt.timezone.utc)
    start = _floor(now, period)
    oldest = _sql(f'SELECT min({column}) FROM "{old}"').scalar()  # noqa: S608
    for _ in range(_MAX_BACK):
        if oldest is None or start <= oldest:
            break
        start = _floor(start - dt.timedelta(days=1), period)
    last = now
    for _ in range(_AHEAD):
        last = _next(_floor(last, period), period)
    while start <= last:
        end = _next(start, period)
        _sql(f'CREATE TABLE "{table}_p{start:%Y%m%d}" PARTITION OF "{table}" FOR VALUES '
             f"FROM ('{start.isoformat()}') TO ('{end.isoformat()}')")
        start = end
    _sql(f'INSERT INTO "{table}" SELECT * FROM "{old}"')  # noqa: S608
    _sql(f'DROP TABLE "{old}"')
    _sql(f'ALTER SEQUENCE {seq} OWNED BY "{table}".pk')


def _unpartition(table: str) -> None:
    """Downgrade: the same rows in one plain table (keys and indexes excepted)."""
    new = f"{table}_0009"
    seq = _sql(f"SELECT pg_get_serial_sequence('{table}', 'pk')").scalar()
    _sql(f"ALTER SEQUENCE {seq} OWNED BY NONE")
    _sql(f'CREATE TABLE "{new}" (LIKE "{table}" INCLUDING DEFAULTS)')
    _sql(f'INSERT INTO "{new}" SELECT * FROM "{table}"')  # noqa: S608
    _sql(f'DROP TABLE "{table}" CASCADE')
    _sql(f'ALTER TABLE "{new}" RENAME TO "{table}"')
    _sql(f'ALTER SEQUENCE {seq} OWNED BY "{table}".pk')


def _device_fk(table: str) -> None:
    _sql(f'ALTER TABLE "{table}" ADD CONSTRAINT fk_{table}_device_id_devices FOREIGN KEY '
         "(device_id) REFERENCES devices (device_id) ON DELETE CASCADE")


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    _sql("ALTER TABLE alert_acks DROP CONSTRAINT fk_alert_acks_alert_id_alerts")
    for table, (column, period) in _TABLES.items():
        _partition(table, column, period)
        _sql(f'ALTER TABLE "{table}" ADD CONSTRAINT pk_{table} PRIMARY KEY (pk, {column})')
        _sql(f'ALTER TABLE "{table}" ADD CONSTRAINT uq_{table}_id UNIQUE (id, {column})')
        _device_fk(table)
    _sql("CREATE INDEX ix_aggregates_series ON aggregates (device_id, stream, interval_start) "
         "INCLUDE (max_score, windows, alert_count)")
    _sql("CREATE INDEX ix_aggregates_interval_start ON aggregates USING brin (interval_start)")
    _sql("CREATE INDEX ix_alerts_device_id_stream_window_start ON alerts "
         "(device_id, stream, window_start)")
    _sql("CREATE INDEX ix_alerts_window_start ON alerts (window_start)")
    _sql("CREATE TABLE alert_ids (id varchar(160) NOT NULL, device_id varchar(64) NOT NULL, "
         "window_start timestamptz NOT NULL, CONSTRAINT pk_alert_ids PRIMARY KEY (id))")
    _device_fk("alert_ids")
    _sql("INSERT INTO alert_ids (id, device_id, window_start) "
         "SELECT id, device_id, window_start FROM alerts")
    _sql("CREATE INDEX ix_alert_ids_window_start ON alert_ids (window_start)")
    _sql("ALTER TABLE alert_acks ADD CONSTRAINT fk_alert_acks_alert_id_alert_ids FOREIGN KEY "
         "(alert_id) REFERENCES alert_ids (id) ON DELETE CASCADE")
    _sql("ANALYZE aggregates")
    _sql("ANALYZE alerts")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    _sql("ALTER TABLE alert_acks DROP CONSTRAINT fk_alert_acks_alert_id_alert_ids")
    _sql("DROP TABLE alert_ids")
    for table, (column, _period) in _TABLES.items():
        _unpartition(table)
        _sql(f'ALTER TABLE "{table}" ADD CONSTRAINT pk_{table} PRIMARY KEY (pk)')
        _sql(f'ALTER TABLE "{table}" ADD CONSTRAINT uq_{table}_id UNIQUE (id)')
        _device_fk(table)
        _sql(f"CREATE INDEX ix_{table}_{column} ON {table} ({column})")
        _sql(f"CREATE INDEX ix_{table}_device_id_stream_{column} ON {table} "
             f"(device_id, stream, {column})")
    _sql("CREATE INDEX ix_aggregates_series ON aggregates (device_id, stream, interval_start) "
         "INCLUDE (max_score, windows, alert_count)")
    _sql("ALTER TABLE alert_acks ADD CONSTRAINT fk_alert_acks_alert_id_alerts FOREIGN KEY "
         "(alert_id) REFERENCES alerts (id) ON DELETE CASCADE")
