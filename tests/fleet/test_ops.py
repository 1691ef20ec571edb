"""Migrations, health, metrics and a database that is down."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import Engine, func, inspect, select

from fleet.app import create_app
from fleet.db import migrate
from fleet.db.engine import make_engine
from fleet.db.schema import aggregates
from fleet.settings import Settings, resolve_admin_token
from tests.fleet.wire import aggregate, batch, bearer, gz, gzip_headers


def test_migrations_twice_are_a_no_op(
    client: TestClient, engine: Engine, enrolled: dict[str, str]
) -> None:
    client.post("/v1/ingest", json=batch("gw1", [aggregate("gw1")]),
                headers=bearer(enrolled["gw1"]))
    before = sorted(inspect(engine).get_table_names())
    migrate.upgrade(engine)
    migrate.upgrade(engine)
    assert migrate.current_revision(engine) == migrate.head_revision()
    assert sorted(inspect(engine).get_table_names()) == before
    assert {"devices", "alerts", "aggregates", "alembic_version"} <= set(before)
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(aggregates)).scalar_one() == 1


def test_fresh_sqlite_file_migrates_from_nothing(tmp_path: Path) -> None:
    engine = make_engine(Settings(db_url=f"sqlite:///{tmp_path}/a/b/fleet.db", admin_token="x"))
    assert migrate.current_revision(engine) is None
    migrate.upgrade(engine)
    migrate.upgrade(engine)
    assert migrate.current_revision(engine) == migrate.head_revision()
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    engine.dispose()


def test_healthz_and_metrics_expose_ingest_counters(
    client: TestClient, enrolled: dict[str, str]
) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    body = gz(batch("gw1", [aggregate("gw1"), aggregate("gw1", count=-1)]))
    client.post("/v1/ingest", content=body, headers=gzip_headers(enrolled["gw1"]))
    client.post("/v1/ingest", content=body, headers=gzip_headers(enrolled["gw1"]))
    client.get("/v1/devices/gw2/alerts", headers=bearer(enrolled["gw1"]))
    text = client.get("/metrics").text
    assert 'fleet_ingest_records_total{kind="aggregate",status="accepted"} 1.0' in text
    assert 'fleet_ingest_records_total{kind="aggregate",status="duplicate"} 1.0' in text
    assert 'fleet_ingest_records_total{kind="aggregate",status="rejected"} 2.0' in text
    assert 'fleet_ingest_batches_total{outcome="ok"} 2.0' in text
    assert ('fleet_http_requests_total{method="POST",route="/v1/ingest",status="200"} 2.0'
            in text)
    assert ('fleet_http_requests_total{method="GET",route="/v1/devices/{device_id}/alerts",'
            'status="403"} 1.0') in text
    assert 'fleet_http_request_duration_seconds_bucket{le="0.1",method="POST"' in text


def test_each_app_has_its_own_registry(settings: Settings, engine: Engine) -> None:
    one, two = create_app(settings, engine), create_app(settings, engine)
    with TestClient(one) as c1, TestClient(two) as c2:
        c1.get("/healthz")
        assert 'route="/healthz"' in c1.get("/metrics").text
        assert 'route="/healthz"' not in c2.get("/metrics").text


def test_database_down_gives_503_with_retry_after(tmp_path: Path) -> None:
    settings = Settings(db_url="postgresql+psycopg://postgres@127.0.0.1:1/none",
                        admin_token="a" * 40, pool_timeout_s=1)
    with TestClient(create_app(settings)) as client:
        health = client.get("/healthz")
        assert health.status_code == 503 and health.headers["retry-after"] == "5"
        resp = client.post("/v1/ingest", content=gz(batch("gw1", [])),
                           headers=gzip_headers("some-device-token"))
        assert resp.status_code == 503
        assert resp.headers["retry-after"] == "5"
        assert resp.json()["error"] == "unavailable"


def test_admin_token_is_generated_once_with_mode_0600(tmp_path: Path) -> None:
    token = resolve_admin_token(tmp_path / "state", environ={})
    path = tmp_path / "state" / "admin.token"
    assert path.stat().st_mode & 0o777 == 0o600
    assert resolve_admin_token(tmp_path / "state", environ={}) == token
    assert resolve_admin_token(tmp_path / "state", environ={"EDGE_FLEET_ADMIN_TOKEN": "e"}) == "e"
    other = tmp_path / "tok"
    other.write_text("from-file\n")
    assert resolve_admin_token(tmp_path / "state", other, environ={"EDGE_FLEET_ADMIN_TOKEN": "e"}
                               ) == "from-file"
