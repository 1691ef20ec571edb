"""Schema 2 (aggregates as columns) through the real API on SQLite and PostgreSQL: per-index
results, idempotency, ownership, bad entries, whole-batch errors, and old and new agents mixed."""

from __future__ import annotations

import json
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import Engine, func, select

from fleet.db.schema import aggregates, alerts
from tests.fleet.wire import T0, aggregate, alert, batch, batch2, bearer, gz, gzip_headers

CHANNELS = [
    {"channel": "vib_x", "count": 600, "min": -1.0, "max": 1.5, "mean": 0.1, "std": 0.3},
    {"channel": "temp", "count": 600, "min": None, "max": None, "mean": None, "std": None},
]


def _count(engine: Engine) -> tuple[int, int]:
    with engine.connect() as conn:
        return (
            conn.execute(select(func.count()).select_from(alerts)).scalar_one(),
            conn.execute(select(func.count()).select_from(aggregates)).scalar_one(),
        )


def _results(resp: Any) -> list[tuple[int, str]]:
    assert resp.status_code == 200, resp.text
    return [(r["index"], r["status"]) for r in resp.json()["results"]]


def _stored(client: TestClient, token: str) -> list[dict[str, Any]]:
    resp = client.get("/v1/devices/gw1/aggregates", headers=bearer(token))
    assert resp.status_code == 200, resp.text
    rows: list[dict[str, Any]] = resp.json()["items"]
    return sorted(rows, key=lambda r: r["id"])


def test_columns_round_trip_like_records(
    client: TestClient, engine: Engine, enrolled: dict[str, str]
) -> None:
    token = enrolled["gw1"]
    aggs = [aggregate("gw1", stream=f"s{i % 2}", t=T0 + 60 * i, channels=CHANNELS,
                      max_score=None if i % 3 == 0 else 0.25 * i, count=10**12 + i)
            for i in range(6)]
    records = [alert("gw1", seq=1), alert("gw1", seq=2)]
    resp = client.post("/v1/ingest", content=gz(batch2("gw1", records, aggs)),
                       headers=gzip_headers(token))
    assert _results(resp) == [(i, "accepted") for i in range(8)]
    assert _count(engine) == (2, 6)
    via_columns = _stored(client, token)
    # the same aggregates sent as schema-1 records are duplicates, and read back the same
    resp = client.post("/v1/ingest", content=gz(batch("gw1", aggs)), headers=gzip_headers(token))
    assert _results(resp) == [(i, "duplicate") for i in range(6)]
    with engine.begin() as conn:
        conn.execute(aggregates.delete())
    resp = client.post("/v1/ingest", content=gz(batch("gw1", aggs)), headers=gzip_headers(token))
    assert _results(resp) == [(i, "accepted") for i in range(6)]
    via_records = _stored(client, token)
    drop = ("received_at",)
    assert [{k: v for k, v in r.items() if k not in drop} for r in via_columns] == [
        {k: v for k, v in r.items() if k not in drop} for r in via_records
    ]
    assert via_columns[0]["channels"] == CHANNELS


def test_same_columns_twice_are_stored_once_and_repeats_are_duplicates(
    client: TestClient, engine: Engine, enrolled: dict[str, str]
) -> None:
    token = enrolled["gw1"]
    a, b, c = (aggregate("gw1", t=T0 + 60 * i) for i in range(3))
    body = gz(batch2("gw1", [a], [b, a, c, b]))  # a in records and columns, b twice
    expected = [(0, "accepted"), (1, "accepted"), (2, "duplicate"), (3, "accepted"),
                (4, "duplicate")]
    assert _results(client.post("/v1/ingest", content=body, headers=gzip_headers(token))) == (
        expected
    )
    again = client.post("/v1/ingest", content=body, headers=gzip_headers(token))
    assert _results(again) == [(i, "duplicate") for i in range(5)]
    assert _count(engine) == (0, 3)


def test_old_and_new_agents_mixed(
    client: TestClient, engine: Engine, enrolled: dict[str, str]
) -> None:
    # gw1 upgraded (schema 2), gw2 still schema 1; then gw1 resends part of a schema-1 batch
    old = [aggregate("gw2", t=T0 + 60 * i) for i in range(3)] + [alert("gw2", seq=1)]
    assert _results(client.post("/v1/ingest", content=gz(batch("gw2", old)),
                                headers=gzip_headers(enrolled["gw2"]))) == [
        (i, "accepted") for i in range(4)]
    first = [aggregate("gw1", t=T0 + 60 * i) for i in range(3)]
    assert _results(client.post("/v1/ingest", content=gz(batch("gw1", first[:2])),
                                headers=gzip_headers(enrolled["gw1"]))) == [
        (0, "accepted"), (1, "accepted")]
    resp = client.post("/v1/ingest", content=gz(batch2("gw1", [alert("gw1", seq=1)], first)),
                       headers=gzip_headers(enrolled["gw1"]))
    assert _results(resp) == [(0, "accepted"), (1, "duplicate"), (2, "duplicate"),
                              (3, "accepted")]
    assert _count(engine) == (2, 6)


