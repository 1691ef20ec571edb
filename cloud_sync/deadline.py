"""A total (wall-clock) deadline for each HTTP call of :class:`cloud_sync.client.FleetClient`.

``requests``' ``timeout=(connect, read)`` bounds each wait for bytes, not the whole call: a peer
that sends its headers or its body one byte per second keeps every read short and holds the call
for as long as it likes. Checking the time between chunks does not help either while one read
(``urllib3`` gathers a whole chunk) or the header parser is still waiting.

So every call runs under a :class:`CallWatch`: a timer that, when the call's total deadline
passes (or :meth:`Deadlines.abort_all` is called, e.g. at shutdown), shuts down the sockets the
call uses (``shutdown(SHUT_RDWR)`` on the raw socket, also under TLS). The blocked read or write
then fails at once, ``requests`` raises a ``ConnectionError`` and the client maps it to
:class:`cloud_sync.errors.FleetDeadlineExceeded`. The sockets are found through
:class:`DeadlineAdapter`, a ``requests`` transport adapter whose ``urllib3`` connections
register every socket they open, and every pooled connection they reuse, with the watch of the
calling thread (:func:`watching`); a connection outside any watch is left alone.

Nothing here imports from ``agent`` or ``fleet``.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from cloud_sync.errors import FleetDeadlineExceeded, FleetProtocolError, FleetUnavailable

_local = threading.local()


class CallWatch:
    """The deadline of one call: shuts down the call's sockets when it fires.

    Args:
        seconds: Total seconds the call may take, > 0.

    Attributes:
        seconds: As given.
        fired: None while the call may go on; ``"deadline"`` or ``"aborted"`` once its sockets
            were shut down.
    """

    def __init__(self, seconds: float) -> None:
        if seconds <= 0:
            raise ValueError(f"deadline must be positive, got {seconds}")
        self.seconds = seconds
        self.fired: str | None = None
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._timer = threading.Timer(seconds, self.fire, args=("deadline",))
        self._timer.daemon = True

    def start(self) -> None:
        """Start the timer."""
        self._timer.start()

    def attach(self, sock: socket.socket | None) -> None:
        """Watch ``sock`` (shut down at once when the watch already fired)."""
        if sock is None:
            return
        with self._lock:
            if sock not in self._socks:
                self._socks.append(sock)
            if self.fired is not None:
                _shutdown(sock)

    def fire(self, why: str = "deadline") -> None:
        """Shut down every watched socket (idempotent; the first ``why`` is kept)."""
        with self._lock:
            if self.fired is None:
                self.fired = why
            for sock in self._socks:
                _shutdown(sock)

    def finish(self) -> None:
        """The call ended: stop the timer and forget the sockets (pooled ones live on)."""
        self._timer.cancel()
        with self._lock:
            self._socks.clear()


def _shutdown(sock: socket.socket) -> None:
    # socket.socket's own shutdown, also for an SSLSocket (whose override drops its SSL object):
    # the reader blocked in the other thread sees end-of-file and fails cleanly.
    with suppress(OSError):  # already closed or never connected
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


def _current() -> CallWatch | None:
    watch: CallWatch | None = getattr(_local, "watch", None)
    return watch


class Deadlines:
    """The watches of one client's calls in progress (any thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active: set[CallWatch] = set()
        self._aborting = False

    @contextmanager
    def watch(self, seconds: float) -> Iterator[CallWatch]:
        """Run the calling thread's requests inside under a watch of ``seconds``.

        Yields:
            The watch (``fired`` tells afterwards whether it cut the call short).
        """
        w = CallWatch(seconds)
        with self._lock:
            self._active.add(w)
            aborting = self._aborting
        if aborting:
            w.fire("aborted")
        w.start()
        previous = _current()
        _local.watch = w
        try:
            yield w
        finally:
            _local.watch = previous
            w.finish()
            with self._lock:
                self._active.discard(w)

    def abort_all(self) -> int:
        """Cut every call in progress short, and every later one (the client is closing).

        Returns:
            How many calls were in progress.
        """
        with self._lock:
            self._aborting = True
            active = list(self._active)
        for w in active:
            w.fire("aborted")
        return len(active)


