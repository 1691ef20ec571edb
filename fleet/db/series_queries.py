"""The console's read queries: a stream's score series downsampled in SQL, and the alerts
timeline across the fleet. Measured on PostgreSQL with 1,000 devices and 10 million aggregate
rows by ``benchmarks/console_scale.py`` (docs/fleet-operations.md, "Scale").

Downsampling: the range ``[since, until)`` is cut into ``points`` buckets of ``bucket_s =
(until - since) / points`` seconds (never narrower than one second); the database groups a
stream's aggregates by ``floor(epoch(interval_start) / bucket_s)`` and returns per bucket the
largest ``max_score`` (a peak stays visible however far one zooms out), the readings and the
alerts. So a month of one-minute aggregates (43,200 rows) leaves the database as at most
``points`` rows. On PostgreSQL the scan is index-only over ``ix_aggregates_series`` (migration
``0005``).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, Float, cast, exists, func, select, type_coerce
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.sql.elements import ColumnElement

from fleet.db.schema import aggregates, alerts, devices

#: Most buckets one series query returns.
MAX_POINTS = 2000


@dataclass(frozen=True)
class SeriesQuery:
    """One stream's series: ``[since, until)`` (aware UTC) in ``points`` buckets."""

    device_id: str
    stream: str
    since: dt.datetime
    until: dt.datetime
    points: int = 500

    @property
    def bucket_s(self) -> float:
        return max(1.0, (self.until - self.since).total_seconds() / self.points)


def _epoch(engine: Engine, column: Any) -> ColumnElement[Any]:
    if engine.dialect.name == "postgresql":
        return cast(func.extract("epoch", column), Float)  # float8 math, not numeric
    # SQLite: whole seconds (exact, unlike julianday's float days) plus the milliseconds
    return (cast(func.strftime("%s", column), Float) + cast(func.strftime("%f", column), Float)
            - cast(func.strftime("%S", column), Float))


def series(engine: Engine, q: SeriesQuery) -> tuple[float | None, list[dict[str, Any]]]:
    """``(threshold, points)``: points ``{"t", "max_score", "count", "alerts"}`` oldest first.

    ``threshold`` is that of the stream's newest alert before ``until`` (None without alerts).
    """
    width = q.bucket_s
    origin = q.since.timestamp()
    bucket = func.floor((_epoch(engine, aggregates.c.interval_start) - origin) / width)
    query = (
        select(bucket.label("b"), func.max(aggregates.c.max_score).label("max_score"),
               func.sum(aggregates.c.count).label("count"),
               func.sum(aggregates.c.alert_count).label("alerts"))
        .where(aggregates.c.device_id == q.device_id, aggregates.c.stream == q.stream,
               aggregates.c.interval_start >= q.since, aggregates.c.interval_start < q.until)
        .group_by("b").order_by("b")
    )
    newest = (
        select(alerts.c.threshold)
        .where(alerts.c.device_id == q.device_id, alerts.c.stream == q.stream,
               alerts.c.window_start < q.until)
        .order_by(alerts.c.window_start.desc()).limit(1)
    )
    with engine.connect() as conn:
        rows = conn.execute(query).all()
        threshold = conn.execute(newest).scalar()
    points = [{
        "t": dt.datetime.fromtimestamp(origin + float(r.b) * width, tz=dt.timezone.utc),
        "max_score": r.max_score, "count": int(r[2] or 0), "alerts": int(r.alerts or 0),
    } for r in rows]
    return (None if threshold is None else float(threshold)), points


@dataclass(frozen=True)
class AlertFilter:
    """Alerts across the fleet, newest first (every field optional but ``limit``)."""

    device_id: str | None = None
    stream: str | None = None
    tag: str | None = None
    since: dt.datetime | None = None
    until: dt.datetime | None = None
    limit: int = 100


def fleet_alerts(engine: Engine, f: AlertFilter) -> list[dict[str, Any]]:
    """Alerts matching ``f`` by ``window_start`` descending (at most ``f.limit``).

    A ``tag`` selects the alerts of the active devices carrying it (a subquery on
    ``devices``).
    """
    cols = (alerts.c.id, alerts.c.device_id, alerts.c.stream, alerts.c.score,
            alerts.c.threshold, alerts.c.window_start, alerts.c.model_name,
            alerts.c.model_version)
    query = select(*cols).order_by(alerts.c.window_start.desc()).limit(f.limit)
    with engine.connect() as conn:
        if f.tag is not None:
            tagged = select(devices.c.device_id).where(devices.c.revoked_at.is_(None),
                                                       _has_tag(engine, f.tag))
            query = query.where(alerts.c.device_id.in_(tagged.scalar_subquery()))
        if f.device_id is not None:
            query = query.where(alerts.c.device_id == f.device_id)
        if f.stream is not None:
            query = query.where(alerts.c.stream == f.stream)
        if f.since is not None:
            query = query.where(alerts.c.window_start >= f.since)
        if f.until is not None:
            query = query.where(alerts.c.window_start < f.until)
        return [dict(r._mapping) for r in conn.execute(query).all()]


def _has_tag(engine: Engine, tag: str) -> ColumnElement[bool]:
    """``devices.tags`` holds ``tag``: ``@>`` on PostgreSQL's jsonb, ``json_each`` on SQLite."""
    if engine.dialect.name == "postgresql":
        return type_coerce(devices.c.tags, JSONB).contains([tag])
    each = func.json_each(devices.c.tags).table_valued("value")
    return exists(select(each.c.value).where(each.c.value == tag))
