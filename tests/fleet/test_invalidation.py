"""Cross-replica invalidation (:mod:`fleet.db.invalidation`) on a real PostgreSQL, and the token
cache's suspend/resume."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from fleet.db.devices import DeviceRegistry, hash_token
from fleet.db.engine import make_engine
from fleet.db.invalidation import DEVICE, InvalidationListener, listener_connect, notify
from fleet.db.token_cache import TokenCache
from fleet.settings import Settings
from tests.fleet.conftest import ADMIN_TOKEN
from tests.fleet.live import wait_for


class Recorder:
    """The listener's callbacks, recorded."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, str]] = []
        self.listens = 0
        self.losses = 0
        self.lock = threading.Lock()

    def message(self, kind: str, key: str) -> None:
        with self.lock:
            self.messages.append((kind, key))

    def listening(self) -> None:
        self.listens += 1

    def lost(self) -> None:
        self.losses += 1


@pytest.fixture
def pg(pg_url: str) -> Iterator[Engine]:
    eng = make_engine(Settings(db_url=pg_url, admin_token=ADMIN_TOKEN, pool_size=2))
    with eng.begin() as conn:
        conn.execute(text("TRUNCATE devices CASCADE"))
    yield eng
    eng.dispose()


@pytest.fixture
def heard(pg: Engine) -> Iterator[tuple[InvalidationListener, Recorder]]:
    rec = Recorder()
    listener = InvalidationListener(listener_connect(pg), rec.message, rec.listening, rec.lost,
                                    poll_s=0.2)
    listener.start()
    assert listener.wait_listening(10)
    yield listener, rec
    listener.stop()


def test_notify_is_delivered_on_commit_only(
    pg: Engine, heard: tuple[InvalidationListener, Recorder]
) -> None:
    _, rec = heard
    with pg.begin() as conn:
        notify(conn, DEVICE, "gw-early")
        time.sleep(0.6)  # the listener polls every 0.2 s: nothing before the commit
        assert rec.messages == []
    wait_for(lambda: rec.messages == [(DEVICE, "gw-early")], "the committed message", 10)
    with pg.connect() as conn:
        notify(conn, DEVICE, "gw-rolled-back")
        conn.rollback()
    with pg.begin() as conn:
        notify(conn, DEVICE, "gw-after")
    wait_for(lambda: (DEVICE, "gw-after") in rec.messages, "the next message", 10)
    assert (DEVICE, "gw-rolled-back") not in rec.messages


def test_revoke_reaches_another_processes_cache(pg: Engine) -> None:
    # "another process": its own cache and registry, the cache fed by its own listener as
    # fleet.app wires it (suspended until the listener listens)
    cache = TokenCache(3600, suspended=True)
    listener = InvalidationListener(
        listener_connect(pg), lambda kind, key: cache.drop_device(key), cache.resume,
        cache.suspend, poll_s=0.2)
    other = DeviceRegistry(pg, token_cache=cache)
    token = DeviceRegistry(pg).enroll("gw1", [])
    assert other.authenticate(token) == "gw1" and cache.get(hash_token(token)) is None
    listener.start()
    try:
        assert listener.wait_listening(10)
        assert other.authenticate(token) == "gw1" and cache.get(hash_token(token)) == "gw1"
        DeviceRegistry(pg).revoke("gw1")  # a third process (edge-fleet device revoke)
        wait_for(lambda: cache.get(hash_token(token)) is None, "the revocation", 10)
        assert other.authenticate(token) is None
    finally:
        listener.stop()
    assert cache.suspended  # a stopped listener hears nothing: the cache must not answer


def test_reconnects_after_the_connection_drops(
    pg: Engine, heard: tuple[InvalidationListener, Recorder]
) -> None:
    listener, rec = heard
    with pg.begin() as conn:
        killed = conn.execute(text(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'edge-fleet-listen' AND datname = current_database()"
        )).scalars().all()
    assert killed == [True]
    wait_for(lambda: rec.losses >= 1, "the listener to notice", 10)
    wait_for(lambda: rec.listens == 2 and listener.listening, "the reconnect", 15)
    with pg.begin() as conn:
        notify(conn, DEVICE, "gw-again")
    wait_for(lambda: (DEVICE, "gw-again") in rec.messages, "a message after reconnect", 10)


def test_malformed_messages_are_ignored(
    pg: Engine, heard: tuple[InvalidationListener, Recorder]
) -> None:
    _, rec = heard
    with pg.begin() as conn:
        conn.execute(text("SELECT pg_notify('edge_fleet_invalidate', 'not json')"))
        conn.execute(text("""SELECT pg_notify('edge_fleet_invalidate', '{"kind": 1}')"""))
        notify(conn, DEVICE, "gw-ok")
    wait_for(lambda: rec.messages == [(DEVICE, "gw-ok")], "the good message", 10)


def test_token_cache_suspend_and_resume() -> None:
    cache = TokenCache(60, suspended=True)
    gen = cache.generation()
    cache.put("h1", "gw1", gen)
    assert cache.get("h1") is None and cache.suspended  # nothing cached while suspended
    gen = cache.generation()
    cache.resume()
    cache.put("h1", "gw1", gen)  # a lookup begun before resume is not cached
    assert cache.get("h1") is None
    cache.put("h1", "gw1", cache.generation())
    assert cache.get("h1") == "gw1"
    cache.suspend()
    assert cache.get("h1") is None and len(cache) == 0
    cache.resume()
    assert cache.get("h1") is None  # resumed empty
