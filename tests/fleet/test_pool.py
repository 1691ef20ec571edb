"""The connection pool under a burst: requests wait for a pooled connection, none is opened
beyond ``pool_size`` (``Settings.max_overflow`` defaults to 0, see its docstring)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy import Engine, text

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
