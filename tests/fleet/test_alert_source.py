"""Alerts carrying ``source`` (recorded camera inputs): the fleet accepts them on the fast and
the slow ingest path, stores the body as sent and lists it; a bad ``source`` rejects only that
record; alerts without one are stored without a ``source`` key."""

from __future__ import annotations

import json
from typing import Any

from fastapi.testclient import TestClient

from tests.fleet.test_ingest_fast import _fast, _slow
from tests.fleet.wire import T0, aggregate, alert, batch, bearer

FOLDER = {"file": "defects/crack_01.png"}
VIDEO = {"file": "line1.avi", "frame": 1234}


def test_alerts_with_source_are_stored_and_listed(
    client: TestClient, enrolled: dict[str, str]
) -> None:
    records = [alert("gw1", "cam1", seq=1, source=FOLDER, top_channels=[]),
               alert("gw1", "cam2", seq=1, t=T0 + 1, source=VIDEO, top_channels=[]),
               alert("gw1", "pump1", seq=1, t=T0 + 2)]
    resp = client.post("/v1/ingest", json=batch("gw1", records), headers=bearer(enrolled["gw1"]))
    assert resp.status_code == 200, resp.text
    assert [r["status"] for r in resp.json()["results"]] == ["accepted"] * 3
    items = client.get("/v1/devices/gw1/alerts", headers=bearer(enrolled["gw1"])).json()["items"]
    payloads = [i["payload"] for i in items]
    assert [p.get("source") for p in payloads] == [FOLDER, VIDEO, None]
    assert "source" not in payloads[2]
    assert payloads[2] == records[2]["body"]  # a sensor alert is stored exactly as sent


def test_bad_source_rejects_only_its_record(
    client: TestClient, enrolled: dict[str, str]
) -> None:
    records = [alert("gw1", "cam1", seq=1, source={"file": "v.avi", "frame": -1}),
               alert("gw1", "cam1", seq=2, source={"file": "a.png", "x": 1}),
               alert("gw1", "cam1", seq=3, source=FOLDER)]
    resp = client.post("/v1/ingest", json=batch("gw1", records), headers=bearer(enrolled["gw1"]))
    results = resp.json()["results"]
    assert [r["status"] for r in results] == ["rejected", "rejected", "accepted"]
    assert "source.frame" in results[0]["reason"] and "source.x" in results[1]["reason"]


def test_fast_and_slow_paths_agree_on_source() -> None:
    records: list[Any] = [alert("gw1", "cam1", seq=1, source=FOLDER),
                          alert("gw1", "cam1", seq=2, source=VIDEO), alert("gw1", seq=3),
                          aggregate("gw1")]
    data = json.dumps(batch("gw1", records)).encode()
    fast = _fast(data)
    assert fast is not None and fast == _slow(data)
    stored = [row["payload"].get("source") for _, row in fast[0]["alert"]]
    assert stored == [FOLDER, VIDEO, None]
    bad = json.dumps(batch("gw1", [alert("gw1", "cam1", seq=1,
                                         source={"file": "v.avi", "frame": -1})])).encode()
    assert _fast(bad) is None
    assert _slow(bad)[1][0]["status"] == "rejected"
