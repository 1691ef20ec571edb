"""Read routes the console draws from (and alert acknowledgement).

* ``GET /v1/alerts`` (viewer): alerts across the fleet, newest first; filters ``device``,
  ``stream``, ``tag`` (devices carrying it), ``since``/``until`` (epoch s or ISO 8601, by
  ``window_start``), ``acked`` (true/false), ``limit`` (1..1000, default 200). Each alert has
  ``acked_by``, ``acked_at``, ``ack_note`` (None when not acknowledged).
* ``POST /v1/alerts/{alert_id}/ack`` (operator): body ``{"note": text}`` or empty; 200 with the
  acknowledgement (the first one stays: acknowledging twice changes nothing); 404 unknown alert.
  An episode is acknowledged on its ``raised`` record: the id of an ``updated`` or ``cleared``
  record acknowledges its episode's ``raised`` record (``alert_id`` of the answer).
  Recorded in the audit log (target: the record acknowledged).
* ``GET /v1/devices/{id}/streams`` (viewer): the device's streams, each with the model it runs
  (its newest ``active`` status report for the stream) and ``update``, a newer report of
  another state (a candidate in progress, rejected or rolled back), else None.
* ``GET /v1/devices/{id}/series?stream=S`` (viewer): the stream's max score per aggregate
  interval in ``[since, until)`` (default: the last 24 h), at most ``points`` (10..2000,
  default 500) points, bucketed (max of the max scores) past that; with the thresholds of the
  stream's alerts (:class:`fleet.db.console_queries.Series`), and, whatever the range, the
  data's extent ``first_at``/``last_at`` (oldest and newest aggregate interval start, None
  without aggregates) and ``current_threshold`` (the newest alert's, None: never alerted):
  :class:`fleet.db.console_queries.Extent`. Times are epoch seconds.
* ``GET /v1/devices/{id}/models`` (viewer): the device's model status reports, newest first.
* ``GET /v1/models/running`` (viewer): which device runs which model version on which stream.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

import msgspec
from fastapi import APIRouter, Path, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from cloud_sync.protocol import ID_PATTERN, NAME_PATTERN, PLAIN_PATTERN, TEXT_PATTERN
from fleet.api.auditing import arecord
from fleet.api.deps import OperatorDep, ServicesDep, ViewerDep
from fleet.api.devices import _time as parse_time
from fleet.api.json_body import body_doc, read_model
from fleet.api.models import AlertOut
from fleet.db.console_queries import AlertFilter, ConsoleQueries
from fleet.errors import NotFound, Unprocessable

router = APIRouter()
DeviceId = Annotated[str, Path(pattern=NAME_PATTERN)]
Time = Annotated[str | None, Query(
    max_length=40, pattern=PLAIN_PATTERN, description="Epoch s or ISO 8601.")]
Name = Annotated[str | None, Query(pattern=NAME_PATTERN)]
ACK_MAX_BYTES = 16 * 1024


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FleetAlertOut(AlertOut):
    acked_by: str | None
    acked_at: dt.datetime | None
    ack_note: str | None


class FleetAlertPage(_Out):
    items: list[FleetAlertOut]


class AckRequest(_Out):
    """``POST /v1/alerts/{id}/ack``."""

    note: str | None = Field(None, max_length=500, pattern=TEXT_PATTERN,
                             description="Why, or what was done (shown with the alert).")


class AckOut(_Out):
    alert_id: str
    acked_by: str
    acked_at: dt.datetime
    note: str | None
    new: bool = Field(description="False: it was acknowledged before (that one is shown).")


class StreamUpdateOut(_Out):
    """The stream's newest model report, when it came after the one that made its model
    active: a candidate on its way (``downloaded`` .. ``shadow``), ``rejected`` or
    ``rolled_back``."""

    name: str
    version: int
    state: str
    reason: str | None


class StreamOut(_Out):
    """``model_*``: the model the stream runs (its newest ``active`` report; None: none)."""

    stream: str
    model_name: str | None
    model_version: int | None
    model_state: str | None
    update: StreamUpdateOut | None = Field(
        description="A newer report than the running model's (e.g. a rejected candidate).")


class SeriesOut(_Out):
    """Epoch seconds; ``points`` are ``[t, max_score | null, windows, alerts]``.

    ``first_at``/``last_at`` and ``current_threshold`` do not depend on the range: the
    console's "all data" range is ``[first_at, last_at]``."""

    stream: str
    since: float
    until: float
    bucket_s: float
    truncated: bool
    points: list[tuple[float, float | None, int, int]]
    thresholds: list[tuple[float, float]]
    last_threshold: float | None
    first_at: float | None = Field(description="Oldest aggregate interval start of the stream.")
    last_at: float | None = Field(description="Newest aggregate interval start of the stream.")
    current_threshold: float | None = Field(
        description="Threshold of the stream's newest alert (None: it never alerted).")


