"""Request dependencies: the app's services and the principal (who calls, with which role).

Credentials, in order: ``Authorization: Bearer <token>``, else the console's session cookie
(:mod:`fleet.accounts.sessions`; an unsafe method also needs ``X-CSRF-Token`` equal to the
session's, compared with :func:`hmac.compare_digest`). A bearer token is the bootstrap admin
token (compared with :func:`hmac.compare_digest`; ``Settings.admin_token`` empty turns it off),
a personal API token (``efu_...``, :mod:`fleet.accounts.users`), or a device token looked up by
its sha256 (see :mod:`fleet.db.devices`), first in the process's token cache
(:mod:`fleet.db.token_cache`: on PostgreSQL every process drops a revoked token when the
revocation commits; on SQLite it keeps working in the other worker processes for at most
``Settings.auth_cache_ttl_s``). Operators and devices are disjoint: no operator role can
ingest, a device token cannot reach an operator route. Operator routes need a minimum role
(:mod:`fleet.accounts.roles`): :data:`ViewerDep`, :data:`OperatorDep`, :data:`AdminDep`.

The dependencies are ``async``: FastAPI runs a plain ``def`` dependency in the thread pool, one
thread hand-off each (a measurable share of an ingest request's CPU); here only a token-cache
miss goes to the pool (for its database lookup).
"""

from __future__ import annotations

import hmac
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy import Engine
from starlette.concurrency import run_in_threadpool

from fleet.accounts.roles import Role, at_least
from fleet.accounts.service import (
    CSRF_HEADER,
    SESSION_COOKIE,
    Accounts,
    cookie_name,
    get_accounts,
)
from fleet.accounts.users import TOKEN_PREFIX
from fleet.db.devices import DeviceRegistry
from fleet.db.health import HealthStore
from fleet.db.records import RecordStore
from fleet.db.samples import SampleStore
from fleet.db.snapshots import SnapshotStore
from fleet.db.webhooks import WebhookStore
from fleet.errors import Forbidden, Unauthorized
from fleet.events import Events
from fleet.metrics import FleetMetrics
from fleet.settings import Settings


@dataclass(frozen=True)
class Services:
    """Everything a route needs, built once by :func:`fleet.app.create_app`."""

    settings: Settings
    engine: Engine
    devices: DeviceRegistry
    records: RecordStore
    metrics: FleetMetrics
    #: Retraining samples (``POST /v1/samples``).
    samples: SampleStore | None = None
    #: Camera alert snapshots (``/v1/devices/{id}/alerts/{alert_id}/snapshot``).
    snapshots: SnapshotStore | None = None
    #: Called with ``(device_id, stream)`` after a calibration sample batch is stored
    #: (auto-retrain enqueues a retraining job); runs in the thread pool, must be short.
    on_calibration: Callable[[str, str], object] | None = None
    #: Ingest requests in progress in this process, by device (event loop only; see
    #: :mod:`fleet.api.ingest`).
    ingesting: Counter[str] = field(default_factory=Counter)
    #: Device health (``POST /v1/devices/self/health``, online/offline).
    health: HealthStore | None = None
    #: Webhooks and their delivery queue.
    webhooks: WebhookStore | None = None
    #: Queues webhook events (new alerts on ingest).
    events: Events | None = None


@dataclass(frozen=True)
class Principal:
    """Who is calling: one device, or an operator with a role.

    Attributes:
        device_id: The device of a device token (then ``role`` is None).
        username: The operator (``bootstrap`` for the bootstrap admin token).
        role: The operator's role for this request (a token's role is at most its user's).
        via: ``device``, ``bootstrap``, ``token`` (personal API token) or ``session`` (cookie).
    """

    device_id: str | None = None
    username: str | None = None
    role: Role | None = None
    via: str = "device"

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    @property
    def actor(self) -> str:
        """The name the audit log records."""
        return self.username or self.device_id or "?"

    def check_read(self, device_id: str) -> None:
        """Allow any operator, or the device itself.

        Raises:
            Forbidden: A device asked for another device's data.
        """
        if self.device_id is not None and self.device_id != device_id:
            raise Forbidden("a device token can only read its own records")


#: The bootstrap admin token's principal.
BOOTSTRAP = Principal(username="bootstrap", role="admin", via="bootstrap")
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


async def get_services(request: Request) -> Services:
    services = request.app.state.services
    assert isinstance(services, Services)
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


def _bearer(request: Request) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized("missing bearer token (Authorization: Bearer <token>)")
    return token


async def get_principal(request: Request, services: ServicesDep) -> Principal:
    """The caller: a bearer token (bootstrap admin, personal API token, device), else the
    console's session cookie; unsafe methods on a session need the CSRF header.

    Raises:
        Unauthorized: No credentials, or unknown/revoked/expired ones.
        Forbidden: A session's unsafe request without the matching ``X-CSRF-Token``.
        sqlalchemy.exc.OperationalError: The database failed (503).
    """
    accounts = get_accounts(request)
    if "authorization" not in request.headers:
        secure = request.url.scheme == "https"
        cookie = request.cookies.get(cookie_name(SESSION_COOKIE, secure))
        if cookie:
            return await _session_principal(request, accounts, cookie)
    token = _bearer(request)
    admin = services.settings.admin_token
    if admin and hmac.compare_digest(token.encode("utf-8"), admin.encode("utf-8")):
        return BOOTSTRAP
    if token.startswith(TOKEN_PREFIX):
        found = await run_in_threadpool(accounts.users.authenticate_token, token)
        if found is None:
            raise Unauthorized("unknown or revoked token")
        return Principal(username=found.username, role=found.role, via="token")
    device_id = services.devices.authenticate_cached(token)
    if device_id is None:
        device_id = await run_in_threadpool(services.devices.authenticate, token)
    if device_id is None:
        raise Unauthorized("unknown or revoked token")
    return Principal(device_id=device_id)


async def _session_principal(request: Request, accounts: Accounts, cookie: str) -> Principal:
    info = await run_in_threadpool(accounts.sessions.lookup, cookie)
    if info is None:
        raise Unauthorized("session expired or logged out: log in again")
    if request.method not in _SAFE_METHODS:
        sent = request.headers.get(CSRF_HEADER, "")
        if not hmac.compare_digest(sent.encode("utf-8"), info.csrf_token.encode("utf-8")):
            raise Forbidden("missing or wrong CSRF token (X-CSRF-Token)")
    return Principal(username=info.username, role=info.role, via="session")


PrincipalDep = Annotated[Principal, Depends(get_principal)]


def _needs(minimum: Role) -> Callable[[Principal], Awaitable[Principal]]:
    async def check(principal: PrincipalDep) -> Principal:
        if principal.role is None or not at_least(principal.role, minimum):
            raise Forbidden(f"this endpoint needs the {minimum} role")
        return principal

    check.__name__ = f"require_{minimum}"
    return check


async def require_device(principal: PrincipalDep) -> str:
    """The calling device's id. Raises: Forbidden: an operator (it is no device)."""
    if principal.device_id is None:
        raise Forbidden("this endpoint needs a device token, not an operator's")
    return principal.device_id


#: An operator of at least this role (a device token is refused: 403).
ViewerDep = Annotated[Principal, Depends(_needs("viewer"))]
OperatorDep = Annotated[Principal, Depends(_needs("operator"))]
AdminDep = Annotated[Principal, Depends(_needs("admin"))]
DeviceDep = Annotated[str, Depends(require_device)]
