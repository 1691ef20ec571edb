"""Record store: idempotent batch insert and time-range queries for alerts and aggregates.

One ingest batch is ONE transaction: the device row update (last_seen, backlog, versions) and
every insert commit together or not at all. Inserts are ``INSERT ... ON CONFLICT (id) DO
NOTHING RETURNING id`` with the dialect's own ``insert`` (PostgreSQL, SQLite >= 3.35): the
returned ids are exactly the rows stored now; every other id was already there (duplicate).
Concurrent retries of the same batch are safe: the unique index arbitrates. On PostgreSQL the
tables are partitioned by time (migration ``0009``, :mod:`fleet.db.partitions`), so the unique
keys hold the time: aggregates conflict on ``(id, interval_start)`` (the id carries the interval
start, checked by :mod:`fleet.ingest`), and an alert is stored only when its id was new in
``alert_ids`` (an alert id carries no time).

Per-batch cost (a 5,000-record backlog batch, or 200 gateways a second) is kept off the Python
side: no ORM objects and no per-value SQLAlchemy bind processing.

* PostgreSQL: ONE statement per batch, in autocommit (a single statement is its own atomic,
  durable transaction: ``synchronous_commit`` stays on): data-modifying CTEs update the device
  row and insert each table's rows from one ``jsonb`` parameter (``jsonb_populate_recordset``),
  returning the ids stored now. The text never changes, so psycopg prepares it server-side after
  a few executions per connection; one round trip instead of BEGIN/UPDATE/INSERT/INSERT/COMMIT.
* SQLite: one ``BEGIN`` ... ``COMMIT`` (the device update and multi-row ``INSERT ... VALUES ...
  RETURNING id`` chunks), values converted once in Python to exactly what SQLAlchemy's types
  would store (naive-UTC datetime text, JSON text).

Schema-2 aggregates arrive as columns (:class:`AggregateColumnRows`) and are stored from them:
on PostgreSQL by one more CTE of the same statement (``INSERT ... SELECT ... FROM unnest(<one
array parameter per column>)``, channels cast from the device's text to ``jsonb``); on SQLite
the ids already stored are looked up in one query (``json_each`` over the id list) under the
transaction's write lock (taken by the device update that comes first, so no other writer can
insert in between), and the others are inserted by ONE ``executemany`` over ``zip`` of the
columns (channels stored as the device's text, checked by :mod:`fleet.ingest`).
"""

from __future__ import annotations

import datetime as dt
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any

from pydantic_core import to_json
from sqlalchemy import JSON, Connection, Engine, Table, select, update

from fleet.db.schema import UtcDateTime, aggregates, alerts, devices

#: Rows per multi-row ``INSERT ... VALUES`` on SQLite (11-13 columns: well under the 32,766
#: bound-parameter limit; one compiled statement per chunk size, cached by sqlite3).
SQLITE_CHUNK_ROWS = 500


@dataclass(frozen=True)
class DeviceReport:
    """What a batch says about its device (stored on ``devices``)."""

    agent_version: str
    model_name: str | None
    model_version: int | None
    backlog_alerts: int
    backlog_aggregates: int


@dataclass(frozen=True)
class AggregateColumnRows:
    """Checked schema-2 aggregates to store, as columns (entry ``i`` of every list is one row).

    Built by :func:`fleet.ingest.prepare_columns`: ownership checked, no id twice. Values as the
    ``aggregates`` table takes them: ``interval_start`` aware UTC, ``interval_s`` seconds,
    ``channels`` the JSON text of the channel list (checked: valid, of the schema, storable).

    Attributes:
        indexes: The batch index of each entry (for the answer).
    """

    indexes: list[int]
    ids: list[str]
    streams: list[str]
    interval_start: list[dt.datetime]
    interval_s: list[float]
    count: list[int]
    channels: list[str]
    max_score: list[float | None]
    windows: list[int]
    alert_count: list[int]


@dataclass(frozen=True)
class TimeQuery:
    """A query over one device's records.

    Attributes:
        device_id: Whose records.
        stream: Only this stream, or all.
        since: Inclusive lower bound on the record time (aware UTC), or none.
        until: Exclusive upper bound, or none.
        limit: Most rows returned (oldest first).
    """

    device_id: str
    stream: str | None = None
    since: dt.datetime | None = None
    until: dt.datetime | None = None
    limit: int = 1000


