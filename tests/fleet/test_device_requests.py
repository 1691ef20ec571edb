"""The database work of one device request (the fleet's hot path at 10,000 devices): the token
is looked up once per request at most, then served from the token cache; on PostgreSQL an
ingest, a health report and an assignment poll are each ONE autocommit statement (no BEGIN,
no ROLLBACK round trips). Real app, real databases (both)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, event

from fleet.app import create_app
from fleet.db.devices import DeviceRegistry
from fleet.settings import Settings
from tests.fleet.conftest import enroll
from tests.fleet.wire import aggregate, batch, bearer

HEALTH = {"device_id": "gw1", "at": 0.0, "status": "green", "agent_version": "1.0",
          "streams": [{"stream": "pump1", "state": "green"}],
          "models": [{"stream": "pump1", "name": "m", "version": 1}]}


@contextmanager
def statements(engine: Engine) -> Iterator[list[tuple[str, bool]]]:
    """Each statement run on ``engine`` meanwhile, with whether its connection autocommits."""
    seen: list[tuple[str, bool]] = []

    def record(conn: Any, _cursor: object, statement: str, *_rest: object) -> None:
        seen.append((statement, bool(conn.connection.dbapi_connection.autocommit)))

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


@contextmanager
def served(settings: Settings, engine: Engine) -> Iterator[TestClient]:
    """The app, its PostgreSQL invalidation listener listening (the cache answers only then)."""
    app = create_app(settings, engine)
    with TestClient(app) as client:
        listener = app.state.invalidation_listener
        assert listener is None or listener.wait_listening(10.0)
        yield client


def _requests(client: TestClient, token: str) -> dict[str, Any]:
    """name -> a callable sending that request (each answers 200 or 204)."""
    h = bearer(token)
    return {
        "ingest": lambda: client.post("/v1/ingest", headers=h,
                                      json=batch("gw1", [aggregate("gw1", t=time.time())])),
        "health": lambda: client.post("/v1/devices/self/health", headers=h,
                                      json={**HEALTH, "at": time.time()}),
        "poll": lambda: client.get("/v1/models/assignment?stream=pump1", headers=h),
    }


def test_a_device_request_looks_its_token_up_once_then_never(
    settings: Settings, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = {"cached": 0, "database": 0}
    cached, lookup = DeviceRegistry.authenticate_cached, DeviceRegistry.authenticate

    def count_cached(self: DeviceRegistry, token: str) -> str | None:
        calls["cached"] += 1
        return cached(self, token)

    def count_database(self: DeviceRegistry, token: str) -> str | None:
        calls["database"] += 1
        return lookup(self, token)

    monkeypatch.setattr(DeviceRegistry, "authenticate_cached", count_cached)
    monkeypatch.setattr(DeviceRegistry, "authenticate", count_database)
    with served(settings, engine) as client:
        token = enroll(client, "gw1")
        sends = _requests(client, token)
        for name, send in [*sends.items(), *sends.items()]:
            assert send().status_code in (200, 204), name
    # one principal per request (the shared require_device dependency), one database lookup
    # in all (the first request; then the cache)
    assert calls == {"cached": 6, "database": 1}


def test_device_requests_are_one_autocommit_statement_each_on_postgresql(
    settings: Settings, engine: Engine
) -> None:
    if engine.dialect.name != "postgresql":
        pytest.skip("SQLite: one writer at a time, transactions as they are")
    with served(settings, engine) as client:
        token = enroll(client, "gw1")
        sends = _requests(client, token)
        for send in sends.values():  # warm: token cached, health row present
            send()
        for name, send in sends.items():
            with statements(engine) as seen:
                assert send().status_code in (200, 204), name
            assert len(seen) == 1, (name, seen)
            assert seen[0][1], f"{name}: not autocommit (BEGIN/ROLLBACK round trips)"
