"""Slow and idle clients: close a connection that does not send a whole request in time.

uvicorn closes a keep-alive connection that stays idle after a response
(``timeout_keep_alive``, 5 s), but nothing closes a connection that never completes a request:
one that connects and sends nothing, or trickles its headers or body a byte at a time. Each such
connection holds a file descriptor for as long as the client likes; 48 of them locked every new
client out of a fleet with a 64-descriptor limit.

:class:`GuardedHttpToolsProtocol` is uvicorn's httptools protocol (what ``uvicorn[standard]``
runs) with a request deadline:

* a connection must begin and complete its request headers within ``request_timeout_s`` of
  connecting (or of the previous response, for a keep-alive connection that starts a request);
* the body must then be complete within ``request_timeout_s`` plus its ``Content-Length`` at
  :data:`MIN_BODY_RATE` bytes per second (a 16 MiB ingest body gets 10 + 512 s, so a gateway on
  a slow link still uploads; a trickled body is cut off);
* once the response is sent, an unread rest of the body must arrive within ``request_timeout_s``;
* request headers over :data:`MAX_HEADER_BYTES` are refused (431).

Optionally (``edge-fleet serve --max-conns-per-client N``, off by default) a client address
holds at most N open connections per process: a further one is answered ``503`` and closed at
once, so a single host reconnecting as fast as the fleet closes its slow connections cannot
hold more than N descriptors. Off by default because the address is the TCP peer: behind a
reverse proxy or a NAT many devices share one (put the limit in the proxy then); with
``--workers W`` each worker counts its own connections (W x N in all).

A connection past its deadline gets ``408 Request Timeout`` (when no response has started) and
is closed; the first one is logged, later ones are counted and summed up at most once a minute.
HTTPS: the TLS handshake precedes all this. It is bounded by the same ``request_timeout_s``:
:func:`configure` sets asyncio's handshake timeout (``asyncio.constants.SSL_HANDSHAKE_TIMEOUT``,
60 s by default, read when each TLS connection is made), and ``edge-fleet serve --tls-cert``
runs uvicorn on the asyncio loop, whose TLS layer reads it (uvloop's has its own fixed 60 s). A
client that connects and never finishes its handshake therefore holds its descriptor for at most
``request_timeout_s``, not a minute.
"""

from __future__ import annotations

import asyncio
import asyncio.constants
import logging
import time
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

#: Least body rate a client must keep up, bytes per second (see module docstring).
MIN_BODY_RATE = 32 * 1024
#: Largest request line and headers accepted, bytes.
MAX_HEADER_BYTES = 64 * 1024
#: Default deadline of a request's headers, seconds.
DEFAULT_REQUEST_TIMEOUT_S = 10.0
_LOG_EVERY_S = 60.0

_log = logging.getLogger(__name__)
_RESPONSE_408 = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
    b"content-length: 69\r\nconnection: close\r\n\r\n"
    b'{"error": "request_timeout", "detail": "request not received in time"}'
)
_RESPONSE_503 = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b"content-length: 72\r\nretry-after: 5\r\nconnection: close\r\n\r\n"
    b'{"error": "too_many_connections", "detail": "too many connections open"}'
)
_RESPONSE_431 = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n"
    b"connection: close\r\n\r\n"
)


class _Tally:
    """Closed slow connections of this process: the first logged, then a sum per minute."""

    closed = 0
    _unlogged = 0
    _logged_at = 0.0

    @classmethod
    def count(cls, why: str) -> None:
        cls.closed += 1
        cls._unlogged += 1
        now = time.monotonic()
        if cls.closed == 1 or now - cls._logged_at >= _LOG_EVERY_S:
            _log.warning("closed %d connection(s) that did not send a whole request in time "
                         "(latest: %s)", cls._unlogged, why)
            cls._unlogged = 0
            cls._logged_at = now


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the deadlines of the module docstring.

    ``request_timeout_s`` is a class attribute: :func:`configure` sets it for the process
    (uvicorn builds one protocol object per connection, from the class alone).
    """

    request_timeout_s: ClassVar[float] = DEFAULT_REQUEST_TIMEOUT_S
    #: Open connections per client address in this process (0: no limit).
    max_per_client: ClassVar[int] = 0
    _open: ClassVar[dict[str, int]] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._client: str | None = None
        self._header_bytes = 0
        self._in_headers = True

    def _arm(self, seconds: float, why: str) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._too_slow, why)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self, why: str) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self.cycle is None or not self.cycle.response_started:
            self.transport.write(_RESPONSE_408)
        _Tally.count(why)
        self.transport.close()

    # --- protocol and parser callbacks ---------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.max_per_client > 0:
            peer = transport.get_extra_info("peername")
            client = str(peer[0]) if isinstance(peer, tuple) and peer else None
            if client is not None:
                if self._open.get(client, 0) >= self.max_per_client:
                    transport.write(_RESPONSE_503)
                    _Tally.count(f"more than {self.max_per_client} connections from {client}")
                    transport.close()
                    return
                self._open[client] = self._open.get(client, 0) + 1
                self._client = client
        self._arm(self.request_timeout_s, "no request headers")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._client is not None:
            left = self._open.get(self._client, 1) - 1
            if left > 0:
                self._open[self._client] = left
            else:
                self._open.pop(self._client, None)
            self._client = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if not self._in_headers or self.transport.is_closing():
            return
        self._header_bytes += len(data)  # the headers are still not complete after this data
        if self._header_bytes > MAX_HEADER_BYTES:
            self._disarm()
            self.transport.write(_RESPONSE_431)
            self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_headers = True
        self._header_bytes = 0
        if self._deadline is None:  # a keep-alive connection starts its next request
            self._arm(self.request_timeout_s, "request headers incomplete")

    def on_headers_complete(self) -> None:
        self._in_headers = False
        super().on_headers_complete()
        length = 0
        for name, value in self.headers:
            if name == b"content-length" and value.isdigit():
                length = int(value)
        self._arm(self.request_timeout_s + length / MIN_BODY_RATE, "request body incomplete")

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        cycle = self.cycle
        if cycle is not None and cycle.more_body and not self.transport.is_closing():
            self._arm(self.request_timeout_s, "unread request body after the response")


def configure(request_timeout_s: float, max_per_client: int = 0) -> None:
    """Set the request deadline (seconds, > 0) and the open connections allowed per client
    address (0: no limit) of every later connection of this process.

    Raises:
        ValueError: a deadline not positive, or a negative limit.
    """
    if not request_timeout_s > 0:
        raise ValueError("request_timeout_s must be positive")
    if max_per_client < 0:
        raise ValueError("max_per_client must be 0 (no limit) or more")
    GuardedHttpToolsProtocol.request_timeout_s = request_timeout_s
    GuardedHttpToolsProtocol.max_per_client = max_per_client
    # every TLS handshake of this process's asyncio loop (module docstring)
    asyncio.constants.SSL_HANDSHAKE_TIMEOUT = request_timeout_s


#: The ``http`` option of :func:`uvicorn.run` (importable by name in worker processes).
HTTP_PROTOCOL = "fleet.conn_guard:GuardedHttpToolsProtocol"
