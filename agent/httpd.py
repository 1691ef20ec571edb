"""The agent's operations endpoint: ``/metrics`` (Prometheus text) and ``/healthz`` (JSON).

One small :class:`http.server.ThreadingHTTPServer` in a daemon thread, bound to
``agent.metrics_address`` (``127.0.0.1`` by default: expose it on purpose, e.g. to a Prometheus on
another host, by setting ``0.0.0.0``) and ``agent.metrics_port``:

``GET /metrics``
    ``prometheus_client.generate_latest`` of the agent's registry (content type
    ``text/plain; version=0.0.4``).
``GET /healthz``
    Who answers, then the :class:`agent.health.Report`, as JSON: ``{"device_id": "gw1",
    "version": "0.1.0", "status": "green|yellow|red", "at": epoch_s, "components": {name:
    {"state", "reason", ...figures}}}``; HTTP 200 for green and yellow, 503 for red.
    ``edge-agent status --config`` compares ``device_id`` with the config's, so another agent
    on the same port is not taken for this one.

Anything else is 404. Requests are not logged (Prometheus scrapes every 15 s). A client that
hangs up before the answer is written (a scrape timeout, ``curl`` interrupted) is not an error;
a connection that sends no complete request within ``client_timeout_s`` is closed, so idle or
byte-a-second clients do not keep threads; any other failure of a request is logged as a
WARNING, at most once a minute.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from agent.health import Report
from agent.logs import RateLimiter

log = logging.getLogger(__name__)


class OpsServer:
    """Serves ``/metrics`` and ``/healthz`` until :meth:`stop`.

    Args:
        registry: The agent's metrics registry.
        health: Returns the current report; None = ``/healthz`` answers 503 "starting".
        address: Address to bind (``127.0.0.1`` by default).
        port: TCP port; 0 picks a free one (see :attr:`port`).
        identity: Returns the fields naming this agent in ``/healthz`` (``device_id``,
            ``version``); None = none.
        client_timeout_s: Seconds a connection may take to send its request (and to take the
            answer) before it is closed.

    Raises:
        OSError: The address cannot be bound (port in use, address not local).
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        health: Callable[[], Report] | None = None,
        address: str = "127.0.0.1",
        port: int = 0,
        identity: Callable[[], dict[str, object]] | None = None,
        client_timeout_s: float = 10.0,
    ) -> None:
        self.registry = registry
        self.health = health
        self.identity = identity
        self.client_timeout_s = client_timeout_s
        self._server = _Server((address, port), _handler_for(self))
        self._server.daemon_threads = True
        self.address = address
        self.port: int = self._server.server_address[1]
        self._thread: threading.Thread | None = None

    def start(self) -> OpsServer:
        """Start serving in a daemon thread; returns self."""
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="ops-http", daemon=True
        )
        self._thread.start()
        log.info("metrics on http://%s:%d/metrics, health on /healthz", self.address, self.port)
        return self

    def stop(self) -> None:
        """Stop serving and close the socket (idempotent)."""
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(5.0)
            self._thread = None
        self._server.server_close()


class _Server(ThreadingHTTPServer):
    """Logs a failed request once a minute instead of printing its traceback on stderr."""

    def __init__(self, address: tuple[str, int],
                 handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(address, handler)
        self.limiter = RateLimiter(60.0)

    def handle_error(self, request: object, client_address: object) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return  # the client hung up or stalled: nothing to answer
        suppressed = self.limiter.hit("request")
        if suppressed is not None:
            log.warning("metrics endpoint: a request from %s failed: %r", client_address, exc)


def _handler_for(server: OpsServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = server.client_timeout_s  # each read and write of the connection
        _deadline: threading.Timer

        def setup(self) -> None:
            super().setup()
            # the whole request (line and headers) within client_timeout_s: the socket's
            # timeout bounds each read only, so a byte every few seconds kept the thread
            self._deadline = threading.Timer(server.client_timeout_s, self._expire)
            self._deadline.daemon = True
            self._deadline.start()

        def _expire(self) -> None:
            with contextlib.suppress(OSError):  # the blocked read then returns b""
                self.connection.shutdown(socket.SHUT_RDWR)

        def parse_request(self) -> bool:
            ok = super().parse_request()  # reads the headers too
            self._deadline.cancel()  # the request is in; the answer has the write timeout
            return ok

        def finish(self) -> None:
            self._deadline.cancel()
            super().finish()

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, CONTENT_TYPE_LATEST, generate_latest(server.registry))
            elif path == "/healthz":
                if server.health is None:
                    body: dict[str, object] = {"status": "red", "components": {},
                                               "reason": "starting"}
                    code = 503
                else:
                    report = server.health()
                    body, code = report.to_json(), report.http_status
                if server.identity is not None:
                    body = {**server.identity(), **body}
                data = json.dumps(body, indent=1).encode()
                self._send(code, "application/json", data)
            else:
                self._send(404, "text/plain; charset=utf-8", b"not found: try /metrics, /healthz\n")

        def _send(self, code: int, ctype: str, data: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            return

    return Handler
