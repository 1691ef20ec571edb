"""Alert lifecycle events (payload schema 2, ingest schema 3): the fleet stores ``raised``,
``updated`` and ``cleared`` as records of their own, lists them with their ``event`` and
``episode_id``, keeps listing schema-1 alerts as ``raised`` episodes of their own, and rejects an
``episode_id`` of another stream. Runs on SQLite and PostgreSQL (the ``client`` fixture)."""

from __future__ import annotations

import json
from typing import Any

from fastapi.testclient import TestClient

from tests.fleet.accounts_util import user_token
from tests.fleet.conftest import ADMIN_TOKEN
from tests.fleet.test_ingest_fast import _fast, _slow
from tests.fleet.wire import T0, alert, batch, bearer

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def event(seq: int, kind: str, episode: int, t: float, **body: Any) -> dict[str, Any]:
    extra: dict[str, Any] = {"schema": 2, "event": kind, "episode_id": f"gw1:pump1:{episode}"}
    if kind != "raised":
        extra["peak_score"] = 9.5
    return alert("gw1", seq=seq, t=t, **(extra | body))


def test_lifecycle_events_are_stored_and_listed_with_their_episode(
    client: TestClient, enrolled: dict[str, str]
) -> None:
    records = [alert("gw1", seq=1, t=T0),  # schema 1, an older agent
               event(2, "raised", 2, T0 + 20), event(3, "updated", 2, T0 + 30, score=9.5),
               event(4, "cleared", 2, T0 + 40, score=0.4)]
    resp = client.post("/v1/ingest", json=batch("gw1", records, schema=3),
                       headers=bearer(enrolled["gw1"]))
    assert resp.status_code == 200, resp.text
    assert [r["status"] for r in resp.json()["results"]] == ["accepted"] * 4
    items = client.get("/v1/devices/gw1/alerts", headers=bearer(enrolled["gw1"])).json()["items"]
    assert [(i["id"], i["event"], i["episode_id"]) for i in items] == [
        ("gw1:pump1:1", "raised", "gw1:pump1:1"),  # schema 1: its own episode
        ("gw1:pump1:2", "raised", "gw1:pump1:2"),
        ("gw1:pump1:3", "updated", "gw1:pump1:2"),
        ("gw1:pump1:4", "cleared", "gw1:pump1:2"),
    ]
    assert items[0]["payload"] == records[0]["body"]  # schema 1 stored as sent: no "event"
    fleet = client.get("/v1/alerts", headers=ADMIN).json()["items"]  # the console's timeline
    assert [(i["id"], i["event"], i["episode_id"]) for i in fleet] == [
        (i["id"], i["event"], i["episode_id"]) for i in reversed(items)]
    assert items[3]["payload"] == records[3]["body"]
    # the same events again (a replayed recording, a retry): duplicates, stored once
    again = client.post("/v1/ingest", json=batch("gw1", records[1:], schema=3),
                        headers=bearer(enrolled["gw1"]))
    assert [r["status"] for r in again.json()["results"]] == ["duplicate"] * 3


def test_an_episode_of_another_stream_or_an_unknown_event_rejects_only_its_record(
    client: TestClient, enrolled: dict[str, str]
) -> None:
    records = [event(1, "cleared", 1, T0, episode_id="gw1:other:1"),
               event(2, "ended", 2, T0 + 1),
               event(3, "raised", 3, T0 + 2)]
    resp = client.post("/v1/ingest", json=batch("gw1", records, schema=3),
                       headers=bearer(enrolled["gw1"]))
    results = resp.json()["results"]
    assert [r["status"] for r in results] == ["rejected", "rejected", "accepted"]
    assert "episode_id" in results[0]["reason"] and "event" in results[1]["reason"]


def test_fast_and_slow_paths_agree_on_lifecycle_events() -> None:
    records: list[Any] = [event(1, "raised", 1, T0), event(2, "cleared", 1, T0 + 10),
                          alert("gw1", seq=3, t=T0 + 20)]
    data = json.dumps(batch("gw1", records, schema=3)).encode()
    fast = _fast(data)
    assert fast is not None and fast == _slow(data)
    stored = [row["payload"].get("event") for _, row in fast[0]["alert"]]
    assert stored == ["raised", "cleared", None]


def test_acknowledging_an_episode_event_acknowledges_its_raised_record(
    client: TestClient, enrolled: dict[str, str], engine: Any
) -> None:
    records = [event(2, "raised", 2, T0 + 20), event(3, "updated", 2, T0 + 30, score=9.5),
               event(4, "cleared", 2, T0 + 40, score=0.4),
               event(5, "cleared", 9, T0 + 50)]  # its raised record never reached the fleet
    resp = client.post("/v1/ingest", json=batch("gw1", records, schema=3),
                       headers=bearer(enrolled["gw1"]))
    assert resp.status_code == 200, resp.text
    operator = user_token(engine, "otto", "operator")
    ack = client.post("/v1/alerts/gw1:pump1:4/ack", json={"note": "valve closed"},
                      headers=operator)
    assert ack.status_code == 200, ack.text
    assert ack.json()["alert_id"] == "gw1:pump1:2" and ack.json()["new"] is True
    again = client.post("/v1/alerts/gw1:pump1:3/ack", headers=operator).json()
    assert again["alert_id"] == "gw1:pump1:2" and again["new"] is False
    orphan = client.post("/v1/alerts/gw1:pump1:5/ack", headers=operator).json()
    assert orphan["alert_id"] == "gw1:pump1:5" and orphan["new"] is True
    acked = client.get("/v1/alerts?acked=true", headers=ADMIN).json()["items"]
    assert sorted((i["id"], i["ack_note"]) for i in acked) == [
        ("gw1:pump1:2", "valve closed"), ("gw1:pump1:5", None)]
    audit = client.get("/v1/audit?action=alert.ack", headers=ADMIN).json()["entries"]
    assert sorted(e["target"] for e in audit) == ["gw1:pump1:2", "gw1:pump1:5"]
