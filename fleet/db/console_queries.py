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

from sqlalchemy import Engine, and_, func, insert, select, union
from sqlalchemy.exc import IntegrityError

from fleet.db.account_tables import alert_acks
from fleet.db.devices import utcnow
from fleet.db.model_tables import model_status_reports
from fleet.db.schema import aggregates, alerts, devices
from fleet.errors import NotFound

#: Most aggregate rows one series reads (then ``truncated``): 4 weeks of 1-minute intervals.
SERIES_MAX_ROWS = 50_000


@dataclass(frozen=True)
class AlertFilter:
    """Fleet-wide alert query: newest first by ``window_start``.

    Attributes:
        device_ids: Only these devices (None: all); a tag filter resolves to this.
        stream: Only this stream.
        since: Inclusive lower bound (aware UTC).
        until: Exclusive upper bound.
        acked: True only acknowledged, False only unacknowledged, None both.
        limit: Most rows.
    """

    device_ids: Sequence[str] | None = None
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
            first; with ``bucket_s`` > 0 each point is a bucket (max of max scores, sums).
        thresholds: ``(window start epoch s, threshold)`` of the stream's alerts in range.
        last_threshold: Threshold of the newest alert before ``until`` (None: never alerted).
        bucket_s: 0 when the points are the intervals themselves.
        truncated: More than :data:`SERIES_MAX_ROWS` rows were in range (the newest missing).
    """

    points: list[tuple[float, float | None, int, int]]
    thresholds: list[tuple[float, float]]
    last_threshold: float | None
    bucket_s: float
    truncated: bool


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
        """Alerts newest first, each with ``acked_by``, ``acked_at``, ``ack_note`` (or None)."""
        cols = [c for c in alerts.c if c.name != "pk"]
        stmt = select(*cols, alert_acks.c.acked_by, alert_acks.c.acked_at,
                      alert_acks.c.note.label("ack_note")).select_from(
            alerts.outerjoin(alert_acks, alert_acks.c.alert_id == alerts.c.id))
        if query.device_ids is not None:
            stmt = stmt.where(alerts.c.device_id.in_(list(query.device_ids)))
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
            return [dict(r._mapping) for r in conn.execute(stmt)]

    def acknowledge(self, alert_id: str, username: str, note: str | None) -> dict[str, Any]:
        """Acknowledge an alert once; a second call returns the first acknowledgement.

        Returns:
            ``{"alert_id", "acked_by", "acked_at", "note", "new"}``.

        Raises:
            NotFound: No alert with this id.
        """
        with self._engine.connect() as conn:
            if conn.execute(select(alerts.c.id).where(alerts.c.id == alert_id)).first() is None:
                raise NotFound(f"no alert {alert_id!r}")
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
        """The device's streams (from its aggregates and alerts), each with the model its last
        status report named (``model_name``, ``model_version``, ``model_state``; None when no
        report named the stream)."""
        names = union(
            select(aggregates.c.stream).where(aggregates.c.device_id == device_id).distinct(),
            select(alerts.c.stream).where(alerts.c.device_id == device_id).distinct(),
        ).subquery()
        with self._engine.connect() as conn:
            found = sorted(str(s) for s in conn.execute(select(names.c.stream)).scalars())
            latest = self._latest_reports(conn, [device_id])
        out = []
        for stream in found:
            rep = latest.get((device_id, stream))
            out.append({"stream": stream,
                        "model_name": rep["name"] if rep else None,
                        "model_version": rep["version"] if rep else None,
                        "model_state": rep["state"] if rep else None})
        return out

    @staticmethod
    def _latest_reports(conn: Any, device_ids: Sequence[str] | None) -> dict[
            tuple[str, str | None], dict[str, Any]]:
        r = model_status_reports
        newest = select(r.c.device_id, r.c.stream, func.max(r.c.pk).label("pk")).group_by(
            r.c.device_id, r.c.stream)
        if device_ids is not None:
            newest = newest.where(r.c.device_id.in_(list(device_ids)))
        sub = newest.subquery()
        rows = conn.execute(select(r).join(sub, r.c.pk == sub.c.pk))
        return {(row.device_id, row.stream): dict(row._mapping) for row in rows}

    def series(
        self, device_id: str, stream: str, since: dt.datetime, until: dt.datetime,
        max_points: int,
    ) -> Series:
        """The stream's score from its aggregates in ``[since, until)``, at most
        ``max_points`` points (equal-width buckets when there are more intervals)."""
        a = aggregates
        with self._engine.connect() as conn:
            rows = conn.execute(
                select(a.c.interval_start, a.c.max_score, a.c.windows, a.c.alert_count)
                .where(a.c.device_id == device_id, a.c.stream == stream,
                       a.c.interval_start >= since, a.c.interval_start < until)
                .order_by(a.c.interval_start).limit(SERIES_MAX_ROWS + 1)
            ).all()
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
        truncated = len(rows) > SERIES_MAX_ROWS
        merged: dict[float, list[Any]] = {}
        for row in rows[:SERIES_MAX_ROWS]:  # parts of one interval merge into one point
            t = row.interval_start.timestamp()
            merged.setdefault(t, [None, 0, 0])
            _merge(merged[t], row.max_score, row.windows, row.alert_count)
        bucket_s = 0.0
        if len(merged) > max_points:
            bucket_s = (until - since).total_seconds() / max_points
            start = since.timestamp()
            buckets: dict[float, list[Any]] = {}
            for t, (score, win, al) in merged.items():
                key = start + bucket_s * int((t - start) // bucket_s)
                buckets.setdefault(key, [None, 0, 0])
                _merge(buckets[key], score, win, al)
            merged = buckets
        points = [(t, v[0], v[1], v[2]) for t, v in sorted(merged.items())]
        return Series(points=points,
                      thresholds=[(r.window_start.timestamp(), r.threshold) for r in thresholds],
                      last_threshold=last, bucket_s=bucket_s, truncated=truncated)

    def model_history(self, device_id: str, limit: int) -> list[dict[str, Any]]:
        """The device's model status reports, newest first."""
        r = model_status_reports
        with self._engine.connect() as conn:
            rows = conn.execute(select(r).where(r.c.device_id == device_id)
                                .order_by(r.c.pk.desc()).limit(limit))
            return [{k: v for k, v in row._mapping.items() if k != "pk"} for row in rows]

    def running(self) -> list[dict[str, Any]]:
        """Where each model runs: active devices' last reports in state ``active``, and, for a
        device without such a report, the model its last upload named (``stream`` None).
        Sorted by model, version, device, stream."""
        found: dict[tuple[str, int, str, str | None], dict[str, Any]] = {}
        with self._engine.connect() as conn:
            for (dev, stream), rep in self._latest_reports(conn, None).items():
                if rep["state"] == "active":
                    found[(rep["name"], rep["version"], dev, stream)] = {
                        "name": rep["name"], "version": rep["version"], "device_id": dev,
                        "stream": stream, "source": "status report"}
            rows = conn.execute(select(devices.c.device_id, devices.c.model_name,
                                       devices.c.model_version).where(and_(
                devices.c.revoked_at.is_(None), devices.c.model_name.is_not(None))))
            reported = {k[2] for k in found}
            for row in rows:
                if row.model_version is None or row.device_id in reported:
                    continue
                key = (row.model_name, int(row.model_version), row.device_id, None)
                found.setdefault(key, {"name": row.model_name, "version": row.model_version,
                                       "device_id": row.device_id, "stream": None,
                                       "source": "upload"})
        return [found[k] for k in sorted(found, key=lambda k: (k[0], k[1], k[2], k[3] or ""))]


def _merge(acc: list[Any], score: float | None, windows: int, alert_count: int) -> None:
    if score is not None:
        acc[0] = score if acc[0] is None else max(acc[0], score)
    acc[1] += windows
    acc[2] += alert_count
