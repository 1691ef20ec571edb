"""Device health in the fleet: a real FleetClient posts summaries to the app served over real
HTTP (both databases); online, offline after the silence, the list and the metric."""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests
from fastapi.testclient import TestClient
from sqlalchemy import Engine, event, select

from agent.health import Component, Report
from agent.services.health_reporter import HealthReporter, summarize
from cloud_sync.client import FleetClient
from cloud_sync.errors import FleetRejected
from cloud_sync.health import HealthSummary
from fleet.app import create_app
from fleet.db import health as health_module
from fleet.db.devices import DeviceRegistry
from fleet.db.health import HealthStore
from fleet.db.ops_tables import device_health
from fleet.db.schema import devices
from fleet.settings import Settings
from tests.fleet.conftest import ADMIN_TOKEN, enroll
from tests.fleet.live import live, wait_for

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def _report() -> Report:
    return Report((
        Component("source:pump1", "green", None, {}),
        Component("source:fan", "yellow", "quiet for 40 s", {}),
        Component("store", "green", None, {"bytes": 123456, "budget_bytes": 10_000_000}),
        Component("uploader", "green"),
    ), at=time.time())


def _summary(device: str = "gw1") -> HealthSummary:
    return summarize(_report(), device, "0.9.1", (3, 40), [("pump1", "skab-wstat", 3)])


def test_summarize_takes_streams_reasons_disk_and_models() -> None:
    s = _summary()
    assert s.status == "yellow"
    assert [(x.stream, x.state) for x in s.streams] == [("pump1", "green"), ("fan", "yellow")]
    assert s.reasons == ["source:fan: quiet for 40 s"]
    assert s.disk is not None and s.disk.used_bytes == 123456
    assert (s.backlog_alerts, s.backlog_aggregates) == (3, 40)
    assert s.models[0].name == "skab-wstat"


def _devices(base: str) -> dict[str, dict[str, object]]:
    got = requests.get(f"{base}/v1/devices", headers=ADMIN, timeout=10).json()["devices"]
    return {d["device_id"]: d for d in got}


def test_health_online_then_offline_with_a_real_client(settings: Settings, engine: Engine,
                                                       tmp_path: Path) -> None:
    cfg = dataclasses.replace(settings, offline_after_s=3.0, housekeeping_s=0.2)
    app = create_app(cfg, engine)
    with live(app) as base:
        token = requests.post(f"{base}/v1/devices", json={"device_id": "gw1"}, headers=ADMIN,
                              timeout=10).json()["token"]
        requests.post(f"{base}/v1/devices", json={"device_id": "gw2"}, headers=ADMIN,
                      timeout=10).raise_for_status()
        client = FleetClient(base, token)
        client.post_health(_summary())
        listed = _devices(base)
        assert listed["gw1"]["state"] == "online"
        health = listed["gw1"]["health"]
        assert isinstance(health, dict) and health["status"] == "yellow"
        assert health["streams"][1] == {"stream": "fan", "state": "yellow",
                                        "reason": "quiet for 40 s"}
        assert listed["gw1"]["agent_version"] == "0.9.1"
        assert listed["gw2"]["state"] == "unknown" and listed["gw2"]["health"] is None
        metrics = requests.get(f"{base}/metrics", timeout=10).text
        assert 'fleet_devices{state="online"} 1.0' in metrics
        assert 'fleet_health_reports_total{outcome="ok"} 1.0' in metrics
        wait_for(lambda: _devices(base)["gw1"]["state"] == "offline", "gw1 offline")
        client.post_health(_summary())  # it comes back
        assert _devices(base)["gw1"]["state"] == "online"
        client.close()


def test_devices_list_of_one_device(client: TestClient) -> None:
    token = enroll(client, "gw1")
    enroll(client, "gw2")
    resp = client.post("/v1/devices/self/health", json=_summary().model_dump(mode="json"),
                       headers={"Authorization": f"Bearer {token}"})
    assert resp.status_code == 204, resp.text
    one = client.get("/v1/devices?device=gw1", headers=ADMIN).json()["devices"]
    assert [(d["device_id"], d["state"], d["health"]["status"]) for d in one] == [
        ("gw1", "online", "yellow")]
    assert [d["device_id"] for d in client.get("/v1/devices?device=gw2",
                                               headers=ADMIN).json()["devices"]] == ["gw2"]
    assert client.get("/v1/devices?device=nope", headers=ADMIN).json() == {"devices": []}
    assert client.get("/v1/devices?device=a%20b", headers=ADMIN).status_code == 422
    assert len(client.get("/v1/devices", headers=ADMIN).json()["devices"]) == 2


def test_health_refused_is_bounded_and_counted(client: TestClient) -> None:
    token = enroll(client, "gw1")
    auth = {"Authorization": f"Bearer {token}"}
    good = _summary().model_dump(mode="json")
    other = client.post("/v1/devices/self/health", json={**good, "device_id": "gw9"},
                        headers=auth)
    assert other.status_code == 403
    extra = client.post("/v1/devices/self/health", json={**good, "cpu": 1}, headers=auth)
    assert extra.status_code == 422
    many = client.post("/v1/devices/self/health",
                       json={**good, "streams": [{"stream": "s", "state": "green"}] * 65},
                       headers=auth)
    assert many.status_code == 422
    big = client.post("/v1/devices/self/health", content=b"{" + b" " * 70_000 + b"}",
                      headers={**auth, "Content-Type": "application/json"})
    assert big.status_code == 413
    assert client.post("/v1/devices/self/health", json=good, headers=ADMIN).status_code == 403
    assert client.post("/v1/devices/self/health", json=good).status_code == 401
    metrics = client.get("/metrics").text
    assert 'fleet_health_reports_total{outcome="unprocessable"} 2.0' in metrics
    assert 'fleet_health_reports_total{outcome="forbidden"} 1.0' in metrics