class RecordStore:
    """Alerts and aggregates in the database.

    Args:
        engine: The SQLAlchemy engine (SQLite or PostgreSQL).
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._postgres = engine.dialect.name == "postgresql"
        if not self._postgres and engine.dialect.name != "sqlite":
            raise ValueError(f"unsupported database {engine.dialect.name!r}")
        self._pg_ingest = _pg_ingest_sql()

    def ingest(
        self,
        device_id: str,
        report: DeviceReport,
        rows: dict[str, list[dict[str, Any]]],
        seen_at: dt.datetime,
        columns: AggregateColumnRows | None = None,
    ) -> set[tuple[str, str]]:
        """Store a batch's rows in one transaction and update the device.

        Args:
            device_id: The authenticated device.
            report: Versions and backlog from the batch envelope.
            rows: ``{"alert": [...], "aggregate": [...]}`` rows (see :mod:`fleet.ingest`).
            seen_at: New ``last_seen`` (aware UTC); also every row's ``received_at``.
            columns: More aggregates, as columns (no id also in ``rows``).

        Returns:
            ``(kind, id)`` of the rows inserted now; the others were duplicates.

        Raises:
            sqlalchemy.exc.OperationalError: The database failed (mapped to 503 by the API).
        """
        if self._postgres:
            return self._ingest_pg(device_id, report, rows, seen_at, columns)
        new: set[tuple[str, str]] = set()
        with self._engine.begin() as conn:
            values: dict[str, Any] = {
                "last_seen": seen_at,
                "agent_version": report.agent_version or None,
                "backlog_alerts": report.backlog_alerts,
                "backlog_aggregates": report.backlog_aggregates,
            }
            if report.model_name is not None:
                values |= {"model_name": report.model_name, "model_version": report.model_version}
            conn.execute(update(devices).where(devices.c.device_id == device_id).values(**values))
            for kind, table in (("alert", alerts), ("aggregate", aggregates)):
                for inserted in _insert_sqlite(conn, table, rows.get(kind, [])):
                    new.add((kind, inserted))
            if columns is not None and columns.ids:
                for inserted in _insert_columns_sqlite(conn, device_id, columns, seen_at):
                    new.add(("aggregate", inserted))
        return new

    def _ingest_pg(
        self,
        device_id: str,
        report: DeviceReport,
        rows: dict[str, list[dict[str, Any]]],
        seen_at: dt.datetime,
        columns: AggregateColumnRows | None,
    ) -> set[tuple[str, str]]:
        c = columns if columns is not None else AggregateColumnRows(*([] for _ in range(10)))
        params = (
            seen_at, report.agent_version or None, report.backlog_alerts,
            report.backlog_aggregates, report.model_name, report.model_name,
            report.model_version, device_id,
            to_json(rows.get("alert", [])).decode(),
            to_json(rows.get("aggregate", [])).decode(),
            device_id, seen_at, c.ids, c.streams, c.interval_start, c.interval_s, c.count,
            c.max_score, c.windows, c.alert_count,
            # each text is ONE JSON value (checked), so joined they are an array of len(ids)
            "[" + ",".join(c.channels) + "]",
        )
        with self._engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            result = conn.exec_driver_sql(self._pg_ingest, params)
            return {(str(kind), str(rid)) for kind, rid in result}

    def aggregates(self, query: TimeQuery) -> list[dict[str, Any]]:
        """Aggregates by ``interval_start`` (oldest first)."""
        return self._select(aggregates, aggregates.c.interval_start, query)

    def alerts(self, query: TimeQuery) -> list[dict[str, Any]]:
        """Alerts by ``window_start`` (oldest first), each with its lifecycle ``event`` and
        ``episode_id`` from the stored payload (a schema-1 alert: ``raised``, its own id)."""
        rows = self._select(alerts, alerts.c.window_start, query)
        for row in rows:
            payload = row.get("payload")
            body = payload if isinstance(payload, dict) else {}
            row["event"] = body.get("event") or "raised"
            row["episode_id"] = body.get("episode_id") or row["id"]
        return rows

    def _select(self, table: Table, time_col: Any, query: TimeQuery) -> list[dict[str, Any]]:
        stmt = select(*[c for c in table.c if c.name != "pk"]).where(
            table.c.device_id == query.device_id
        )
        if query.stream is not None:
            stmt = stmt.where(table.c.stream == query.stream)
        if query.since is not None:
            stmt = stmt.where(time_col >= query.since)
        if query.until is not None:
            stmt = stmt.where(time_col < query.until)
        stmt = stmt.order_by(time_col, table.c.id).limit(query.limit)
        with self._engine.connect() as conn:
            return [dict(row._mapping) for row in conn.execute(stmt)]


def _insert_sqlite(conn: Connection, table: Table, rows: Sequence[dict[str, Any]]) -> list[str]:
    """SQLite: insert ``rows`` (multi-row VALUES chunks) and return the ids stored now."""
    if not rows:
        return []
    names = [c.name for c in table.c if c.name != "pk"]
    times = [i for i, n in enumerate(names) if isinstance(table.c[n].type, UtcDateTime)]
    docs = [i for i, n in enumerate(names) if isinstance(table.c[n].type, JSON)]
    getter = operator.itemgetter(*names)
    cols = ", ".join(names)
    one = "(" + ", ".join("?" * len(names)) + ")"
    stored_time = _TimeText(rows[0].get("received_at"))
    new: list[str] = []
    for start in range(0, len(rows), SQLITE_CHUNK_ROWS):
        chunk = rows[start:start + SQLITE_CHUNK_ROWS]
        params: list[Any] = []
        for row in chunk:
            values = list(getter(row))
            for i in times:
                values[i] = stored_time(values[i])
            for i in docs:
                values[i] = to_json(values[i]).decode()
            params.extend(values)
        sql = (  # table and column names come from fleet.db.schema, never from input
            f"INSERT INTO {table.name} ({cols}) VALUES "  # noqa: S608
            + ", ".join([one] * len(chunk))
            + " ON CONFLICT (id) DO NOTHING RETURNING id"
        )
        new.extend(r[0] for r in conn.exec_driver_sql(sql, tuple(params)))
    return new


def _insert_columns_sqlite(
    conn: Connection, device_id: str, c: AggregateColumnRows, received_at: dt.datetime
) -> list[str]:
    """SQLite: store schema-2 columns (module docstring); return the ids stored now."""
    stored = {
        r[0] for r in conn.exec_driver_sql(
            "SELECT id FROM aggregates WHERE id IN (SELECT value FROM json_each(?))",
            (to_json(c.ids).decode(),),
        )
    }
    text = _TimeText(received_at)
    starts = {when: text(when) for when in set(c.interval_start)}
    n = len(c.ids)
    values = zip(
        c.ids, repeat(device_id, n), c.streams, map(starts.__getitem__, c.interval_start),
        c.interval_s, c.count, c.channels, c.max_score, c.windows, c.alert_count,
        repeat(text(received_at), n), strict=True,
    )
    params = [v for v in values if v[0] not in stored] if stored else list(values)
    if not params:
        return []
    result = conn.exec_driver_sql(
        "INSERT INTO aggregates (id, device_id, stream, interval_start, interval_s, count, "
        "channels, max_score, windows, alert_count, received_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        params,
    )
    if result.rowcount != len(params):  # cannot happen under the write lock (docstring)
        raise RuntimeError(f"stored {result.rowcount} of {len(params)} new aggregates")
    return [v[0] for v in params]


class _TimeText:
    """What :class:`UtcDateTime` + SQLAlchemy's SQLite DATETIME store for an aware time
    (``YYYY-MM-DD HH:MM:SS.ffffff``, naive UTC); ``same`` (``received_at``, one value for a
    whole batch) is converted once, and so is each distinct instant (aggregates of several
    streams share their interval start; equal aware datetimes are the same instant, so the
    same text).

    >>> t = dt.datetime(2024, 5, 1, 12, 0, 0, 5, tzinfo=dt.timezone.utc)
    >>> _TimeText(t)(t), _TimeText(None)(t.astimezone(dt.timezone(dt.timedelta(hours=2))))
    ('2024-05-01 12:00:00.000005', '2024-05-01 12:00:00.000005')
    """

    def __init__(self, same: dt.datetime | None) -> None:
        self._same = same
        self._same_text = self.convert(same)
        self._seen: dict[dt.datetime, str | None] = {}

    def __call__(self, value: dt.datetime | None) -> str | None:
        if value is self._same:
            return self._same_text
        if value is None:
            return None
        text = self._seen.get(value)
        if text is None:
            text = self._seen[value] = self.convert(value)
        return text

    @staticmethod
    def convert(value: dt.datetime | None) -> str | None:
        if value is None:
            return None
        if value.tzinfo is dt.timezone.utc:  # the usual case: cut "+00:00" off
            return value.isoformat(" ", "microseconds")[:-6]
        if value.tzinfo is None:
            raise ValueError("naive datetime: UTC-aware values only")
        return value.astimezone(dt.timezone.utc).replace(tzinfo=None).isoformat(" ", "microseconds")


def _pg_ingest_sql() -> str:
    """PostgreSQL: the one-statement ingest (module docstring); ``%s`` parameters in order:
    last_seen, agent_version, backlog_alerts, backlog_aggregates, model_name (twice),
    model_version, device_id, alert rows (jsonb array), aggregate rows (jsonb array), then the
    columns' parameters (:func:`_pg_columns`)."""
    def names(table: Table) -> str:
        return ", ".join(c.name for c in table.c if c.name != "pk")

    # table and column names come from fleet.db.schema, never from input
    new_alerts = (
        "ar AS (SELECT * FROM jsonb_populate_recordset(NULL::alerts, %s::jsonb)), "  # noqa: S608
        "ai AS (INSERT INTO alert_ids (id, device_id, window_start) "
        "SELECT id, device_id, window_start FROM ar ON CONFLICT (id) DO NOTHING RETURNING id), "
        f"a AS (INSERT INTO alerts ({names(alerts)}) SELECT {names(alerts)} FROM ar "
        "WHERE ar.id IN (SELECT id FROM ai) RETURNING id), "
    )
    new_aggregates = (
        f"g AS (INSERT INTO aggregates ({names(aggregates)}) SELECT {names(aggregates)} "  # noqa: S608
        "FROM jsonb_populate_recordset(NULL::aggregates, %s::jsonb) "
        "ON CONFLICT (id, interval_start) DO NOTHING RETURNING id), "
    )
    inserts = new_alerts + new_aggregates + f"c AS ({_pg_columns()}) "
    return (
        "WITH dev AS (UPDATE devices SET last_seen = %s, "  # noqa: S608 - names from schema
        "agent_version = %s, backlog_alerts = %s, backlog_aggregates = %s, "
        "model_name = COALESCE(%s, model_name), "
        "model_version = CASE WHEN %s::text IS NULL THEN model_version ELSE %s::bigint END "
        "WHERE device_id = %s), "
        + inserts
        + "SELECT 'alert', id FROM a UNION ALL SELECT 'aggregate', id FROM g "
        "UNION ALL SELECT 'aggregate', id FROM c"
    )


def _pg_columns() -> str:
    """PostgreSQL: the insert of schema-2 columns (``%s``: device_id, received_at, one array per
    :class:`AggregateColumnRows` column from ``ids`` on but ``channels``, then the channels as
    ONE JSON array, paired with the rows by position: a ``text[]`` of JSON texts costs psycopg a
    Python regex substitution per quote, ~0.4 s per 5,000 texts)."""
    return (
        "INSERT INTO aggregates (id, device_id, stream, interval_start, interval_s, count, "
        "channels, max_score, windows, alert_count, received_at) "
        "SELECT u.id, %s, u.stream, u.interval_start, u.interval_s, u.count, ch.doc, "
        "u.max_score, u.windows, u.alert_count, %s::timestamptz "
        "FROM unnest(%s::text[], %s::text[], %s::timestamptz[], %s::float8[], %s::int8[], "
        "%s::float8[], %s::int8[], %s::int8[]) WITH ORDINALITY "
        "AS u(id, stream, interval_start, interval_s, count, max_score, windows, alert_count, "
        "pos), jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS ch(doc, pos) "
        "WHERE ch.pos = u.pos ON CONFLICT (id, interval_start) DO NOTHING RETURNING id"
    )