def _queries(request: Request) -> ConsoleQueries:
    found = request.app.state.console_queries
    assert isinstance(found, ConsoleQueries)
    return found


def _known(services: ServicesDep, device_id: str) -> None:
    if services.devices.get(device_id) is None:
        raise NotFound(f"no device {device_id!r}")


@router.get("/v1/alerts", response_model=FleetAlertPage)
def fleet_alerts(
    request: Request, _viewer: ViewerDep,
    device: Name = None, stream: Name = None,
    tag: Annotated[str | None, Query(max_length=64, pattern=PLAIN_PATTERN)] = None,
    since: Time = None, until: Time = None, acked: bool | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> Response:
    query = AlertFilter(device_ids=None if device is None else [device], tag=tag, stream=stream,
                        since=parse_time(since, "since"),
                        until=parse_time(until, "until"), acked=acked, limit=limit)
    # the rows are FleetAlertPage's fields from the database: encoded as they are (the same
    # JSON as the model's, ~1 ms for 500 alerts instead of ~10 ms to validate and dump them)
    body = msgspec.json.encode({"items": _queries(request).alerts(query)})
    return Response(body, media_type="application/json")


@router.post("/v1/alerts/{alert_id}/ack", response_model=AckOut,
             openapi_extra=body_doc(AckRequest))
async def acknowledge(
    alert_id: Annotated[str, Path(pattern=ID_PATTERN)], request: Request, who: OperatorDep
) -> dict[str, Any]:
    empty = request.headers.get("content-length") in (None, "0")
    body = AckRequest() if empty else await read_model(request, AckRequest, ACK_MAX_BYTES)
    out = await run_in_threadpool(_queries(request).acknowledge, alert_id, who.actor, body.note)
    if out["new"]:
        await arecord(request, who, "alert.ack", out["alert_id"], {"note": body.note})
    return out


@router.get("/v1/devices/{device_id}/streams", response_model=list[StreamOut])
def device_streams(
    device_id: DeviceId, request: Request, services: ServicesDep, _viewer: ViewerDep
) -> list[dict[str, Any]]:
    _known(services, device_id)
    return _queries(request).streams(device_id)


@router.get("/v1/devices/{device_id}/series", response_model=SeriesOut)
def device_series(
    device_id: DeviceId, request: Request, services: ServicesDep, _viewer: ViewerDep,
    stream: Annotated[str, Query(pattern=NAME_PATTERN)],
    since: Time = None, until: Time = None,
    points: Annotated[int, Query(ge=10, le=2000)] = 500,
) -> SeriesOut:
    _known(services, device_id)
    hi = parse_time(until, "until") or dt.datetime.now(dt.timezone.utc)
    lo = parse_time(since, "since") or hi - dt.timedelta(hours=24)
    if hi <= lo:
        raise Unprocessable("until must be after since")
    found = _queries(request).series(device_id, stream, lo, hi, points)
    extent = _queries(request).extent(device_id, stream)
    return SeriesOut(stream=stream, since=lo.timestamp(), until=hi.timestamp(),
                     bucket_s=found.bucket_s, truncated=found.truncated, points=found.points,
                     thresholds=found.thresholds, last_threshold=found.last_threshold,
                     first_at=_epoch_s(extent.first_at), last_at=_epoch_s(extent.last_at),
                     current_threshold=extent.current_threshold)


def _epoch_s(at: dt.datetime | None) -> float | None:
    return None if at is None else at.timestamp()


@router.get("/v1/devices/{device_id}/models")
def device_models(
    device_id: DeviceId, request: Request, services: ServicesDep, _viewer: ViewerDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> dict[str, Any]:
    _known(services, device_id)
    return {"reports": _queries(request).model_history(device_id, limit)}


@router.get("/v1/models/running")
def models_running(request: Request, _viewer: ViewerDep) -> Response:
    # plain str/int/None values: msgspec encodes 1,000 devices' entries in under a
    # millisecond, where FastAPI's jsonable_encoder took ~20 ms (benchmarks/console_scale.py)
    body = msgspec.json.encode({"running": _queries(request).running()})
    return Response(body, media_type="application/json")