class _OldFleet:
    def __init__(self) -> None:
        self.calls = 0

    def post_health(self, summary: HealthSummary) -> None:
        self.calls += 1
        raise FleetRejected(404, "not found")


def test_reporter_pauses_against_an_older_fleet() -> None:
    now = [0.0]
    old = _OldFleet()
    reporter = HealthReporter(old, _summary, 60.0, monotonic=lambda: now[0])
    assert reporter.send_once() is False
    now[0] = 600.0
    assert reporter.send_once() is False
    assert old.calls == 1  # paused: the uploads do not depend on it
    now[0] = 3601.0
    reporter.send_once()
    assert old.calls == 2


@pytest.mark.parametrize("interval", [0.0, -1.0])
def test_reporter_needs_a_positive_interval(interval: float) -> None:
    with pytest.raises(ValueError):
        HealthReporter(_OldFleet(), _summary, interval)


class _Clock:
    def __init__(self) -> None:
        self.now = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.timezone.utc)

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)


def _row(engine: Engine, device: str) -> tuple[str, dt.datetime, dt.datetime]:
    with engine.connect() as conn:
        row = conn.execute(select(device_health.c.state, device_health.c.state_since,
                                  device_health.c.received_at)
                           .where(device_health.c.device_id == device)).one()
    return str(row.state), row.state_since, row.received_at


def test_health_put_keeps_state_since_while_online_and_resets_it_after_offline(
    engine: Engine,
) -> None:
    DeviceRegistry(engine).enroll("gw1", [])
    clock = _Clock()
    store = HealthStore(engine, offline_after_s=60.0, clock=clock)
    start = clock.now
    store.put("gw1", _summary())
    assert _row(engine, "gw1") == ("online", start, start)
    clock.advance(30)
    store.put("gw1", _summary())  # still online: the time it came online stays
    assert _row(engine, "gw1") == ("online", start, clock.now)
    clock.advance(120)
    assert store.sweep() == ["gw1"]
    assert _row(engine, "gw1")[0] == "offline"
    clock.advance(5)
    store.put("gw1", _summary())  # back: online since now
    assert _row(engine, "gw1") == ("online", clock.now, clock.now)
    with engine.connect() as conn:
        dev = conn.execute(select(devices.c.last_seen, devices.c.agent_version,
                                  devices.c.backlog_aggregates)
                           .where(devices.c.device_id == "gw1")).one()
    assert tuple(dev) == (clock.now, "0.9.1", 40)


def test_health_put_on_postgresql_is_one_autocommit_statement(engine: Engine) -> None:
    if engine.dialect.name != "postgresql":
        pytest.skip("SQLite writes in one transaction (one writer at a time)")
    DeviceRegistry(engine).enroll("gw1", [])
    store = HealthStore(engine)
    store.put("gw1", _summary())  # the first report inserts, the second updates
    statements: list[tuple[str, bool]] = []

    def seen(conn: Any, _cursor: object, statement: str, *_rest: object) -> None:
        statements.append((statement, bool(conn.connection.dbapi_connection.autocommit)))

    event.listen(engine, "before_cursor_execute", seen)
    try:
        store.put("gw1", _summary())
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    assert len(statements) == 1 and "ON CONFLICT" in statements[0][0]
    assert statements[0][1]  # autocommit: no BEGIN ... COMMIT round trips


def test_health_put_on_postgresql_commits_without_waiting_for_the_wal_flush(
        engine: Engine) -> None:
    """The report's own transaction has ``synchronous_commit`` off; the setting ends with it,
    so the next statement on the same pooled connection (an ingest) commits durably."""
    if engine.dialect.name != "postgresql":
        pytest.skip("PostgreSQL only (synchronous_commit)")
    DeviceRegistry(engine).enroll("gw1", [])
    now = dt.datetime.now(dt.UTC)
    params = (now, "0.9.1", 0, 0, "gw1", "gw1", "green", _summary().model_dump_json(), now)
    with engine.connect() as conn:
        conn.exec_driver_sql(health_module._PG_PUT, params)
        inside = conn.exec_driver_sql("SHOW synchronous_commit").scalar_one()
        conn.commit()
        after = conn.exec_driver_sql("SHOW synchronous_commit").scalar_one()
    assert (inside, after) == ("off", "on")
    HealthStore(engine).put("gw1", _summary())
    with engine.connect() as conn:  # the pool's most recently returned connection (LIFO)
        assert conn.exec_driver_sql("SHOW synchronous_commit").scalar_one() == "on"
    assert _row(engine, "gw1")[0] == "online"


def test_concurrent_first_reports_of_one_device_all_succeed(engine: Engine) -> None:
    DeviceRegistry(engine).enroll("gw1", [])
    store = HealthStore(engine)
    barrier = threading.Barrier(4)

    def one(_: int) -> None:
        barrier.wait()
        store.put("gw1", _summary())

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one, range(4)))  # an update-then-insert would race: duplicate key
    assert _row(engine, "gw1")[0] == "online"
