"""Composition root of the fleet service: :func:`create_app` wires settings, engine,
repositories, metrics, routers and error handlers into one FastAPI app."""

from __future__ import annotations

import socket
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
from fleet.db.invalidation import DEVICE, InvalidationListener, listener_connect
from fleet.db.partitions import PartitionMaintainer
from fleet.db.records import RecordStore
from fleet.db.samples import SampleStore
from fleet.db.snapshots import SnapshotStore
from fleet.db.token_cache import TokenCache, effective_ttl_s
from fleet.db.webhooks import WebhookStore
from fleet.housekeeping import Housekeeper, retention_for
from fleet.metrics import DeviceStates, FleetMetrics, MetricsMiddleware, ReplicaInfo
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
    shared = engine.dialect.name == "postgresql"  # replicas on other hosts may share it
    # on PostgreSQL the cache answers only while the listener hears every revocation, and
    # its entries live an hour (the listener drops a revoked one at once)
    ttl = effective_ttl_s(settings.auth_cache_ttl_s, listened=shared)
    token_cache = TokenCache(ttl, suspended=shared) if ttl > 0 else None
    listener = _listener(engine, token_cache, metrics) if shared else None
    health_store = HealthStore(engine, settings.offline_after_s)
    hooks = WebhookStore(engine)
    keeper = Housekeeper(settings, health_store, hooks, retention_for(settings, engine), metrics,
                         PartitionMaintainer(engine))
    metrics.add_scrape_collector(DeviceStates(health_store.counts))
    metrics.add_scrape_collector(ReplicaInfo(
        settings.replica_id or socket.gethostname(),
        (lambda: listener.listening) if listener is not None else None))

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if listener is not None:
            listener.start()  # cross-replica token revocations (fleet.db.invalidation)
        keeper.start()  # offline sweep, retention, webhook deliveries (fleet.housekeeping)
        try:
            yield
        finally:
            keeper.stop()
            if listener is not None:
                listener.stop()

    app = FastAPI(
        title="edge-fleet",
        version=API_VERSION,
        docs_url=None,  # fleet.api.docs serves /docs with its own assets (no CDN)
        redoc_url=None,
        openapi_url="/openapi.json",
        lifespan=lifespan,
    )
    app.state.housekeeper = keeper
    app.state.invalidation_listener = listener
    app.state.token_cache = token_cache
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


def _listener(
    engine: Engine, cache: TokenCache | None, metrics: FleetMetrics
) -> InvalidationListener | None:
    """The PostgreSQL invalidation listener feeding ``cache`` (None: nothing is cached)."""
    if cache is None:
        return None

    def message(kind: str, key: str) -> None:
        metrics.invalidations.labels(kind).inc()
        if kind == DEVICE:
            cache.drop_device(key)

    def listening() -> None:
        metrics.invalidation_listens.inc()
        cache.resume()  # empty: revocations sent while not listening were missed

    return InvalidationListener(listener_connect(engine), message, listening, cache.suspend)
