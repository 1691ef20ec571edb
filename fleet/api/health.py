"""``GET /healthz`` (200 ``{"status": "ok"}`` when the database answers, else 503 with
``Retry-After``) and ``GET /metrics`` (Prometheus text format). Neither needs a token."""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from fleet.api.deps import ServicesDep
from fleet.api.handlers import RETRY_AFTER_S, error_response

router = APIRouter()


@router.get("/healthz")
def healthz(services: ServicesDep) -> JSONResponse:
    try:
        with services.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except SQLAlchemyError:
        return error_response(
            503, "unavailable", "database unreachable", {"Retry-After": str(RETRY_AFTER_S)}
        )
    return JSONResponse({"status": "ok"})


@router.get("/metrics")
def metrics(services: ServicesDep) -> Response:
    body, content_type = services.metrics.render()
    return Response(body, media_type=content_type)
