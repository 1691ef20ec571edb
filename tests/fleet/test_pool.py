"""The connection pool under a burst: requests wait for a pooled connection, none is opened
beyond ``pool_size`` (``Settings.max_overflow`` defaults to 0, see its docstring). On
PostgreSQL: LIFO, and a ping only for a connection idle ``PING_IDLE_S`` or more."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from sqlalchemy import Connection, Engine, make_url, text
from sqlalchemy.exc import OperationalError

from fleet.db import engine as engine_module
from fleet.db.engine import make_engine
from fleet.settings import Settings


def test_a_burst_larger_than_the_pool_waits_and_opens_no_extra_connection(
    settings: Settings, engine: Engine
) -> None:
    assert Settings.max_overflow == 0
    small = make_engine(Settings(db_url=settings.db_url, admin_token="a" * 40, pool_size=2))
    barrier = threading.Barrier(8)
    lock = threading.Lock()
    held: set[int] = set()
    most_at_once = 0

    def one(_: int) -> int:
        nonlocal most_at_once
        barrier.wait()  # all eight ask at once
        with small.connect() as conn:
            with lock:
                held.add(id(conn.connection.dbapi_connection))
                most_at_once = max(most_at_once, small.pool.checkedout())
            return int(conn.execute(text("SELECT 1")).scalar_one())

    try:
        with ThreadPoolExecutor(8) as pool:
            assert list(pool.map(one, range(8))) == [1] * 8
        assert most_at_once <= 2
        assert len(held) <= 2  # the same two connections served all eight
    finally:
        small.dispose()


@pytest.fixture
def pg_engine(pg_url: str) -> Iterator[Engine]:
    eng = make_engine(Settings(db_url=pg_url, admin_token="a" * 40, pool_size=3))
    yield eng
    eng.dispose()


def _backend_pid(conn: Connection) -> int:
    return int(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())


def _terminate(pg_url: str, pid: int) -> None:
    url = make_url(pg_url)
    with psycopg.connect(host=url.host, port=url.port, user=url.username,
                         dbname=url.database, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    time.sleep(0.2)  # the backend is gone before the next use


def test_postgresql_pool_is_lifo(pg_engine: Engine) -> None:
    conns = [pg_engine.connect() for _ in range(3)]
    pids = [_backend_pid(c) for c in conns]
    for conn in conns:  # returned in order: the last one back is the first out
        conn.close()
    with pg_engine.connect() as again:
        assert _backend_pid(again) == pids[-1]


def test_a_connection_idle_past_the_limit_is_pinged_and_replaced(
    pg_engine: Engine, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_module, "PING_IDLE_S", 0.3)
    with pg_engine.connect() as conn:
        dead = _backend_pid(conn)
    _terminate(pg_url, dead)  # as a PostgreSQL restart would
    time.sleep(0.3)
    with pg_engine.connect() as conn:  # pinged at checkout: dead, replaced silently
        assert _backend_pid(conn) != dead


def test_a_recently_returned_connection_is_not_pinged(
    pg_engine: Engine, pg_url: str
) -> None:
    """The trade of pinging only idle connections: one returned less than PING_IDLE_S ago is
    handed out as it is, so a request on it fails once after a restart (503); the pool then
    drops its connections and the next request gets a new one."""
    assert engine_module.PING_IDLE_S >= 1.0
    with pg_engine.connect() as conn:
        dead = _backend_pid(conn)
    _terminate(pg_url, dead)
    with pytest.raises(OperationalError), pg_engine.connect() as conn:
        conn.exec_driver_sql("SELECT 1")
    with pg_engine.connect() as conn:
        assert _backend_pid(conn) != dead
