"""Record an operator action in the audit log (:mod:`fleet.accounts.audit`) from a route."""

from __future__ import annotations

from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from fleet.accounts.service import get_accounts
from fleet.api.deps import Principal


def client_address(request: Request) -> str | None:
    """The client's address as uvicorn saw it (the proxy's ``X-Forwarded-For`` when trusted)."""
    return request.client.host if request.client is not None else None


def record(
    request: Request, who: Principal, action: str, target: str | None = None,
    detail: dict[str, Any] | None = None,
) -> None:
    """Append one entry (blocking: from a ``def`` route or the thread pool)."""
    get_accounts(request).audit.record(
        who.actor, who.via, action, target, client_address(request), detail
    )


async def arecord(
    request: Request, who: Principal, action: str, target: str | None = None,
    detail: dict[str, Any] | None = None,
) -> None:
    """:func:`record` from an ``async`` route (runs in the thread pool)."""
    await run_in_threadpool(record, request, who, action, target, detail)
