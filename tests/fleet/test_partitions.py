"""PostgreSQL time partitions of alerts and aggregates (migration 0009, fleet.db.partitions):
the migration keeps every row, ingest still stores each id once, retention drops whole
partitions, queries read only the partitions of their range, a row outside every partition
lands in the DEFAULT one."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, event, text

from fleet.db import migrate
from fleet.db.console_queries import ConsoleQueries
from fleet.db.engine import make_engine
from fleet.db.partitions import SPECS, PartitionMaintainer, ensure, is_partitioned, partitions
from fleet.db.retention import Retention
from fleet.settings import Settings
from tests.fleet.conftest import ADMIN_TOKEN, enroll, fresh_pg_database
from tests.fleet.wire import aggregate, alert, batch, batch2, gz, gzip_headers

PG = pytest.mark.parametrize("settings", ["postgresql"], indirect=True)

NOW = dt.datetime(2025, 3, 12, 12, tzinfo=dt.UTC)  # a Wednesday
AGG = SPECS["aggregates"]


def _ago(days: float) -> float:
    return (NOW - dt.timedelta(days=days)).timestamp()


def _count(engine: Engine, sql: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(sql)).scalar_one())


def _ingest(client: TestClient, token: str, doc: dict[str, Any]) -> list[str]:
    resp = client.post("/v1/ingest", content=gz(doc), headers=gzip_headers(token))
    assert resp.status_code == 200, resp.text
    return [r["status"] for r in resp.json()["results"]]


def _weeks(engine: Engine) -> None:
    """Weekly aggregate partitions from 2025-02-10 to 2025-03-10 (the session DB has only
    those of the real now)."""
    with engine.begin() as conn:
        ensure(conn, AGG, NOW - dt.timedelta(days=30), NOW)
        ensure(conn, SPECS["alerts"], NOW, NOW)


@PG
def test_tables_are_partitioned_with_a_default(engine: Engine) -> None:
    with engine.connect() as conn:
        assert is_partitioned(conn, "aggregates") and is_partitioned(conn, "alerts")
        for table in ("aggregates", "alerts"):
            kids = conn.execute(text(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "WHERE i.inhparent = to_regclass(:t)"), {"t": table}).scalars().all()
            assert f"{table}_default" in kids
    # the migration made the current period and two ahead; the maintainer has nothing to add
    assert PartitionMaintainer(engine).run() == []
    later = PartitionMaintainer(engine, clock=lambda: dt.datetime.now(dt.UTC)
                                + dt.timedelta(days=21))
    made = later.run()
    assert made and all(m.startswith("aggregates_p") for m in made)


@PG
def test_ingest_dedupe_holds(client: TestClient, engine: Engine) -> None:
    _weeks(engine)
    token = enroll(client, "gw1")
    recs = [alert("gw1", seq=1, t=_ago(1)), alert("gw1", seq=2, t=_ago(400)),
            aggregate("gw1", t=_ago(1)), aggregate("gw1", t=_ago(20))]
    cols = [aggregate("gw1", stream="fan", t=_ago(2)), aggregate("gw1", stream="fan", t=_ago(9))]
    doc = batch2("gw1", recs, cols)
    assert _ingest(client, token, doc) == ["accepted"] * 6
    assert _ingest(client, token, doc) == ["duplicate"] * 6
    # an alert id is one alert even with another time (the id carries none)
    assert _ingest(client, token, batch("gw1", [alert("gw1", seq=1, t=_ago(40))])) == [
        "duplicate"]
    assert _count(engine, "SELECT count(*) FROM alerts") == 2
    assert _count(engine, "SELECT count(*) FROM alert_ids") == 2
    assert _count(engine, "SELECT count(*) FROM aggregates") == 4
    assert _count(engine, "SELECT count(*) FROM ONLY alerts_default") == 1  # 400 days old


@PG
def test_row_outside_every_partition_goes_to_default_then_moves(client: TestClient,
                                                                engine: Engine) -> None:
    token = enroll(client, "gw1")
    far = dt.datetime(2031, 6, 4, tzinfo=dt.UTC)
    assert _ingest(client, token, batch("gw1", [aggregate("gw1", t=far.timestamp())])) == [
        "accepted"]
    assert _count(engine, "SELECT count(*) FROM ONLY aggregates_default") == 1
    with engine.begin() as conn:
        assert ensure(conn, AGG, far, far) == ["aggregates_p20310602"]
    assert _count(engine, "SELECT count(*) FROM ONLY aggregates_default") == 0
    assert _count(engine, "SELECT count(*) FROM ONLY aggregates_p20310602") == 1
    assert _ingest(client, token, batch("gw1", [aggregate("gw1", t=far.timestamp())])) == [
        "duplicate"]


@PG
def test_retention_drops_whole_partitions(client: TestClient, engine: Engine) -> None:
    _weeks(engine)
    token = enroll(client, "gw1")
    days = (30, 20, 16, 14, 2, 400)  # cutoff 15 days: the first two weeks go whole
    _ingest(client, token, batch("gw1", [aggregate("gw1", t=_ago(d)) for d in days]))
    with engine.connect() as conn:
        before = {p.name for p in partitions(conn, AGG)}
    assert {"aggregates_p20250210", "aggregates_p20250217"} <= before
    deleted = Retention(engine, {"aggregates": 15 * 86400.0}, clock=lambda: NOW).run()
    with engine.connect() as conn:
        after = {p.name for p in partitions(conn, AGG)}
    assert before - after == {"aggregates_p20250210", "aggregates_p20250217"}
    assert deleted == {"aggregates": 2}  # row by row: 16 days (boundary week), 400 (default)
    assert _count(engine, "SELECT count(*) FROM aggregates") == 2  # 14 and 2 days old
    assert _count(engine, "SELECT count(*) FROM ONLY aggregates_p20250224") == 1


@PG
def test_console_queries_read_only_their_partitions(client: TestClient, engine: Engine) -> None:
    _weeks(engine)
    token = enroll(client, "gw1")
    _ingest(client, token, batch("gw1", [aggregate("gw1", t=_ago(d) + m * 60)
                                         for d in (30, 20, 9, 2) for m in range(3)]
                                 + [alert("gw1", seq=1, t=_ago(2))]))
    seen: list[tuple[str, Any]] = []

    def grab(conn: Any, cursor: Any, statement: str, params: Any, *_: Any) -> None:
        if "FROM aggregates" in statement or "FROM alerts" in statement:
            seen.append((statement, params))

    event.listen(engine, "before_cursor_execute", grab)
    try:
        since = dt.datetime(2025, 3, 3, tzinfo=dt.UTC)
        series = ConsoleQueries(engine).series("gw1", "pump1", since,
                                               since + dt.timedelta(days=7), 2)
    finally:
        event.remove(engine, "before_cursor_execute", grab)
    assert series.bucket_s > 0 and sum(p[2] for p in series.points) == 3 * 12  # downsampled
    assert len(seen) >= 3
    with engine.connect() as conn:
        conn.exec_driver_sql("SET enable_seqscan = off")  # tiny tables: show the index anyway
        for statement, params in seen:
            plan = "\n".join(conn.exec_driver_sql("EXPLAIN " + statement, params).scalars())
            if "FROM aggregates" in statement:  # the week of the range only
                assert "aggregates_p20250303" in plan, plan
                assert "aggregates_p20250224" not in plan, plan
                assert "aggregates_default" not in plan, plan
                assert "ix_aggregates_series" in plan or "aggregates_p20250303_device" in plan, plan
            else:  # no partition after the range (the newest-threshold query reads back)
                assert "alerts_p2026" not in plan and "alerts_p2027" not in plan, plan
                assert "alerts_p20250301" in plan, plan


@pytest.fixture
def db_0008() -> Iterator[Engine]:
    """A fresh database migrated to 0008 only."""
    with fresh_pg_database("fleet_mig", revision="0008") as url:
        eng = make_engine(Settings(db_url=url, admin_token=ADMIN_TOKEN))
        try:
            yield eng
        finally:
            eng.dispose()


_ROWS = {
    "aggregates": "SELECT pk, id, device_id, stream, interval_start, interval_s, count, "
                  "channels, max_score, windows, alert_count, received_at FROM aggregates",
    "alerts": "SELECT pk, id, device_id, stream, seq, score, threshold, window_start, "
              "window_end, raised_at, model_name, model_version, payload, received_at "
              "FROM alerts",
    "alert_acks": "SELECT alert_id, acked_by, acked_at, note FROM alert_acks",
}


def _snapshot(engine: Engine) -> dict[str, list[Any]]:
    with engine.connect() as conn:
        return {t: sorted(tuple(r) for r in conn.execute(text(q + " ORDER BY 1")))
                for t, q in _ROWS.items()}


def test_migration_from_0008_keeps_every_row(db_0008: Engine) -> None:
    now = dt.datetime.now(dt.UTC)
    times = [now - dt.timedelta(days=d) for d in (0, 1, 8, 40, 200, 3000, -400)]
    with db_0008.begin() as conn:
        conn.execute(text("INSERT INTO devices (device_id, tags, created_at) "
                          "VALUES ('gw1', '[]', now())"))
        for i, t in enumerate(times * 30):
            conn.execute(text(
                "INSERT INTO aggregates (id, device_id, stream, interval_start, interval_s, "
                "count, channels, max_score, windows, alert_count, received_at) VALUES "
                "(:id, 'gw1', 's', :t, 60, 1, '[]', 0.5, 2, 0, now())"),
                {"id": f"gw1:s:{i}", "t": t})
        for i, t in enumerate(times):
            conn.execute(text(
                "INSERT INTO alerts (id, device_id, stream, seq, score, threshold, window_start,"
                " window_end, raised_at, model_name, model_version, payload, received_at) "
                "VALUES (:id, 'gw1', 's', :i, 4, 3, :t, :t, :t, 'm', 1, '{}', now())"),
                {"id": f"gw1:s:{i}", "i": i, "t": t})
        conn.execute(text("INSERT INTO alert_acks VALUES ('gw1:s:2', 'alice', now(), 'ok')"))
    before = _snapshot(db_0008)
    assert len(before["aggregates"]) == 210
    migrate.upgrade(db_0008)
    assert _snapshot(db_0008) == before
    with db_0008.connect() as conn:
        assert is_partitioned(conn, "aggregates") and is_partitioned(conn, "alerts")
        # 3000 days back is past the 104 weeks made; 400 days ahead past the 2 weeks ahead
        assert conn.execute(text("SELECT count(*) FROM ONLY aggregates_default")).scalar() == 60
        assert conn.execute(text("SELECT count(*) FROM alert_ids")).scalar() == len(times)
        max_pk = conn.execute(text("SELECT max(pk) FROM aggregates")).scalar()
    with db_0008.connect() as conn:  # the sequence continues; the acknowledgement's key holds
        new_pk = conn.execute(text(
            "INSERT INTO aggregates (id, device_id, stream, interval_start, interval_s, count, "
            "channels, windows, alert_count, received_at) VALUES ('gw1:s:new', 'gw1', 's', "
            "now(), 60, 1, '[]', 0, 0, now()) RETURNING pk")).scalar()
        assert new_pk > max_pk
        conn.execute(text("DELETE FROM alert_ids WHERE id = 'gw1:s:2'"))
        assert conn.execute(text("SELECT count(*) FROM alert_acks")).scalar() == 0
        conn.rollback()
    migrate.downgrade(db_0008, "0008")  # and back down: still every row
    assert _snapshot(db_0008) == before
    with db_0008.connect() as conn:
        assert not is_partitioned(conn, "aggregates")
    migrate.upgrade(db_0008)
    assert _snapshot(db_0008) == before
