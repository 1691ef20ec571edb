"""Operator and query routes: enroll, list, revoke devices; read a device's records.

Minimum roles (:mod:`fleet.accounts.roles`): reads need viewer, changes operator; every change
is recorded in the audit log.

* ``POST /v1/devices`` (operator): enroll, 201 with the token (shown once); 409 if enrolled. The
  body is read only after the token is checked, at most 64 KiB (:mod:`fleet.api.json_body`).
* ``GET /v1/devices`` (viewer): list with last_seen, versions, backlog, ``state``
  (online/offline/unknown) and the latest ``health`` summary (:mod:`fleet.db.health`;
  ``?include_revoked=true`` adds revoked ones; ``?device=ID`` lists only that device: one
  or no entry).
* ``DELETE /v1/devices/{device_id}`` (operator): revoke, 204; 404 if not active.
* ``PATCH /v1/devices/{device_id}/tags`` (operator): ``{"add": [tag...], "remove": [tag...]}``,
  read after the token is checked, at most 64 KiB
  (:func:`fleet.db.devices.change_tags`), 200 with the device; 404 if not active, 422 for a bad
  tag. Rollouts created afterwards target the new tags.
* ``GET /v1/devices/{device_id}/aggregates`` and ``/alerts`` (viewer, or that device's token):
  ``stream``, ``since`` (inclusive), ``until`` (exclusive) as epoch seconds or ISO 8601 with a
  timezone, ``limit`` (1..settings.query_limit_max, default 1000). Aggregates are timed by
  ``interval_start``, alerts by ``window_start``. One interval of a stream may come as several
  aggregate rows, its PARTS (ids ``<device>:<stream>:<ms>`` and ``...:<ms>:<k>``: the device
  restarted within the interval); they are returned as stored, not merged. How to combine them
  (sums, max, count-weighted mean, pooled std): docs/fleet-protocol.md, "Aggregate parts".
"""

from __future__ import annotations

import datetime as dt
import math
import re
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from cloud_sync.isotime import fromisoformat
from cloud_sync.protocol import NAME_PATTERN, PLAIN_PATTERN, EnrollRequest, EnrollResponse
from fleet.api.auditing import arecord, record
from fleet.api.deps import OperatorDep, PrincipalDep, ServicesDep, ViewerDep
from fleet.api.json_body import ENROLL_MAX_BYTES, body_doc, read_model
from fleet.api.models import AggregatePage, AlertPage, DeviceList, DeviceOut, TagsChange
from fleet.db.records import TimeQuery
from fleet.errors import NotFound, Unprocessable

router = APIRouter()
_NAME = re.compile(NAME_PATTERN)


@router.post("/v1/devices", status_code=201, response_model=EnrollResponse,
             openapi_extra=body_doc(EnrollRequest))
async def enroll(request: Request, services: ServicesDep, who: OperatorDep) -> EnrollResponse:
    body = await read_model(request, EnrollRequest, ENROLL_MAX_BYTES)  # after the token check
    token = await run_in_threadpool(services.devices.enroll, body.device_id, body.tags)
    await arecord(request, who, "device.enroll", body.device_id, {"tags": body.tags})
    return EnrollResponse(device_id=body.device_id, token=token)


@router.get("/v1/devices", response_model=DeviceList)
def list_devices(
    services: ServicesDep, _viewer: ViewerDep, include_revoked: bool = False,
    device: Annotated[str | None, Query(pattern=NAME_PATTERN,
                                        description="Only this device.")] = None,
) -> Response:
    if services.health is not None:  # one query, JSON columns passed through (fleet.db.health)
        body = services.health.listing_json(include_revoked=include_revoked, device_id=device)
    else:
        body = DeviceList(devices=[
            DeviceOut.of(d) for d in services.devices.list(include_revoked=include_revoked)
            if device is None or d.device_id == device
        ]).model_dump_json().encode()
    return Response(body, media_type="application/json")


DeviceId = Annotated[str, Path(pattern=NAME_PATTERN)]


@router.delete("/v1/devices/{device_id}", status_code=204)
def revoke(
    device_id: DeviceId, request: Request, services: ServicesDep, who: OperatorDep
) -> Response:
    services.devices.revoke(device_id)
    record(request, who, "device.revoke", device_id)
    return Response(status_code=204)


