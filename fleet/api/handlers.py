"""Exception handlers: every refusal is JSON ``{"error": <code>, "detail": ...}``.

Bad input never yields a 500: :class:`~fleet.errors.ApiError` maps to its status, FastAPI's
validation errors (query/path/JSON body parameters) to 422, Starlette's HTTP errors (unknown
route, wrong method) keep their status, and a database that is unreachable or out of pooled
connections answers 503 with ``Retry-After`` so devices back off and keep their records.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException

from fleet.errors import ApiError, StorageUnavailable

_log = logging.getLogger(__name__)
RETRY_AFTER_S = 5


class _AsciiJSON(JSONResponse):
    """JSON escaped to ASCII: a detail quoting a lone surrogate a client sent still renders."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, separators=(",", ":"), allow_nan=False).encode("ascii")


def error_response(
    status: int, code: str, detail: Any = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    """The JSON error body every handler uses."""
    return _AsciiJSON({"error": code, "detail": detail}, status_code=status, headers=headers)


def install(app: FastAPI) -> None:
    """Register the handlers on ``app``."""

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return error_response(exc.status, exc.code, exc.detail, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        detail = [
            {"loc": list(err.get("loc", ())), "msg": str(err.get("msg", ""))}
            for err in exc.errors()
        ]
        return error_response(422, "unprocessable", detail)

    @app.exception_handler(HTTPException)
    async def _http(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        code = "not_found" if exc.status_code == 404 else f"http_{exc.status_code}"
        return error_response(exc.status_code, code, exc.detail, dict(exc.headers or {}))

    async def _unavailable(request: Request, exc: Exception) -> JSONResponse:
        retry = exc.retry_after_s if isinstance(exc, StorageUnavailable) else RETRY_AFTER_S
        _log.warning("database unavailable on %s: %s", request.url.path, _first_line(exc))
        return error_response(
            503, "unavailable", "database unavailable, retry later", {"Retry-After": str(retry)}
        )

    for kind in (StorageUnavailable, OperationalError, PoolTimeout):
        app.add_exception_handler(kind, _unavailable)

    @app.exception_handler(DBAPIError)
    async def _dbapi(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, DBAPIError)
        if exc.connection_invalidated:
            return await _unavailable(request, exc)
        _log.error("database error on %s: %s", request.url.path, _first_line(exc))
        return error_response(500, "internal", "database error")


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
