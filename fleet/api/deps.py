"""Request dependencies: the app's services and the bearer-token principal.

Tokens arrive as ``Authorization: Bearer <token>``. The admin token is compared with
:func:`hmac.compare_digest`; a device token is looked up by its sha256 (see
:mod:`fleet.db.devices`), first in the process's token cache (:mod:`fleet.db.token_cache`:
a revoked token keeps working in other worker processes for at most
``Settings.auth_cache_ttl_s``). Admin and device tokens are disjoint roles: the admin token
cannot ingest, a device token cannot manage devices.

The dependencies are ``async``: FastAPI runs a plain ``def`` dependency in the thread pool, one
thread hand-off each (a measurable share of an ingest request's CPU); here only a token-cache
miss goes to the pool (for its database lookup).
"""

from __future__ import annotations

import hmac
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy import Engine
from starlette.concurrency import run_in_threadpool

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
    #: (auto-retrain schedules a training run); must not block.
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
    """Who is calling: the admin, or one device."""

    device_id: str | None = None

    @property
    def is_admin(self) -> bool:
        return self.device_id is None

    def check_read(self, device_id: str) -> None:
        """Allow the admin or the device itself.

        Raises:
            Forbidden: A device asked for another device's data.
        """
        if not self.is_admin and self.device_id != device_id:
            raise Forbidden("a device token can only read its own records")


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
    """The admin or the device owning the bearer token.

    Raises:
        Unauthorized: No token, or an unknown/revoked one.
        sqlalchemy.exc.OperationalError: The database failed (503).
    """
    token = _bearer(request)
    admin = services.settings.admin_token
    if hmac.compare_digest(token.encode("utf-8"), admin.encode("utf-8")):
        return Principal()
    device_id = services.devices.authenticate_cached(token)
    if device_id is None:
        device_id = await run_in_threadpool(services.devices.authenticate, token)
    if device_id is None:
        raise Unauthorized("unknown or revoked token")
    return Principal(device_id=device_id)


PrincipalDep = Annotated[Principal, Depends(get_principal)]


async def require_admin(principal: PrincipalDep) -> Principal:
    """Raises: Forbidden: not the admin token."""
    if not principal.is_admin:
        raise Forbidden("this endpoint needs the admin token")
    return principal


async def require_device(principal: PrincipalDep) -> str:
    """The calling device's id. Raises: Forbidden: the admin token (it is no device)."""
    if principal.device_id is None:
        raise Forbidden("ingest needs a device token, not the admin token")
    return principal.device_id


AdminDep = Annotated[Principal, Depends(require_admin)]
DeviceDep = Annotated[str, Depends(require_device)]
