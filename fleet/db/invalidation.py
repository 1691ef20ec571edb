"""Cross-replica cache invalidation over PostgreSQL ``LISTEN``/``NOTIFY``.

Every serving process (each ``--workers`` worker of each replica, on any host) keeps a
per-process cache of device-token lookups (:class:`fleet.db.token_cache.TokenCache`). A write
that must reach those caches at once calls :func:`notify` inside its own transaction: PostgreSQL
delivers a ``NOTIFY`` only when that transaction commits (never for a rolled-back one), to every
session listening on :data:`CHANNEL`, in commit order.

:class:`InvalidationListener` is that session in each process: one thread on its own psycopg
connection (autocommit; TCP keepalives notice a silently dead server), which hands every message to
``on_message(kind, key)``. When the connection drops it calls ``on_lost()`` (the cache stops
answering: a revocation sent now would be missed), reconnects with exponential backoff, and once
``LISTEN`` runs again calls ``on_listening()`` (the cache starts again, empty).

Messages are JSON ``{"kind": ..., "key": ...}`` (:data:`DEVICE`: ``key`` is a device id whose
token was revoked or replaced). What is not cached needs no message: operator API tokens,
sessions, disabled users and rollout states are read from the database by every request.

SQLite has no ``NOTIFY``: :func:`notify` does nothing there and no listener runs (a SQLite fleet
is one host; its other worker processes see a revocation within ``Settings.auth_cache_ttl_s``).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

import psycopg
from sqlalchemy import Connection, Engine, func, select

#: The notification channel of the fleet's caches.
CHANNEL = "edge_fleet_invalidate"
#: ``kind`` of a device whose token was revoked or replaced (``key``: the device id).
DEVICE = "device"
#: First and longest wait before reconnecting, seconds (doubles in between).
BACKOFF_MIN_S, BACKOFF_MAX_S = 0.5, 30.0
#: libpq keepalives: a silently dead peer is noticed within about 10 + 3 * 5 s.
_KEEPALIVES = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5,
               "keepalives_count": 3}

_log = logging.getLogger(__name__)

Connect = Callable[[], "psycopg.Connection[Any]"]


def notify(conn: Connection, kind: str, key: str) -> None:
    """Queue a message to every listening process; sent when ``conn``'s transaction commits.

    A no-op on SQLite (module docstring).
    """
    if conn.dialect.name != "postgresql":
        return
    payload = json.dumps({"kind": kind, "key": key}, separators=(",", ":"))
    conn.execute(select(func.pg_notify(CHANNEL, payload)))


def listener_connect(engine: Engine) -> Connect:
    """A factory of listening connections to ``engine``'s PostgreSQL database (its URL and
    driver options; autocommit, keepalives, ``application_name=edge-fleet-listen``)."""
    cargs, cparams = engine.dialect.create_connect_args(engine.url)
    params: dict[str, Any] = {**cparams, **_KEEPALIVES, "connect_timeout": 5,
                              "application_name": "edge-fleet-listen", "autocommit": True}

    def connect() -> psycopg.Connection[Any]:
        return psycopg.connect(*cargs, **params)

    return connect


class InvalidationListener:
    """Listens on :data:`CHANNEL` in a background thread, reconnecting with backoff.

    Args:
        connect: Opens a new autocommit psycopg connection (:func:`listener_connect`).
        on_message: Called with ``(kind, key)`` for each well-formed message (listener thread).
        on_listening: Called once ``LISTEN`` is active after each (re)connect; messages sent
            before then may have been missed.
        on_lost: Called when the connection is gone (and once at :meth:`stop`).
        poll_s: Longest wait for a message before the thread checks for :meth:`stop`.
    """

    def __init__(
        self,
        connect: Connect,
        on_message: Callable[[str, str], object],
        on_listening: Callable[[], object],
        on_lost: Callable[[], object],
        *,
        poll_s: float = 1.0,
    ) -> None:
        self._connect = connect
        self._on_message = on_message
        self._on_listening = on_listening
        self._on_lost = on_lost
        self._poll_s = poll_s
        self._stop = threading.Event()
        self._listening = threading.Event()
        self._thread: threading.Thread | None = None
        self._broken = False  # a message could not be handled (see _dispatch)
        #: Successful (re)connects so far.
        self.connects = 0

    @property
    def listening(self) -> bool:
        """True while ``LISTEN`` is active on a live connection."""
        return self._listening.is_set()

    def wait_listening(self, timeout_s: float) -> bool:
        """Block until listening (or ``timeout_s`` passes); returns :attr:`listening`."""
        return self._listening.wait(timeout_s)

    def start(self) -> None:
        """Start the thread (idempotent)."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="fleet-invalidation",
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread and close its connection."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def _run(self) -> None:
        delay = BACKOFF_MIN_S
        while not self._stop.is_set():
            try:
                self._session()
                delay = BACKOFF_MIN_S
            except (psycopg.Error, OSError) as exc:
                if self._stop.is_set():
                    break
                _log.warning("invalidation listener: %s; reconnecting in %.1f s "
                             "(token cache off meanwhile)", exc, delay)
                self._lost()
                self._stop.wait(delay)
                delay = min(delay * 2, BACKOFF_MAX_S)
            except Exception:  # a callback failed: never leave the cache trusted
                _log.exception("invalidation listener failed; reconnecting")
                self._lost()
                self._stop.wait(delay)
                delay = min(delay * 2, BACKOFF_MAX_S)
        self._lost()

    def _lost(self) -> None:
        self._listening.clear()
        self._on_lost()

    def _session(self) -> None:
        """One connection: LISTEN, report listening, dispatch until stop or failure."""
        with self._connect() as conn:
            conn.execute(f"LISTEN {CHANNEL}")
            self._broken = False
            self.connects += 1
            self._on_listening()
            self._listening.set()
            if self.connects > 1:
                _log.info("invalidation listener reconnected (token cache flushed)")
            # nothing but notifies() runs on this connection: no notification can arrive
            # outside it; a dropped server connection raises OperationalError here
            while not self._stop.is_set():
                for note in conn.notifies(timeout=self._poll_s):
                    self._dispatch(note.payload)
                if self._broken:
                    raise psycopg.InterfaceError("a message was lost")

    def _dispatch(self, payload: str) -> None:
        try:
            data = json.loads(payload)
            kind, key = data["kind"], data["key"]
        except (ValueError, KeyError, TypeError):
            _log.warning("invalidation listener: ignored a malformed message %.200r", payload)
            return
        if not (isinstance(kind, str) and isinstance(key, str)):
            return
        try:
            self._on_message(kind, key)
        except Exception:  # the message is lost: reconnect, which empties the cache
            _log.exception("invalidation listener: handling %s %r failed", kind, key)
            self._broken = True
