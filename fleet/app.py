"""Composition root of the fleet service: :func:`create_app` wires settings, engine,
repositories, metrics, routers and error handlers into one FastAPI app."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from sqlalchemy import Engine

from fleet.accounts.service import build_accounts
from fleet.api import (
    accounts,
    console_data,
    device_health,
    devices,
    docs,
    handlers,
    health,
    ingest,
    registry,
    rollouts,
    samples,
    snapshots,
    webhooks,
)
from fleet.api.deps import Services
from fleet.api.json_body import install_openapi
from fleet.console import routes as console
from fleet.db.console_queries import ConsoleQueries
from fleet.db.devices import DeviceRegistry
from fleet.db.engine import make_engine
from fleet.db.health import HealthStore
from fleet.db.records import RecordStore
from fleet.db.samples import SampleStore
from fleet.db.snapshots import SnapshotStore
from fleet.db.token_cache import TokenCache
from fleet.db.webhooks import WebhookStore
from fleet.housekeeping import Housekeeper, retention_for
from fleet.metrics import DeviceStates, FleetMetrics, MetricsMiddleware
from fleet.registry.wiring import build_model_loop
from fleet.settings import Settings

API_VERSION = "1"


def create_app(
    settings: Settings,
    engine: Engine | None = None,
    on_calibration: Callable[[str, str], object] | None = None,
) -> FastAPI:
    """Build the app. The schema must already be migrated (``edge-fleet serve`` does it).

    Args:
        settings: Service settings (database URL, admin token, limits).
        engine: An existing engine (tests); built from ``settings.db_url`` when omitted.
        on_calibration: Called with ``(device_id, stream)`` after a device stored calibration
            samples (``serve --auto-retrain``: :meth:`fleet.jobs.queue.JobQueue.enqueue`).

    Raises:
        ConfigError: ``settings.db_url`` is invalid (only when ``engine`` is omitted), or a
            trusted key or the signing key cannot be loaded.
    """
    engine = engine if engine is not None else make_engine(settings)
    metrics = FleetMetrics()
    ttl = settings.auth_cache_ttl_s
    token_cache = TokenCache(ttl) if ttl > 0 else None
    health_store = HealthStore(engine, settings.offline_after_s)
    hooks = WebhookStore(engine)
    keeper = Housekeeper(settings, health_store, hooks, retention_for(settings, engine), metrics)
    metrics.add_scrape_collector(DeviceStates(health_store.counts))

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        keeper.start()  # offline sweep, retention, webhook deliveries (fleet.housekeeping)
        try:
            yield
        finally:
            keeper.stop()

    app = FastAPI(
        title="edge-fleet",
        version=API_VERSION,
        docs_url=None,  # fleet.api.docs serves /docs with its own assets (no CDN)
        redoc_url=None,
        openapi_url="/openapi.json",
        lifespan=lifespan,
    )
    app.state.housekeeper = keeper
    app.state.services = Services(
        settings=settings,
        engine=engine,
        devices=DeviceRegistry(engine, token_cache=token_cache),
        records=RecordStore(engine),
        metrics=metrics,
        samples=SampleStore(engine),
        snapshots=SnapshotStore(engine),
        on_calibration=on_calibration,
        health=health_store,
        webhooks=hooks,
        events=keeper.events,
    )
    app.state.model_loop = build_model_loop(settings, engine)
    app.state.accounts = build_accounts(engine, settings.session_ttl_s)
    app.state.console_queries = ConsoleQueries(engine)
    handlers.install(app)
    install_openapi(app)
    for module in (ingest, device_health, devices, health, samples, snapshots, registry, rollouts,
                   webhooks, accounts, console_data, console, docs):
        app.include_router(module.router)
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    return app
