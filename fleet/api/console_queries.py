"""JSON routes of the console's read queries (:mod:`fleet.db.console_queries`):

* ``GET /v1/devices/{device_id}/series?stream=S&from=T&to=T&points=500`` (admin, or that
  device): a stream's score over ``[from, to)`` (epoch seconds or ISO 8601 with a timezone;
  default the last 24 h) in at most ``points`` (1..2000) buckets, downsampled in SQL, with the
  stream's threshold; 404 unknown device, 422 bad bounds.
* ``GET /v1/alerts?device=D&stream=S&tag=T&since=T&until=T&limit=100`` (admin): alerts across
  the fleet, newest first (``limit`` 1..1000; ``truncated`` when more match).
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated

import msgspec
from fastapi import APIRouter, Query, Response

from cloud_sync.protocol import NAME_PATTERN
from fleet.api.deps import AdminDep, PrincipalDep, ServicesDep
from fleet.api.devices import _time as parse_time
from fleet.api.ops_models import FleetAlertOut, FleetAlertPage, Series
from fleet.db.console_queries import MAX_POINTS, AlertFilter, SeriesQuery, fleet_alerts, series
from fleet.errors import NotFound, Unprocessable

router = APIRouter()
Time = Annotated[str | None, Query(max_length=40, description="Epoch s or ISO 8601.")]
Name = Annotated[str | None, Query(pattern=NAME_PATTERN)]
DAY = dt.timedelta(days=1)


@router.get("/v1/devices/{device_id}/series", response_model=Series,
            summary="A stream's score over time, downsampled")
def device_series(
    device_id: str,
    services: ServicesDep,
    principal: PrincipalDep,
    stream: Annotated[str, Query(pattern=NAME_PATTERN)],
    since: Annotated[str | None, Query(alias="from", max_length=40)] = None,
    until: Annotated[str | None, Query(alias="to", max_length=40)] = None,
    points: Annotated[int, Query(ge=1, le=MAX_POINTS)] = 500,
) -> Response:
    principal.check_read(device_id)
    if principal.is_admin and services.devices.get(device_id) is None:
        raise NotFound(f"no device {device_id!r}")
    hi = parse_time(until, "to") or dt.datetime.now(dt.timezone.utc)
    lo = parse_time(since, "from") or hi - DAY
    if hi <= lo:
        raise Unprocessable("to must be after from")
    q = SeriesQuery(device_id, stream, lo, hi, points)
    threshold, found = series(services.engine, q)
    # encoded once here (FastAPI would validate the answer's points a second time)
    return Response(msgspec.json.encode({
        "device_id": device_id, "stream": stream, "bucket_s": q.bucket_s,
        "threshold": threshold, "points": found,
    }), media_type="application/json")


@router.get("/v1/alerts", response_model=FleetAlertPage, summary="Alerts across the fleet")
def alerts_timeline(
    services: ServicesDep,
    _admin: AdminDep,
    device: Name = None,
    stream: Name = None,
    tag: Annotated[str | None, Query(max_length=64)] = None,
    since: Time = None,
    until: Time = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> FleetAlertPage:
    f = AlertFilter(device_id=device, stream=stream, tag=tag, since=parse_time(since, "since"),
                    until=parse_time(until, "until"), limit=limit + 1)
    rows = fleet_alerts(services.engine, f)
    return FleetAlertPage(items=[FleetAlertOut(**r) for r in rows[:limit]],
                          truncated=len(rows) > limit)