def test_foreign_or_mismatched_ids_are_rejected_by_index(
    client: TestClient, engine: Engine, enrolled: dict[str, str]
) -> None:
    good = aggregate("gw1", t=T0)
    foreign = aggregate("gw2", t=T0 + 60)
    mismatched = aggregate("gw1", stream="pump1", t=T0 + 120)
    doc = batch2("gw1", [], [good, foreign, mismatched])
    doc["aggregates"]["streams"][2] = "pump2"
    results = client.post("/v1/ingest", json=doc, headers=bearer(enrolled["gw1"])).json()
    assert [r["status"] for r in results["results"]] == ["accepted", "rejected", "rejected"]
    assert "another device" in results["results"][1]["reason"]
    assert "stream" in results["results"][2]["reason"]
    # a schema-2 batch claiming another device as a whole: 403
    resp = client.post("/v1/ingest", json=batch2("gw2", [], [foreign]),
                       headers=bearer(enrolled["gw1"]))
    assert resp.status_code == 403
    assert _count(engine) == (0, 1)


def test_ids_whose_number_contradicts_the_body_are_rejected(
    client: TestClient, engine: Engine, enrolled: dict[str, str]
) -> None:
    """A tester's fleet stored ``gw:s:999`` for an interval starting at another time (and a
    negative id): a device could take the id its real record later gets ``duplicate`` for."""
    good = aggregate("gw1", t=T0)
    moved = aggregate("gw1", t=T0 + 60)
    negative = aggregate("gw1", t=T0 + 120)
    part = aggregate("gw1", t=T0 + 180)
    doc = batch2("gw1", [], [good, moved, negative, part])
    doc["aggregates"]["ids"][1] = "gw1:pump1:999"
    doc["aggregates"]["ids"][2] = "gw1:pump1:-123"
    doc["aggregates"]["ids"][3] = f"gw1:pump1:{int((T0 + 180) * 1000)}:1"
    for body in (doc, batch("gw1", [
        good, {**moved, "id": "gw1:pump1:999"}, {**negative, "id": "gw1:pump1:-123"},
        {**part, "id": f"gw1:pump1:{int((T0 + 180) * 1000)}:1"}])):
        results = client.post("/v1/ingest", json=body, headers=bearer(enrolled["gw1"])).json()
        statuses = [r["status"] for r in results["results"]]
        assert statuses[1:3] == ["rejected", "rejected"], results
        assert statuses[3] in {"accepted", "duplicate"}
        assert "does not match the body" in results["results"][1]["reason"]
    bad_alert = alert("gw1", seq=9)
    bad_alert["body"]["seq"] = 12345
    results = client.post("/v1/ingest", json=batch("gw1", [bad_alert]),
                          headers=bearer(enrolled["gw1"])).json()
    assert results["results"][0]["status"] == "rejected"
    assert "does not match the body" in results["results"][0]["reason"]
    assert _count(engine) == (0, 2)


def test_bad_entries_are_rejected_by_index_with_a_reason(
    client: TestClient, engine: Engine, enrolled: dict[str, str]
) -> None:
    aggs = [aggregate("gw1", t=T0 + 60 * i) for i in range(10)]
    doc = batch2("gw1", [alert("gw1", seq=1)], aggs)
    cols = doc["aggregates"]
    cols["count"][1] = -5
    cols["channels"][2] = "not json"
    cols["channels"][3] = cols["channels"][3].replace("-1.0", "NaN")
    cols["channels"][4] = json.dumps([{**CHANNELS[0], "channel": "a\x00b"}])
    cols["max_score"][5] = 2**64
    cols["channels"][6] = json.dumps([{**CHANNELS[0], "extra": 1}])
    cols["interval_s"][7] = 0
    cols["channels"][8] = cols["channels"][8][:-1] + "],[]"  # two values: not one list
    resp = client.post("/v1/ingest", json=doc, headers=bearer(enrolled["gw1"]))
    results = resp.json()["results"]
    assert [r["status"] for r in results] == (
        ["accepted", "accepted"] + ["rejected"] * 8 + ["accepted"]
    )
    reasons = [r.get("reason", "") for r in results]
    assert "count" in reasons[2]
    assert "channels" in reasons[3]
    assert "non-finite" in reasons[4]
    assert "NUL" in reasons[5]
    assert "max_score" in reasons[6] or "range" in reasons[6]
    assert "extra" in reasons[7].lower()
    assert "interval_s" in reasons[8]
    assert "channels" in reasons[9]
    assert _count(engine) == (1, 2)


def test_whole_batch_column_errors_are_a_clear_4xx(
    client: TestClient, engine: Engine, enrolled: dict[str, str]
) -> None:
    headers = bearer(enrolled["gw1"])
    aggs = [aggregate("gw1", t=T0 + 60 * i) for i in range(3)]
    short = batch2("gw1", [], aggs)
    short["aggregates"]["windows"].pop()
    resp = client.post("/v1/ingest", json=short, headers=headers)
    assert resp.status_code == 422 and "unequal lengths" in resp.text, resp.text
    v1_with_columns = batch2("gw1", [], aggs, schema=1)
    resp = client.post("/v1/ingest", json=v1_with_columns, headers=headers)
    assert resp.status_code == 422 and "schema 2" in resp.text, resp.text
    missing = batch2("gw1", [], aggs)
    del missing["aggregates"]["channels"]
    resp = client.post("/v1/ingest", json=missing, headers=headers)
    assert resp.status_code == 422 and "channels" in resp.text, resp.text
    not_list = batch2("gw1", [], aggs)
    not_list["aggregates"]["count"] = 5
    assert client.post("/v1/ingest", json=not_list, headers=headers).status_code == 422
    many = [aggregate("gw1", t=T0 + i) for i in range(3000)]
    too_many = batch2("gw1", many[:2500], many[2500:] + many[:2001])  # 5,001 in all
    resp = client.post("/v1/ingest", content=gz(too_many), headers=gzip_headers(enrolled["gw1"]))
    assert resp.status_code == 413, resp.text[:300]
    assert "5001" in resp.text
    assert _count(engine) == (0, 0)
