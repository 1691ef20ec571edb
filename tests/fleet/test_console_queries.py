"""The console's read routes on both databases: a stream's series downsampled in SQL, and the
alerts timeline with device, stream, tag and time filters."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.fleet.conftest import enroll
from tests.fleet.wire import T0, aggregate, alert, batch, gz, gzip_headers


def _ingest(client: TestClient, token: str, device: str, records: list[dict[str, object]]
            ) -> None:
    resp = client.post("/v1/ingest", content=gz(batch(device, records)),
                       headers=gzip_headers(token))
    assert resp.status_code == 200, resp.text
    assert {r["status"] for r in resp.json()["results"]} == {"accepted"}


def test_series_is_downsampled_to_points(client: TestClient, admin: dict[str, str]) -> None:
    token = enroll(client, "gw1")
    enroll(client, "gw2")
    aggs = [aggregate("gw1", t=T0 + 60 * i, max_score=i / 10, alert_count=i % 2)
            for i in range(10)]
    aggs.append(aggregate("gw1", stream="other", t=T0, max_score=9.0))
    _ingest(client, token, "gw1", [*aggs, alert("gw1", t=T0 + 100, threshold=0.55)])
    resp = client.get("/v1/devices/gw1/series", headers=admin, params={
        "stream": "pump1", "from": T0, "to": T0 + 600, "points": 5})
    assert resp.status_code == 200, resp.text
    got = resp.json()
    assert got["bucket_s"] == 120 and got["threshold"] == 0.55
    assert [p["max_score"] for p in got["points"]] == [0.1, 0.3, 0.5, 0.7, 0.9]
    assert [p["count"] for p in got["points"]] == [1200] * 5
    assert [p["alerts"] for p in got["points"]] == [1] * 5
    assert got["points"][1]["t"].startswith("2023-11-14T22:15:20")
    # the device itself may read its series, not another's
    own = client.get("/v1/devices/gw1/series", headers={"Authorization": f"Bearer {token}"},
                     params={"stream": "pump1", "from": T0, "to": T0 + 600})
    assert own.status_code == 200 and len(own.json()["points"]) == 10
    other = client.get("/v1/devices/gw2/series", headers={"Authorization": f"Bearer {token}"},
                       params={"stream": "pump1"})
    assert other.status_code == 403
    assert client.get("/v1/devices/gw1/series", headers=admin, params={
        "stream": "pump1", "from": T0, "to": T0 - 1}).status_code == 422
    assert client.get("/v1/devices/gw1/series", headers=admin, params={
        "stream": "pump1", "points": 5000}).status_code == 422
    assert client.get("/v1/devices/nope/series", headers=admin,
                      params={"stream": "pump1"}).status_code == 404


def test_alerts_timeline_filters(client: TestClient, admin: dict[str, str]) -> None:
    t1 = enroll(client, "gw1", ["line=1", "site/a"])
    t2 = enroll(client, "gw2", ["line=2"])
    _ingest(client, t1, "gw1", [alert("gw1", seq=i, t=T0 + 10 * i) for i in range(5)])
    _ingest(client, t2, "gw2", [alert("gw2", stream="fan", seq=i, t=T0 + 10 * i + 5)
                                for i in range(3)])

    def ids(**params: object) -> list[str]:
        resp = client.get("/v1/alerts", headers=admin, params=params)
        assert resp.status_code == 200, resp.text
        return [a["id"] for a in resp.json()["items"]]

    everything = ids()
    assert len(everything) == 8 and everything[0] == "gw1:pump1:4"  # newest first
    assert ids(tag="line=2") == ["gw2:fan:2", "gw2:fan:1", "gw2:fan:0"]
    assert ids(tag="site/a", limit=2) == ["gw1:pump1:4", "gw1:pump1:3"]
    assert ids(tag="line=9") == []
    assert ids(device="gw1", stream="fan") == []
    assert ids(stream="fan", since=T0 + 10, until=T0 + 20) == ["gw2:fan:1"]
    page = client.get("/v1/alerts", headers=admin, params={"limit": 3}).json()
    assert page["truncated"] is True and len(page["items"]) == 3
    device = client.get("/v1/alerts", headers={"Authorization": f"Bearer {t1}"})
    assert device.status_code == 403
