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
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import generate_latest
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

    def render(self) -> tuple[bytes, str]:
        """The text exposition and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


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
