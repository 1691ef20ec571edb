"""Ingest: idempotency, per-record results, device isolation, queries by time range."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, func, select

from fleet.db.schema import aggregates, alerts
from tests.fleet.wire import T0, aggregate, alert, batch, bearer, gz, gzip_headers


def _count(engine: Engine) -> tuple[int, int]:
    with engine.connect() as conn:
        return (
            conn.execute(select(func.count()).select_from(alerts)).scalar_one(),
            conn.execute(select(func.count()).select_from(aggregates)).scalar_one(),
        )


def _statuses(resp_json: dict[str, list[dict[str, object]]]) -> list[object]:
    return [r["status"] for r in resp_json["results"]]


def test_same_batch_twice_is_stored_once(
    client: TestClient, engine: Engine, enrolled: dict[str, str]
) -> None:
    records = [aggregate("gw1", t=T0 + 60 * i) for i in range(5)] + [
        alert("gw1", seq=i) for i in range(3)
    ]
    body = gz(batch("gw1", records))
    first = client.post("/v1/ingest", content=body, headers=gzip_headers(enrolled["gw1"]))
    assert first.status_code == 200, first.text
    assert _statuses(first.json()) == ["accepted"] * 8
    assert [r["index"] for r in first.json()["results"]] == list(range(8))
    second = client.post("/v1/ingest", content=body, headers=gzip_headers(enrolled["gw1"]))
    assert _statuses(second.json()) == ["duplicate"] * 8
    assert _count(engine) == (3, 5)


def test_repeated_id_inside_one_batch_is_stored_once(
    client: TestClient, engine: Engine, enrolled: dict[str, str]
) -> None:
    rec = aggregate("gw1")
    resp = client.post("/v1/ingest", json=batch("gw1", [rec, rec, alert("gw1"), alert("gw1")]),
                       headers=bearer(enrolled["gw1"]))
    assert _statuses(resp.json()) == ["accepted", "duplicate", "accepted", "duplicate"]
    assert _count(engine) == (1, 1)


def test_invalid_record_is_rejected_by_index_and_others_stored(
    client: TestClient, engine: Engine, enrolled: dict[str, str]
) -> None:
    records = [
        aggregate("gw1", t=T0),
        aggregate("gw1", t=T0 + 60, count=-5),                  # negative count
        alert("gw1", seq=1, score="high"),                      # wrong type
        {"kind": "nonsense", "id": "gw1:x:1", "body": {}},      # unknown kind
        "not an object",
        alert("gw1", seq=2, window_start="yesterday"),          # bad timestamp
        alert("gw1", seq=3, window_start="2024-01-01T00:00:00"),  # no timezone
        aggregate("gw1", t=T0 + 120, interval_s=0),             # out of range
        aggregate("gw1", t=T0 + 180, count=2**70),              # overflows BIGINT
        aggregate("gw1", t=T0 + 240, channels=[{"channel": "a\x00b", "count": 1, "min": 0,
                                                "max": 0, "mean": 0, "std": 0}]),
        {**alert("gw1", seq=4), "id": "gw1:pump1:5"},           # id != alert_id
        alert("gw1", seq=6, extra_field=1),                     # unknown field
        alert("gw1", seq=7),
    ]
    resp = client.post("/v1/ingest", json=batch("gw1", records), headers=bearer(enrolled["gw1"]))
    assert resp.status_code == 200, resp.text
    results = resp.json()["results"]
    assert [r["status"] for r in results] == ["accepted"] + ["rejected"] * 11 + ["accepted"]
    for r in results[1:-1]:
        assert r["reason"], r
    assert "count" in results[1]["reason"]
    assert "BIGINT" not in results[8]["reason"] and "range" in results[8]["reason"]
    assert _count(engine) == (1, 1)


def test_nan_literal_in_json_is_rejected_per_record(
    client: TestClient, engine: Engine, enrolled: dict[str, str]
) -> None:
    text = json.dumps(batch("gw1", [aggregate("gw1", max_score=0.5), aggregate("gw1", t=T0 + 1)]))
    for literal in ("NaN", "Infinity", "-Infinity", "1e400"):
        doc = text.replace('"max_score": 0.5', f'"max_score": {literal}', 1)
        resp = client.post("/v1/ingest", content=doc.encode(),
                           headers={**bearer(enrolled["gw1"]), "Content-Type": "application/json"})
        assert resp.status_code == 200, resp.text
        results = resp.json()["results"]
        assert results[0]["status"] == "rejected"
        assert "non-finite" in results[0]["reason"]
    assert _count(engine) == (0, 1)


def test_device_cannot_write_records_of_another_device(
    client: TestClient, engine: Engine, enrolled: dict[str, str]
) -> None:
    # the whole batch claims to be gw2: 403, nothing stored
    resp = client.post("/v1/ingest", json=batch("gw2", [aggregate("gw2")]),
                       headers=bearer(enrolled["gw1"]))
    assert resp.status_code == 403
    assert resp.json()["error"] == "forbidden"
    # gw1's batch smuggling gw2 records: those indices rejected
    foreign_body = aggregate("gw1", t=T0 + 5)
    foreign_body["body"]["device_id"] = "gw2"
    records = [aggregate("gw2"), alert("gw2"), foreign_body, aggregate("gw1")]
    resp = client.post("/v1/ingest", json=batch("gw1", records), headers=bearer(enrolled["gw1"]))
    results = resp.json()["results"]
    assert [r["status"] for r in results] == ["rejected"] * 3 + ["accepted"]
    assert "another device" in results[0]["reason"]
    assert _count(engine) == (0, 1)


def test_device_reads_only_its_own_records(
    client: TestClient, admin: dict[str, str], enrolled: dict[str, str]
) -> None:
    for dev in ("gw1", "gw2"):
        resp = client.post("/v1/ingest", json=batch(dev, [aggregate(dev), alert(dev)]),
                           headers=bearer(enrolled[dev]))
        assert _statuses(resp.json()) == ["accepted", "accepted"]
    for kind in ("aggregates", "alerts"):
        own = client.get(f"/v1/devices/gw1/{kind}", headers=bearer(enrolled["gw1"]))
        assert own.status_code == 200
        assert [i["device_id"] for i in own.json()["items"]] == ["gw1"]
        other = client.get(f"/v1/devices/gw2/{kind}", headers=bearer(enrolled["gw1"]))
        assert other.status_code == 403
        assert client.get(f"/v1/devices/gw2/{kind}").status_code == 401
        assert client.get(f"/v1/devices/gw2/{kind}", headers=admin).json()["items"][0][
            "device_id"] == "gw2"
        assert client.get(f"/v1/devices/nope/{kind}", headers=admin).status_code == 404


def test_query_by_time_range_stream_and_limit(
    client: TestClient, enrolled: dict[str, str]
) -> None:
    records = [aggregate("gw1", "s1", t=T0 + 60 * i) for i in range(10)]
    records += [aggregate("gw1", "s2", t=T0 + 60 * i) for i in range(3)]
    records += [alert("gw1", "s1", seq=i, t=T0 + 60 * i) for i in range(10)]
    client.post("/v1/ingest", json=batch("gw1", records), headers=bearer(enrolled["gw1"]))
    h = bearer(enrolled["gw1"])

    def starts(kind: str, **params: object) -> list[str]:
        resp = client.get(f"/v1/devices/gw1/{kind}", params=params, headers=h)
        assert resp.status_code == 200, resp.text
        key = "interval_start" if kind == "aggregates" else "window_start"
        return [i[key] for i in resp.json()["items"]]

    assert len(starts("aggregates")) == 13
    assert len(starts("aggregates", stream="s1")) == 10
    got = starts("aggregates", stream="s1", since=T0 + 120, until=T0 + 300)
    assert len(got) == 3  # 120, 180, 240: since inclusive, until exclusive
    assert got[0].startswith("2023-11-14T22:15:20")
    iso_since = "2023-11-14T22:15:20Z"
    assert starts("alerts", stream="s1", since=iso_since, until=T0 + 300) == starts(
        "alerts", stream="s1", since=T0 + 120, until=T0 + 300)
    assert len(starts("alerts", since=T0 + 120, until=T0 + 300)) == 3
    page = client.get("/v1/devices/gw1/aggregates", params={"stream": "s1", "limit": 4},
                      headers=h).json()
    assert len(page["items"]) == 4 and page["truncated"] is True
    assert client.get("/v1/devices/gw1/aggregates", params={"limit": 100},
                      headers=h).json()["truncated"] is False
    first = client.get("/v1/devices/gw1/alerts", params={"limit": 1}, headers=h).json()
    assert first["items"][0]["payload"]["model"] == {"name": "skab-wstat", "version": 3}


@pytest.mark.parametrize("params", [
    {"since": "yesterday"}, {"since": "nan"}, {"since": "-5"}, {"until": "1e30"},
    {"since": "2024-01-01T00:00:00"}, {"since": 200, "until": 100}, {"limit": 0},
    {"limit": 10**9}, {"limit": "many"}, {"stream": "bad stream"}, {"since": "x" * 100},
])
def test_bad_query_parameters_are_422(
    client: TestClient, enrolled: dict[str, str], params: dict[str, object]
) -> None:
    resp = client.get("/v1/devices/gw1/aggregates", params=params,
                      headers=bearer(enrolled["gw1"]))
    assert resp.status_code == 422, (params, resp.text)
    assert resp.json()["error"] == "unprocessable"
