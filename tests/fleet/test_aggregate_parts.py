"""Aggregate parts (``<device>:<stream>:<ms>:<k>``) through the real API on SQLite and
PostgreSQL: stored as rows of their own by schema 1 and schema 2 (fast and slow path),
idempotent, and still owned by the device and stream of the id."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError
from sqlalchemy import Engine, func, select

from cloud_sync.protocol import AggregateRecord, AlertRecord
from fleet.db.schema import aggregates
from tests.fleet.wire import T0, aggregate, alert, batch, batch2, bearer, gz, gzip_headers


def part(device: str, k: int, stream: str = "pump1", **body: Any) -> dict[str, Any]:
    """Part ``k`` of the interval at ``T0`` (part 0: the plain id)."""
    rec = aggregate(device, stream=stream, t=T0, count=100 + k, **body)
    if k:
        rec["id"] += f":{k}"
    return rec


def _statuses(resp: Any) -> list[str]:
    assert resp.status_code == 200, resp.text
    return [r["status"] for r in resp.json()["results"]]


def _stored(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(select(aggregates.c.id, aggregates.c.count)).all()
    return {str(r[0]): int(r[1]) for r in rows}


def _n(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(aggregates)).scalar_one())


@pytest.mark.parametrize("schema", [1, 2])
@pytest.mark.parametrize("path", ["fast", "slow"])
def test_parts_are_stored_as_rows_of_their_own_and_idempotent(
    client: TestClient, engine: Engine, enrolled: dict[str, str], schema: int, path: str
) -> None:
    token = enrolled["gw1"]
    first = [part("gw1", 0)]
    later = [part("gw1", 1), part("gw1", 2)]
    # a bad record in the batch sends it down the slow (per-record) path
    bad = [aggregate("gw1", t=T0 + 600, count=-1)] if path == "slow" else []

    def send(aggs: list[dict[str, Any]]) -> list[str]:
        doc = batch("gw1", aggs + bad) if schema == 1 else batch2("gw1", [], aggs + bad)
        resp = client.post("/v1/ingest", content=gz(doc), headers=gzip_headers(token))
        return _statuses(resp)[: len(aggs)]

    assert send(first) == ["accepted"]  # part 0 went up before the restart
    assert send(first + later) == ["duplicate", "accepted", "accepted"]
    assert send(later) == ["duplicate", "duplicate"]
    base = f"gw1:pump1:{int(T0 * 1000)}"
    assert _stored(engine) == {base: 100, f"{base}:1": 101, f"{base}:2": 102}
    # the query API returns every part of the interval
    resp = client.get("/v1/devices/gw1/aggregates", headers=bearer(token))
    items = resp.json()["items"]
    assert sorted(i["id"] for i in items) == [base, f"{base}:1", f"{base}:2"]
    assert sum(i["count"] for i in items) == 303


@pytest.mark.parametrize("schema", [1, 2])
def test_part_ids_of_another_device_or_stream_are_rejected(
    client: TestClient, engine: Engine, enrolled: dict[str, str], schema: int
) -> None:
    foreign = part("gw2", 1)
    assert foreign["id"].startswith("gw2:")
    disguised = part("gw1", 1)  # gw1's body, but an id of gw2's with a part suffix
    disguised["id"] = "gw2" + disguised["id"][3:]
    other_stream = part("gw1", 2)
    other_stream["id"] = other_stream["id"].replace(":pump1:", ":pump2:")
    aggs = [foreign, disguised, other_stream, part("gw1", 3)]
    doc = batch("gw1", aggs) if schema == 1 else batch2("gw1", [], aggs)
    resp = client.post("/v1/ingest", content=gz(doc), headers=gzip_headers(enrolled["gw1"]))
    assert _statuses(resp) == ["rejected", "rejected", "rejected", "accepted"]
    reasons = [r.get("reason") or "" for r in resp.json()["results"]]
    assert "another device" in reasons[0]
    assert "another device" in reasons[1]
    assert "stream" in reasons[2]
    assert _n(engine) == 1


@pytest.mark.parametrize("suffix", [":0", ":01", ":1234567", ":x", ":1:2", ":-1"])
def test_malformed_part_suffixes_are_rejected(
    client: TestClient, engine: Engine, enrolled: dict[str, str], suffix: str
) -> None:
    rec = aggregate("gw1", t=T0)
    rec["id"] += suffix
    for doc in (batch("gw1", [rec]), batch2("gw1", [], [rec])):
        resp = client.post("/v1/ingest", content=gz(doc), headers=gzip_headers(enrolled["gw1"]))
        assert _statuses(resp) == ["rejected"]
        assert "id" in resp.json()["results"][0]["reason"]
    assert _n(engine) == 0


def test_part_suffix_is_for_aggregates_only() -> None:
    base = f"gw1:pump1:{int(T0 * 1000)}"
    AggregateRecord.model_validate({**aggregate("gw1", t=T0), "id": f"{base}:7"})
    rec = alert("gw1", seq=5)
    rec["id"] = rec["body"]["alert_id"] = "gw1:pump1:5:1"
    with pytest.raises(ValidationError, match="pattern"):
        AlertRecord.model_validate(rec)
