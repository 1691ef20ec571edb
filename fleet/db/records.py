"""Record store: idempotent batch insert and time-range queries for alerts and aggregates.

One ingest batch is ONE transaction: the device row update (last_seen, backlog, versions) and
every insert commit together or not at all. Inserts are ``INSERT ... ON CONFLICT (id) DO
NOTHING RETURNING id`` with the dialect's own ``insert`` (PostgreSQL, SQLite >= 3.35): the
returned ids are exactly the rows stored now; every other id was already there (duplicate).
Concurrent retries of the same batch are safe: the unique index arbitrates.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, Table, select, update
from sqlalchemy.dialects import postgresql, sqlite

from fleet.db.schema import aggregates, alerts, devices


@dataclass(frozen=True)
class DeviceReport:
    """What a batch says about its device (stored on ``devices``)."""

    agent_version: str
    model_name: str | None
    model_version: int | None
    backlog_alerts: int
    backlog_aggregates: int


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
        dialect = engine.dialect.name
        insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
        self._statements = {
            table.name: insert(table)
            .on_conflict_do_nothing(index_elements=["id"])
            .returning(table.c.id)
            for table in (alerts, aggregates)
        }
        self._unnest = (
            {t.name: _unnest_sql(t) for t in (alerts, aggregates)}
            if dialect == "postgresql" else {}
        )

    def ingest(
        self,
        device_id: str,
        report: DeviceReport,
        rows: dict[str, list[dict[str, Any]]],
        seen_at: dt.datetime,
    ) -> set[tuple[str, str]]:
        """Store a batch's rows in one transaction and update the device.

        Args:
            device_id: The authenticated device.
            report: Versions and backlog from the batch envelope.
            rows: ``{"alert": [...], "aggregate": [...]}`` rows (see :mod:`fleet.ingest`).
            seen_at: New ``last_seen`` (aware UTC).

        Returns:
            ``(kind, id)`` of the rows inserted now; the others were duplicates.

        Raises:
            sqlalchemy.exc.OperationalError: The database failed (mapped to 503 by the API).
        """
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
                for inserted in self._insert_new(conn, table, rows.get(kind, [])):
                    new.add((kind, inserted))
        return new

    def _insert_new(
        self, conn: Connection, table: Table, rows: Sequence[dict[str, Any]]
    ) -> list[str]:
        if not rows:
            return []
        # One cached statement executed with a list of parameter sets: SQLAlchemy's
        # "insertmanyvalues" turns it into multi-row VALUES batches (within the drivers' bound
        # parameter limits) without recompiling per batch, which a .values([...]) statement
        # would do (~10 ms for 50 rows). PostgreSQL gets one short statement and ONE jsonb
        # parameter holding every row (jsonb_populate_recordset): psycopg caches the parsing
        # of a short statement (not of the long multi-VALUES text), json.dumps is C code, and
        # the server plans one statement per batch (3.8 -> ~1.5 ms for 50 aggregates).
        if self._unnest:
            doc = json.dumps(rows, separators=(",", ":"), allow_nan=False, default=_iso)
            return [row[0] for row in conn.exec_driver_sql(self._unnest[table.name], (doc,))]
        return list(conn.execute(self._statements[table.name], list(rows)).scalars())

    def aggregates(self, query: TimeQuery) -> list[dict[str, Any]]:
        """Aggregates by ``interval_start`` (oldest first)."""
        return self._select(aggregates, aggregates.c.interval_start, query)

    def alerts(self, query: TimeQuery) -> list[dict[str, Any]]:
        """Alerts by ``window_start`` (oldest first)."""
        return self._select(alerts, alerts.c.window_start, query)

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


def _iso(value: Any) -> str:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def _unnest_sql(table: Table) -> str:
    """PostgreSQL: insert the rows of a jsonb array (one psycopg ``%s`` parameter)."""
    names = ", ".join(c.name for c in table.c if c.name != "pk")
    return (  # table and column names come from fleet.db.schema, never from input
        f"INSERT INTO {table.name} ({names}) SELECT {names} "  # noqa: S608
        f"FROM jsonb_populate_recordset(NULL::{table.name}, %s::jsonb) "
        "ON CONFLICT (id) DO NOTHING RETURNING id"
    )