@contextmanager
def bounded(deadlines: Deadlines, what: str, seconds: float) -> Iterator[CallWatch]:
    """Run one client call under a watch of ``seconds``; map its failure once the watch fired.

    Raises:
        FleetDeadlineExceeded: The deadline cut the call short (also when the call returned
            without an error: its answer may be truncated).
        FleetUnavailable: :meth:`Deadlines.abort_all` cut it short (the client is closing).
    """
    with deadlines.watch(seconds) as w:
        try:
            yield w
        except (FleetUnavailable, FleetProtocolError) as exc:
            if w.fired == "deadline" and not isinstance(exc, FleetDeadlineExceeded):
                raise FleetDeadlineExceeded(
                    f"{what}: no complete answer from the fleet within the total deadline of "
                    f"{seconds:.0f} s (a slow or hung peer); the connection was closed",
                    deadline_s=seconds,
                ) from exc
            if w.fired == "aborted":
                raise FleetUnavailable(f"{what}: cut short, the agent is stopping") from exc
            raise
        # No error, but the watch shut the sockets: the answer may be cut short without one
        # (a header block cut after the status line reads as a complete, empty 200).
        if w.fired == "deadline":
            raise FleetDeadlineExceeded(
                f"{what}: no complete answer from the fleet within the total deadline of "
                f"{seconds:.0f} s (a slow or hung peer); the connection was closed",
                deadline_s=seconds,
            )
        if w.fired == "aborted":
            raise FleetUnavailable(f"{what}: cut short, the agent is stopping")


class _WatchedHTTPConnection(HTTPConnection):
    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()  # the raw socket (under TLS: before the handshake)
        watch = _current()
        if watch is not None:
            watch.attach(sock)
        return sock

    def request(self, *args: Any, **kwargs: Any) -> None:
        watch = _current()
        if watch is not None:
            watch.attach(self.sock)  # a pooled connection reused by this call
        super().request(*args, **kwargs)


class _WatchedHTTPSConnection(_WatchedHTTPConnection, HTTPSConnection):
    pass


class _WatchedHTTPPool(HTTPConnectionPool):
    ConnectionCls = _WatchedHTTPConnection


class _WatchedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _WatchedHTTPSConnection


#: The pool classes :class:`DeadlineAdapter` puts in its pool managers, by URL scheme.
WATCHED_POOLS: dict[str, type[HTTPConnectionPool]] = {
    "http": _WatchedHTTPPool, "https": _WatchedHTTPSPool,
}


class DeadlineAdapter(HTTPAdapter):
    """``requests`` adapter whose connections register their sockets with the current watch."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = dict(WATCHED_POOLS)

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        """An HTTP(S) proxy's manager with watched connections too (a SOCKS proxy's keeps its
        own connection classes: its calls get only the between-chunks checks)."""
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if not proxy.lower().startswith("socks"):
            manager.pool_classes_by_scheme = dict(WATCHED_POOLS)
        return manager


def install(session: requests.Session) -> bool:
    """Mount :class:`DeadlineAdapter` on ``session`` for ``http://`` and ``https://`` where the
    mounted adapter is requests' plain :class:`HTTPAdapter` (a custom transport, e.g. a test's,
    is kept; its calls then only get the between-chunks checks).

    Returns:
        True when both prefixes are watched.
    """
    watched = True
    for prefix in ("http://", "https://"):
        current = session.adapters.get(prefix)
        if isinstance(current, DeadlineAdapter):
            continue
        if current is None or type(current) is HTTPAdapter:
            session.mount(prefix, DeadlineAdapter())
        else:
            watched = False
    return watched
