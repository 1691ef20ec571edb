"""Retention per table by age, in batches, on both databases."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, func, insert, select

from fleet.db.account_tables import audit_log
from fleet.db.model_tables import model_status_reports
from fleet.db.ops_tables import device_health, webhook_deliveries, webhooks
from fleet.db.retention import Retention, parse_retention
from fleet.db.sample_tables import samples
from fleet.db.schema import aggregates, alerts
from fleet.housekeeping import retention_for
from fleet.settings import Settings
from tests.fleet.conftest import enroll
from tests.fleet.wire import T0, aggregate, alert, batch, gz, gzip_headers

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
DAY = 86400.0


def _count(engine: Engine, table: object) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())  # type: ignore[arg-type]


def _at(days_ago: float) -> float:
    return (NOW - dt.timedelta(days=days_ago)).timestamp()


def _fill(client: TestClient, engine: Engine) -> None:
    """Per table: rows 400, 100 and 1 day old (alerts 5 of each age, aggregates 5)."""
    token = enroll(client, "gw1")
    records = []
    for k, days in enumerate((400, 100, 1)):
        for i in range(5):
            t = _at(days) + i * 60
            records.append(alert("gw1", seq=k * 10 + i, t=t))
            records.append(aggregate("gw1", t=t))
    resp = client.post("/v1/ingest", content=gz(batch("gw1", records)),
                       headers=gzip_headers(token))
    assert resp.status_code == 200, resp.text
    old = [NOW - dt.timedelta(days=d) for d in (400, 100, 1)]
    with engine.begin() as conn:
        hook = conn.execute(insert(webhooks).values(
            url="http://h/", events=["alert"], secret="x" * 16, created_at=NOW,
        ).returning(webhooks.c.id)).scalar_one()
        for t in old:
            conn.execute(insert(model_status_reports).values(
                device_id="gw1", name="m", version=1, state="active", details={}, at=T0,
                received_at=t))
            conn.execute(insert(samples).values(
                device_id="gw1", stream="pump1", kind="reservoir", channels=["a"],
                config_hash="h", shape=[1, 1, 1], windows=[[[0.0]]], received_at=t))
            for state in ("delivered", "pending"):
                conn.execute(insert(webhook_deliveries).values(
                    webhook_id=hook, event="alert", body=json.dumps({}), state=state,
                    attempts=1, next_attempt_at=t, created_at=t))
        conn.execute(insert(audit_log).values(
            at=old[1], actor="alice", via="session", action="rollout.abort", detail={}))
        conn.execute(insert(device_health).values(
            device_id="gw1", status="green", state="online", summary={}, received_at=old[0],
            state_since=old[0]))


def test_retention_deletes_by_age_per_table_in_batches(client: TestClient,
                                                       engine: Engine) -> None:
    _fill(client, engine)
    ages = parse_retention("alerts=365d,aggregates=30d,samples=200d,status_reports=50d,"
                           "health=30d,webhook_deliveries=7d,audit=30d")
    retention = Retention(engine, ages, batch_rows=2, clock=lambda: NOW)
    done = retention.run()
    assert done == {"alerts": 5, "aggregates": 10, "samples": 1, "status_reports": 2,
                    "health": 1, "webhook_deliveries": 2, "audit": 1}
    assert _count(engine, alerts) == 10 and _count(engine, aggregates) == 5
    assert _count(engine, samples) == 2 and _count(engine, model_status_reports) == 1
    assert _count(engine, device_health) == 0
    assert _count(engine, webhook_deliveries) == 4  # every pending one stays
    assert retention.run() == {k: 0 for k in done}


def test_kept_tables_and_the_hourly_bound(client: TestClient, engine: Engine) -> None:
    _fill(client, engine)
    now = [NOW]
    retention = Retention(engine, {"alerts": 0.0, "aggregates": 200 * DAY},
                          clock=lambda: now[0])
    assert retention.maybe_run() == {"aggregates": 5}
    assert _count(engine, alerts) == 15  # kept forever
    now[0] += dt.timedelta(minutes=30)
    assert retention.maybe_run() == {}
    now[0] += dt.timedelta(minutes=31)
    assert retention.maybe_run() == {"aggregates": 0}


def test_serve_settings_map_to_ages(settings: Settings, engine: Engine) -> None:
    r = retention_for(Settings(db_url=settings.db_url, admin_token="x",
                               retention_s={"alerts": 10 * DAY}), engine)
    assert r.ages_s["alerts"] == 10 * DAY
    assert r.ages_s["status_reports"] == 90 * DAY and "aggregates" not in r.ages_s


@pytest.mark.parametrize("spec", ["alerts", "bogus=1d", "alerts=1d,alerts=2d", "alerts=1y",
                                  "alerts=-1d", "alerts=d"])
def test_parse_retention_refuses(spec: str) -> None:
    with pytest.raises(ValueError):
        parse_retention(spec)
