"""Every Prometheus metric of the fleet service, in one registry per app.

Each :func:`fleet.app.create_app` builds its own :class:`FleetMetrics` (own
``CollectorRegistry``) so that several apps in one process (tests) never share counters.

Metrics:
    fleet_http_requests_total{method,route,status}: requests answered; ``route`` is the route
        template (``/v1/devices/{device_id}/alerts``) or ``unmatched``, never the raw path.
    fleet_http_request_duration_seconds{method,route}: histogram, seconds from request start to
        the last response byte.
    fleet_ingest_records_total{kind,status}: records by outcome (accepted/duplicate/rejected).
    fleet_ingest_batches_total{outcome}: ingest requests by outcome (ok, or the error code).
    fleet_health_reports_total{outcome}: device health reports (ok, or the error code).
    fleet_webhook_deliveries_total{event,outcome}: delivery attempts (delivered/retry/dead).
    fleet_webhook_events_dropped_total{event}: events that could not be queued (database).
    fleet_devices{state}: active devices by state (online/offline/unknown), read from the
        database at scrape time (cached :data:`DEVICE_STATES_TTL_S`).
    fleet_replica_info{replica}: always 1; names the replica that answered the scrape
        (``serve --replica-id``, default ``<host name>:<port>``). Every other metric counts this
        replica only: scrape each replica (Prometheus adds its ``instance`` label).
    fleet_model_archive_corrupt_total: model downloads refused because the stored archive no
        longer matches its recorded sha256 (:mod:`fleet.registry.integrity`).
    fleet_invalidations_total{kind}: cache invalidations received from any replica
        (PostgreSQL ``NOTIFY``, :mod:`fleet.db.invalidation`).
    fleet_invalidation_listens_total: times a process's invalidation listener (re)connected and
        emptied its token cache (above the number of worker processes: reconnects).
    fleet_invalidation_listening: 1 while the scraped process listens for invalidations, 0
        while its token cache is off for want of a connection (PostgreSQL only).

With ``edge-fleet serve --workers N`` (N > 1) each worker process counts in its own files in
``PROMETHEUS_MULTIPROC_DIR`` (a fresh directory ``serve`` makes) and ``/metrics`` answers the sum
over every worker (prometheus_client's multiprocess mode, ``MultiProcessCollector``), whichever
worker serves the scrape. Without the variable each process has its own registry.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from sqlalchemy.exc import SQLAlchemyError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

_LATENCY_BUCKETS_S = (
    0.002, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)


class FleetMetrics:
    """The service's metrics.

    Args:
        registry: Where to register; a fresh ``CollectorRegistry`` when omitted.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.requests = Counter(
            "fleet_http_requests", "HTTP requests answered.", ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "fleet_http_request_duration_seconds", "HTTP request latency, seconds.",
            ["method", "route"], buckets=_LATENCY_BUCKETS_S, registry=self.registry,
        )
        self.ingest_records = Counter(
            "fleet_ingest_records", "Ingested records by outcome.", ["kind", "status"],
            registry=self.registry,
        )
        self.ingest_batches = Counter(
            "fleet_ingest_batches", "Ingest requests by outcome.", ["outcome"],
            registry=self.registry,
        )

        self.health_reports = Counter(
            "fleet_health_reports", "Device health reports by outcome.", ["outcome"],
            registry=self.registry,
        )
        self.webhook_deliveries = Counter(
            "fleet_webhook_deliveries", "Webhook delivery attempts by outcome.",
            ["event", "outcome"], registry=self.registry,
        )
        self.webhook_events_dropped = Counter(
            "fleet_webhook_events_dropped", "Webhook events not queued (database failed).",
            ["event"], registry=self.registry,
        )
        self.model_archive_corrupt = Counter(
            "fleet_model_archive_corrupt",
            "Model downloads refused: the stored archive fails its recorded sha256.",
            registry=self.registry,
        )
        self.invalidations = Counter(
            "fleet_invalidations", "Cache invalidations received from any replica.", ["kind"],
            registry=self.registry,
        )
        self.invalidation_listens = Counter(
            "fleet_invalidation_listens",
            "Invalidation listener (re)connects (each empties the token cache).",
            registry=self.registry,
        )
        self._scraped: list[Collector] = []

    def add_scrape_collector(self, collector: Collector) -> None:
        """A collector read at every scrape (values from the database, not from a process)."""
        self._scraped.append(collector)
        if not multiprocess_dir():
            self.registry.register(collector)

    def render(self) -> tuple[bytes, str]:
        """The text exposition and its content type (summed over worker processes in
        multiprocess mode, see the module docstring)."""
        if not multiprocess_dir():
            return generate_latest(self.registry), CONTENT_TYPE_LATEST
        registry = CollectorRegistry()
        MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        for collector in self._scraped:
            registry.register(collector)
        return generate_latest(registry), CONTENT_TYPE_LATEST


def multiprocess_dir() -> str | None:
    """``PROMETHEUS_MULTIPROC_DIR`` when set (multiprocess mode), else None."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


#: Seconds the device-state gauge reuses its last database read.
DEVICE_STATES_TTL_S = 5.0


class DeviceStates(Collector):
    """``fleet_devices{state}`` from a ``counts()`` callable (:meth:`fleet.db.health.
    HealthStore.counts`); a failed read yields nothing for that scrape."""

    def __init__(self, counts: Callable[[], Mapping[str, int]],
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._counts = counts
        self._monotonic = monotonic
        self._cached: tuple[float, Mapping[str, int]] | None = None
        self._lock = threading.Lock()

    def collect(self) -> Iterator[Metric]:
        now = self._monotonic()
        with self._lock:
            cached = self._cached
        if cached is None or now - cached[0] >= DEVICE_STATES_TTL_S:
            try:
                cached = (now, dict(self._counts()))
            except SQLAlchemyError:
                return
            with self._lock:
                self._cached = cached
        family = GaugeMetricFamily("fleet_devices", "Active devices by state.",
                                   labels=["state"])
        for state, n in sorted(cached[1].items()):
            family.add_metric([state], n)
        yield family


class ReplicaInfo(Collector):
    """``fleet_replica_info{replica} 1``, and ``fleet_invalidation_listening`` when
    ``listening`` is given (a PostgreSQL fleet)."""

    def __init__(self, replica: str, listening: Callable[[], bool] | None = None) -> None:
        self._replica = replica
        self._listening = listening

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily("fleet_replica_info", "The replica answering this scrape.",
                                 labels=["replica"])
        info.add_metric([self._replica], 1)
        yield info
        if self._listening is not None:
            yield GaugeMetricFamily(
                "fleet_invalidation_listening",
                "1 while this process listens for invalidations (token cache on).",
                value=1 if self._listening() else 0)


class MetricsMiddleware:
    """Pure ASGI middleware counting requests and timing them by route template.

    Args:
        app: The wrapped ASGI app.
        metrics: Where to count.
    """

    def __init__(self, app: ASGIApp, metrics: FleetMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = _route_of(scope)
            method = str(scope.get("method", ""))
            self.metrics.requests.labels(method, route, str(status)).inc()
            self.metrics.latency.labels(method, route).observe(time.perf_counter() - start)


def _route_of(scope: Scope) -> str:
    route: Any = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else "unmatched"
