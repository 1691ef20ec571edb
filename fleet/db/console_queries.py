"""Read-side queries of the console: fleet-wide alerts (with acknowledgements), a device's
streams, a plot series from the aggregates, model history and where each model runs.

Every query is bounded (``limit``, a time range, a row cap) and uses the existing indexes:
``alerts (device_id, stream, window_start)``, ``aggregates (device_id, stream,
interval_start)``, ``model_status_reports (device_id, received_at)``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    Float,
    and_,
    cast,
    exists,
    func,
    insert,
    select,
    type_coerce,
    union,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql.elements import ColumnElement

from fleet.db.account_tables import alert_acks
from fleet.db.devices import utcnow
from fleet.db.model_tables import model_status_reports
from fleet.db.schema import aggregates, alerts, devices
from fleet.db.snapshot_tables import alert_snapshots
from fleet.errors import NotFound

#: Most aggregate rows one bucketed series reads (then ``truncated``): 4 weeks of 1-minute
#: intervals.
SERIES_MAX_ROWS = 50_000


@dataclass(frozen=True)
class AlertFilter:
    """Fleet-wide alert query: newest first by ``window_start``.

    Attributes:
        device_ids: Only these devices (None: all).
        tag: Only devices carrying this tag (revoked ones too: their alerts stay history).
        stream: Only this stream.
        since: Inclusive lower bound (aware UTC).
        until: Exclusive upper bound.
        acked: True only acknowledged, False only unacknowledged, None both.
        limit: Most rows.
    """

    device_ids: Sequence[str] | None = None
    tag: str | None = None
    stream: str | None = None
    since: dt.datetime | None = None
    until: dt.datetime | None = None
    acked: bool | None = None
    limit: int = 200


@dataclass(frozen=True)
class Series:
    """A stream's score over time, one point per (bucket of) aggregate interval(s).

    Attributes:
        points: ``(interval start epoch s, max score or None, windows, alerts)``, oldest
            first; with ``bucket_s`` > 0 each point is a bucket (its start; max of max scores,
            sums).
        thresholds: ``(window start epoch s, threshold)`` of the stream's alerts in range.
        last_threshold: Threshold of the newest alert before ``until`` (None: never alerted).
        bucket_s: 0 when the points are the intervals themselves.
        truncated: Bucketed, and more than :data:`SERIES_MAX_ROWS` rows were in range (the
            newest are missing).
    """

    points: list[tuple[float, float | None, int, int]]
    thresholds: list[tuple[float, float]]
    last_threshold: float | None
    bucket_s: float
    truncated: bool


@dataclass(frozen=True)
class Extent:
    """Where a stream's data lie, for a plot's "all data" range.

    Attributes:
        first_at: Oldest aggregate interval start (aware UTC), None without aggregates.
        last_at: Newest aggregate interval start, None without aggregates.
        current_threshold: Threshold of the stream's newest alert (the one in force when the
            device last alerted), None when it never alerted.
    """

    first_at: dt.datetime | None
    last_at: dt.datetime | None
    current_threshold: float | None


class ConsoleQueries:
    """Console reads and alert acknowledgements.

    Args:
        engine: The fleet database.
        clock: Aware UTC now.
    """

    def __init__(self, engine: Engine, clock: Callable[[], dt.datetime] = utcnow) -> None:
        self._engine = engine
        self._clock = clock

    def alerts(self, query: AlertFilter) -> list[dict[str, Any]]:
        """Alerts newest first, each with ``acked_by``, ``acked_at``, ``ack_note`` (or None),
        its lifecycle ``event`` and ``episode_id`` from the stored payload (a schema-1 alert:
        ``raised``, its own id, as :meth:`fleet.db.records.RecordStore.alerts`) and the kinds
        of images stored for it (``snapshots``, sorted)."""
        cols = [c for c in alerts.c if c.name != "pk"]
        stmt = select(*cols, alert_acks.c.acked_by, alert_acks.c.acked_at,
                      alert_acks.c.note.label("ack_note")).select_from(
            alerts.outerjoin(alert_acks, alert_acks.c.alert_id == alerts.c.id))
        if query.device_ids is not None:
            stmt = stmt.where(alerts.c.device_id.in_(list(query.device_ids)))
        if query.tag is not None:
            tagged = select(devices.c.device_id).where(_has_tag(self._engine, query.tag))
            stmt = stmt.where(alerts.c.device_id.in_(tagged.scalar_subquery()))
        if query.stream is not None:
            stmt = stmt.where(alerts.c.stream == query.stream)
        if query.since is not None:
            stmt = stmt.where(alerts.c.window_start >= query.since)
        if query.until is not None:
            stmt = stmt.where(alerts.c.window_start < query.until)
        if query.acked is True:
            stmt = stmt.where(alert_acks.c.alert_id.is_not(None))
        elif query.acked is False:
            stmt = stmt.where(alert_acks.c.alert_id.is_(None))
        stmt = stmt.order_by(alerts.c.window_start.desc(), alerts.c.id).limit(query.limit)
        with self._engine.connect() as conn:
            rows = [dict(r) for r in conn.execute(stmt).mappings().all()]
            kinds: dict[str, list[str]] = {}
            if rows:
                snaps = (select(alert_snapshots.c.alert_id, alert_snapshots.c.kind)
                         .where(alert_snapshots.c.alert_id.in_([r["id"] for r in rows]))
                         .order_by(alert_snapshots.c.alert_id, alert_snapshots.c.kind))
                for alert_id, kind in conn.execute(snaps).all():
                    kinds.setdefault(str(alert_id), []).append(str(kind))
        for row in rows:
            body = row["payload"] if isinstance(row["payload"], dict) else {}
            row["event"] = body.get("event") or "raised"
            row["episode_id"] = body.get("episode_id") or row["id"]
            row["snapshots"] = kinds.get(row["id"], [])
        return rows

    def acknowledge(self, alert_id: str, username: str, note: str | None) -> dict[str, Any]:
        """Acknowledge an alert episode once; a second call returns the first acknowledgement.

        An episode is acknowledged on its ``raised`` record: acknowledging one of its
        ``updated`` or ``cleared`` records acknowledges the ``raised`` record its payload's
        ``episode_id`` names, when the fleet has it (else the record itself).

        Returns:
            ``{"alert_id", "acked_by", "acked_at", "note", "new"}``; ``alert_id`` is the record
            acknowledged.

        Raises:
            NotFound: No alert with this id.
        """
        with self._engine.connect() as conn:
            found = conn.execute(select(alerts.c.device_id, alerts.c.payload)
                                 .where(alerts.c.id == alert_id)).first()
            if found is None:
                raise NotFound(f"no alert {alert_id!r}")
            body = found.payload if isinstance(found.payload, dict) else {}
            episode = body.get("episode_id")
            if (body.get("event") or "raised") != "raised" and isinstance(episode, str) and (
                    conn.execute(select(alerts.c.id).where(
                        alerts.c.id == episode, alerts.c.device_id == found.device_id)
                    ).first() is not None):
                alert_id = episode
        new = True
        try:
            with self._engine.begin() as conn:
                conn.execute(insert(alert_acks).values(
                    alert_id=alert_id, acked_by=username, acked_at=self._clock(), note=note))
        except IntegrityError:
            new = False
        with self._engine.connect() as conn:
            row = conn.execute(select(alert_acks).where(alert_acks.c.alert_id == alert_id)).one()
        return {**dict(row._mapping), "new": new}

    def streams(self, device_id: str) -> list[dict[str, Any]]:
        """The device's streams (from its aggregates and alerts), each with the model it runs:
        the one its newest ``active`` report for the stream named (``model_name``,
        ``model_version``, ``model_state``; None when no report made one active), and
        ``update``: the newest report when it came after that one (a candidate on its way,
        rejected or rolled back: ``{"name", "version", "state", "reason"}``), else None.
        A rejected candidate never replaces the model the stream runs."""
        names = union(
            select(aggregates.c.stream).where(aggregates.c.device_id == device_id).distinct(),
            select(alerts.c.stream).where(alerts.c.device_id == device_id).distinct(),
        ).subquery()
        with self._engine.connect() as conn:
            found = sorted(str(s) for s in conn.execute(select(names.c.stream)).scalars())
            runs = self._latest_reports(conn, [device_id], active_only=True)
            latest = self._latest_reports(conn, [device_id])
        out = []
        for stream in found:
            run, last = runs.get((device_id, stream)), latest.get((device_id, stream))
            newer = last is not None and (run is None or last["pk"] > run["pk"])
            out.append({"stream": stream,
                        "model_name": run["name"] if run else None,
                        "model_version": run["version"] if run else None,
                        "model_state": run["state"] if run else None,
                        "update": {k: last[k] for k in ("name", "version", "state", "reason")}
                        if last is not None and newer else None})
        return out

    @staticmethod
    def _latest_reports(
        conn: Any, device_ids: Sequence[str] | None, active_only: bool = False
    ) -> dict[tuple[str, str | None], dict[str, Any]]:
        """The newest model status report per ``(device_id, stream)`` (``active_only``: the
        newest in state ``active``, the model the stream runs), with ``pk``."""
        r = model_status_reports
        newest = select(r.c.device_id, r.c.stream, func.max(r.c.pk).label("pk")).group_by(
            r.c.device_id, r.c.stream)
        if device_ids is not None:
            newest = newest.where(r.c.device_id.in_(list(device_ids)))
        if active_only:
            newest = newest.where(r.c.state == "active")
        sub = newest.subquery()
        # the columns the console shows, not details (JSON parsed per row for nothing)
        rows = conn.execute(select(r.c.pk, r.c.device_id, r.c.stream, r.c.name, r.c.version,
                                   r.c.state, r.c.reason)
                            .join(sub, r.c.pk == sub.c.pk)).mappings().all()
        return {(row["device_id"], row["stream"]): dict(row) for row in rows}

    def series(
        self, device_id: str, stream: str, since: dt.datetime, until: dt.datetime,
        max_points: int,
    ) -> Series:
        """The stream's score from its aggregates in ``[since, until)``, at most
        ``max_points`` points, downsampled in the database.

        At most ``max_points`` intervals: one point per interval (the parts of one interval
        merged: max of the max scores, sums). More: ``max_points`` equal buckets of ``bucket_s
        = (until - since) / max_points`` seconds, a row in bucket ``floor((epoch(interval_start)
        - epoch(since)) / bucket_s)``, per bucket the largest ``max_score`` (a peak stays
        visible however far one zooms out) and the sums of ``windows`` and ``alert_count``,
        over the oldest :data:`SERIES_MAX_ROWS` rows. So the database returns at most
        ``max_points + 1`` rows whatever the range; on PostgreSQL both reads are index-only
        scans of ``ix_aggregates_series`` (migration ``0007``).
        """
        a = aggregates
        in_range = (a.c.device_id == device_id, a.c.stream == stream,
                    a.c.interval_start >= since, a.c.interval_start < until)
        with self._engine.connect() as conn:
            rows = conn.execute(
                select(a.c.interval_start, func.max(a.c.max_score), func.sum(a.c.windows),
                       func.sum(a.c.alert_count))
                .where(*in_range).group_by(a.c.interval_start).order_by(a.c.interval_start)
                .limit(max_points + 1)
            ).all()
            bucket_s, truncated = 0.0, False
            points = [(r[0].timestamp(), _float(r[1]), int(r[2]), int(r[3])) for r in rows]
            if len(rows) > max_points:
                bucket_s = (until - since).total_seconds() / max_points
                points, truncated = self._buckets(conn, in_range, since, bucket_s)
            thresholds = conn.execute(
                select(alerts.c.window_start, alerts.c.threshold)
                .where(alerts.c.device_id == device_id, alerts.c.stream == stream,
                       alerts.c.window_start >= since, alerts.c.window_start < until)
                .order_by(alerts.c.window_start).limit(SERIES_MAX_ROWS)
            ).all()
            last = conn.execute(
                select(alerts.c.threshold)
                .where(alerts.c.device_id == device_id, alerts.c.stream == stream,
                       alerts.c.window_start < until)
                .order_by(alerts.c.window_start.desc()).limit(1)
            ).scalar_one_or_none()
        return Series(points=points,
                      thresholds=[(r.window_start.timestamp(), r.threshold) for r in thresholds],
                      last_threshold=last, bucket_s=bucket_s, truncated=truncated)

    def extent(self, device_id: str, stream: str) -> Extent:
        """The stream's :class:`Extent`: ``min``/``max`` of ``interval_start`` (on PostgreSQL
        each an index-only scan of ``ix_aggregates_series`` reading one entry per partition)
        and the newest alert's threshold (the alerts' ``(device_id, stream, window_start)``
        index, read backwards)."""
        a = aggregates
        with self._engine.connect() as conn:
            first, last = conn.execute(
                select(func.min(a.c.interval_start), func.max(a.c.interval_start))
                .where(a.c.device_id == device_id, a.c.stream == stream)
            ).one()
            threshold = conn.execute(
                select(alerts.c.threshold)
                .where(alerts.c.device_id == device_id, alerts.c.stream == stream)
                .order_by(alerts.c.window_start.desc()).limit(1)
            ).scalar_one_or_none()
        return Extent(first_at=first, last_at=last, current_threshold=_float(threshold))

    def _buckets(
        self, conn: Connection, in_range: tuple[ColumnElement[bool], ...], since: dt.datetime,
        bucket_s: float,
    ) -> tuple[list[tuple[float, float | None, int, int]], bool]:
        """``(points, truncated)`` of :meth:`series` past ``max_points`` intervals."""
        a = aggregates
        origin = since.timestamp()
        oldest = (select(a.c.interval_start, a.c.max_score, a.c.windows, a.c.alert_count)
                  .where(*in_range).order_by(a.c.interval_start).limit(SERIES_MAX_ROWS)
                  .subquery())
        bucket = func.floor((_epoch(self._engine, oldest.c.interval_start) - origin) / bucket_s)
        rows = conn.execute(
            select(bucket.label("b"), func.max(oldest.c.max_score), func.sum(oldest.c.windows),
                   func.sum(oldest.c.alert_count), func.count())
            .group_by("b").order_by("b")
        ).all()
        points = [(origin + bucket_s * int(r[0]), _float(r[1]), int(r[2]), int(r[3]))
                  for r in rows]
        truncated = False
        if sum(int(r[4]) for r in rows) == SERIES_MAX_ROWS:  # all read: was there more?
            more = (select(a.c.pk).where(*in_range).order_by(a.c.interval_start)
                    .offset(SERIES_MAX_ROWS).limit(1))
            truncated = conn.execute(more).first() is not None
        return points, truncated

    def model_history(self, device_id: str, limit: int) -> list[dict[str, Any]]:
        """The device's model status reports, newest first."""
        r = model_status_reports
        with self._engine.connect() as conn:
            rows = conn.execute(select(r).where(r.c.device_id == device_id)
                                .order_by(r.c.pk.desc()).limit(limit))
            return [{k: v for k, v in row._mapping.items() if k != "pk"} for row in rows]

    def running(self) -> list[dict[str, Any]]:
        """Where each model runs: per device stream, its newest report in state ``active`` (a
        later rejected or in-progress candidate does not change what the stream runs), and, for
        a device without such a report, the model its last upload named (``stream`` None).
        Sorted by model, version, device, stream."""
        found: dict[tuple[str, int, str, str | None], dict[str, Any]] = {}
        with self._engine.connect() as conn:
            for (dev, stream), rep in self._latest_reports(conn, None, active_only=True).items():
                found[(rep["name"], rep["version"], dev, stream)] = {
                    "name": rep["name"], "version": rep["version"], "device_id": dev,
                    "stream": stream, "source": "status report"}
            rows = conn.execute(select(devices.c.device_id, devices.c.model_name,
                                       devices.c.model_version).where(and_(
                devices.c.revoked_at.is_(None), devices.c.model_name.is_not(None)))).all()
            reported = {k[2] for k in found}
            for row in rows:
                if row.model_version is None or row.device_id in reported:
                    continue
                key = (row.model_name, int(row.model_version), row.device_id, None)
                found.setdefault(key, {"name": row.model_name, "version": row.model_version,
                                       "device_id": row.device_id, "stream": None,
                                       "source": "upload"})
        return [found[k] for k in sorted(found, key=lambda k: (k[0], k[1], k[2], k[3] or ""))]


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _epoch(engine: Engine, column: Any) -> ColumnElement[Any]:
    """Epoch seconds (float) of a :class:`fleet.db.schema.UtcDateTime` column in SQL."""
    if engine.dialect.name == "postgresql":
        return cast(func.extract("epoch", column), Float)  # float8 math, not numeric
    # SQLite stores "YYYY-MM-DD HH:MM:SS.ffffff": whole seconds plus "%f" (SS.SSS) less "%S",
    # exact to the millisecond (julianday's float days are not)
    return (cast(func.strftime("%s", column), Float) + cast(func.strftime("%f", column), Float)
            - cast(func.strftime("%S", column), Float))


def _has_tag(engine: Engine, tag: str) -> ColumnElement[bool]:
    """``devices.tags`` holds ``tag``: ``@>`` on PostgreSQL's jsonb, ``json_each`` on SQLite."""
    if engine.dialect.name == "postgresql":
        return type_coerce(devices.c.tags, JSONB).contains([tag])
    each = func.json_each(devices.c.tags).table_valued("value")
    return exists(select(each.c.value).where(each.c.value == tag))