@router.patch("/v1/devices/{device_id}/tags", response_model=DeviceOut,
              openapi_extra=body_doc(TagsChange))
async def change_tags(
    device_id: DeviceId, request: Request, services: ServicesDep, who: OperatorDep
) -> DeviceOut:
    change = await read_model(request, TagsChange, ENROLL_MAX_BYTES)  # after the token check
    device = await run_in_threadpool(services.devices.set_tags, device_id, change.add,
                                     change.remove)
    await arecord(request, who, "device.tag", device_id,
                  {"add": change.add, "remove": change.remove})
    return DeviceOut.of(device)


Since = Annotated[str | None, Query(
    max_length=40, pattern=PLAIN_PATTERN, description="Epoch s or ISO 8601.")]
Stream = Annotated[str | None, Query(pattern=NAME_PATTERN)]
AnyDeviceId = Annotated[str, Path(max_length=64, pattern=PLAIN_PATTERN)]
Limit = Annotated[int, Query(ge=1)]


@router.get("/v1/devices/{device_id}/aggregates", response_model=AggregatePage)
def device_aggregates(
    device_id: AnyDeviceId,
    services: ServicesDep,
    principal: PrincipalDep,
    stream: Stream = None,
    since: Since = None,
    until: Since = None,
    limit: Limit = 1000,
) -> dict[str, Any]:
    query = _query(device_id, services, principal, stream, since, until, limit)
    rows = services.records.aggregates(query)
    return {"items": rows[: query.limit - 1], "truncated": len(rows) == query.limit}


@router.get("/v1/devices/{device_id}/alerts", response_model=AlertPage)
def device_alerts(
    device_id: AnyDeviceId,
    services: ServicesDep,
    principal: PrincipalDep,
    stream: Stream = None,
    since: Since = None,
    until: Since = None,
    limit: Limit = 1000,
) -> dict[str, Any]:
    query = _query(device_id, services, principal, stream, since, until, limit)
    rows = services.records.alerts(query)
    items = rows[: query.limit - 1]
    if services.snapshots is not None and items:
        kinds = services.snapshots.kinds(device_id, [str(r["id"]) for r in items])
        for r in items:
            r["snapshots"] = kinds.get(str(r["id"]), [])
    return {"items": items, "truncated": len(rows) == query.limit}


def _query(
    device_id: str,
    services: ServicesDep,
    principal: PrincipalDep,
    stream: str | None,
    since: str | None,
    until: str | None,
    limit: int,
) -> TimeQuery:
    """Check access and parameters; the returned limit is one more than asked (truncation probe).

    Raises:
        Forbidden: A device reading another device.
        NotFound: Unknown device (admin only; a device never learns which ids exist).
        Unprocessable: Bad time bound or limit.
    """
    principal.check_read(device_id)
    if not _NAME.match(device_id) or (
        principal.device_id is None and services.devices.get(device_id) is None
    ):
        raise NotFound(f"no device {device_id!r}")
    if limit > services.settings.query_limit_max:
        raise Unprocessable(f"limit must be at most {services.settings.query_limit_max}")
    lo, hi = _time(since, "since"), _time(until, "until")
    if lo is not None and hi is not None and hi < lo:
        raise Unprocessable("until is before since")
    return TimeQuery(device_id=device_id, stream=stream, since=lo, until=hi, limit=limit + 1)


def _time(text: str | None, name: str) -> dt.datetime | None:
    """Epoch seconds or ISO 8601 with timezone -> aware UTC."""
    if text is None or text == "":
        return None
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(seconds) or not 0 <= seconds <= 32503680000:
            raise Unprocessable(f"{name}: epoch seconds out of range")
        return dt.datetime.fromtimestamp(seconds, tz=dt.timezone.utc)
    try:
        value = fromisoformat(text)
        if value.tzinfo is None:
            raise Unprocessable(f"{name}: ISO 8601 needs a timezone (e.g. Z)")
        return value.astimezone(dt.timezone.utc)
    except (ValueError, OverflowError):
        raise Unprocessable(f"{name}: not epoch seconds nor ISO 8601") from None


