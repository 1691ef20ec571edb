"""``POST /v1/devices/self/health`` (device token): the device's health summary.

Body: a :class:`cloud_sync.health.HealthSummary`, read after the token check, at most
:data:`cloud_sync.health.HEALTH_MAX_BYTES` (gzip allowed), validated (422 with the errors; 403
when ``device_id`` is not the token's device). 204 once stored as the device's latest; the
device is ``online`` from then on (:mod:`fleet.db.health`). Outcomes are counted in
``fleet_health_reports_total{outcome}``.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from starlette.concurrency import run_in_threadpool

from cloud_sync.health import HEALTH_MAX_BYTES, HEALTH_PATH, HealthSummary
from fleet.api.deps import DeviceDep, ServicesDep
from fleet.api.json_body import body_doc, read_model
from fleet.errors import ApiError, Forbidden

router = APIRouter()


@router.post(HEALTH_PATH, status_code=204, openapi_extra=body_doc(HealthSummary),
             summary="A device reports its health summary")
async def report_health(request: Request, device_id: DeviceDep, services: ServicesDep
                        ) -> Response:
    counter = services.metrics.health_reports
    try:
        summary = await read_model(request, HealthSummary, HEALTH_MAX_BYTES)
        if summary.device_id != device_id:
            raise Forbidden(f"health of {summary.device_id!r} sent with the token of "
                            f"{device_id!r}")
    except ApiError as exc:
        counter.labels(exc.code).inc()
        raise
    assert services.health is not None
    await run_in_threadpool(services.health.put, device_id, summary)
    counter.labels("ok").inc()
    return Response(status_code=204)
