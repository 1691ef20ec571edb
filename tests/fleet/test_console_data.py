"""The console's data routes on SQLite and PostgreSQL (fleet-wide alerts and their
acknowledgement, streams, the plot series, model history, where models run) and the console's
static files (served by the fleet, CSP, nothing from another origin, no HTML from data)."""

from __future__ import annotations

import re
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import Engine

from fleet.api.console_data import FleetAlertPage
from fleet.console.routes import STATIC_DIR
from tests.fleet.accounts_util import user_token
from tests.fleet.conftest import ADMIN_TOKEN, enroll
from tests.fleet.wire import T0, aggregate, alert, batch, bearer, gz, gzip_headers

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def ingest(client: TestClient, token: str, device: str, records: list[Any], **extra: Any) -> Any:
    resp = client.post("/v1/ingest", content=gz(batch(device, records, **extra)),
                       headers=gzip_headers(token))
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_fleet_alerts_filter_by_device_stream_tag_time_and_ack(
    client: TestClient, engine: Engine
) -> None:
    t1 = enroll(client, "gw1", ["line=1"])
    t2 = enroll(client, "gw2", ["line=2"])
    ingest(client, t1, "gw1", [alert("gw1", "pump1", 1, T0), alert("gw1", "fan", 2, T0 + 60)])
    ingest(client, t2, "gw2", [alert("gw2", "pump1", 1, T0 + 120)])
    viewer = user_token(engine, "vera", "viewer")
    operator = user_token(engine, "otto", "operator")

    def ids(query: str) -> list[str]:
        resp = client.get(f"/v1/alerts{query}", headers=viewer)
        assert resp.status_code == 200, resp.text
        return [a["id"] for a in resp.json()["items"]]

    assert ids("") == ["gw2:pump1:1", "gw1:fan:2", "gw1:pump1:1"]  # newest first
    assert ids("?tag=line=1") == ["gw1:fan:2", "gw1:pump1:1"]
    assert ids("?stream=pump1") == ["gw2:pump1:1", "gw1:pump1:1"]
    assert ids("?device=gw1&stream=fan") == ["gw1:fan:2"]
    assert ids(f"?since={T0 + 60}&until={T0 + 120}") == ["gw1:fan:2"]
    assert ids("?tag=nope") == []

    assert client.post("/v1/alerts/gw1:fan:2/ack", json={}, headers=viewer).status_code == 403
    resp = client.post("/v1/alerts/gw1:fan:2/ack", json={"note": "bearing swapped"},
                       headers=operator)
    assert resp.status_code == 200, resp.text
    assert resp.json()["acked_by"] == "otto" and resp.json()["new"] is True
    again = client.post("/v1/alerts/gw1:fan:2/ack", headers=ADMIN)
    assert again.json()["acked_by"] == "otto" and again.json()["new"] is False
    assert client.post("/v1/alerts/gw1:fan:9/ack", headers=operator).status_code == 404
    assert ids("?acked=true") == ["gw1:fan:2"]
    assert ids("?acked=false") == ["gw2:pump1:1", "gw1:pump1:1"]
    item = client.get("/v1/alerts?acked=true", headers=viewer).json()["items"][0]
    assert item["ack_note"] == "bearing swapped"
    # encoded without the response model: still exactly its fields (extra="forbid")
    page = FleetAlertPage.model_validate(client.get("/v1/alerts", headers=viewer).json())
    assert len(page.items) == 3 and page.items[0].event == "raised"
    audit = client.get("/v1/audit?action=alert.ack", headers=viewer).json()["entries"]
    assert [(e["actor"], e["target"]) for e in audit] == [("otto", "gw1:fan:2")]


def test_series_has_one_point_per_interval_then_buckets(client: TestClient) -> None:
    token = enroll(client, "gw1")
    records = [aggregate("gw1", "pump1", T0 + 60 * i, max_score=0.1 * (i % 7))
               for i in range(120)]
    records.append(aggregate("gw1", "fan", T0))
    records.append(alert("gw1", "pump1", 1, T0 + 600, threshold=0.55))
    ingest(client, token, "gw1", records)
    base = f"/v1/devices/gw1/series?stream=pump1&since={T0}&until={T0 + 7200}"
    full = client.get(base, headers=ADMIN).json()
    assert len(full["points"]) == 120 and full["bucket_s"] == 0
    assert full["points"][3] == [T0 + 180, 0.30000000000000004, 12, 0]
    assert full["thresholds"] == [[T0 + 600, 0.55]] and full["last_threshold"] == 0.55
    coarse = client.get(base + "&points=10", headers=ADMIN).json()
    assert len(coarse["points"]) == 10 and coarse["bucket_s"] == 720
    assert coarse["points"][0][1] == 0.6000000000000001 and coarse["points"][0][2] == 12 * 12
    half = client.get(f"/v1/devices/gw1/series?stream=pump1&since={T0}&until={T0 + 1800}",
                      headers=ADMIN).json()
    assert len(half["points"]) == 30
    # whatever the range: the data's extent and the threshold of the newest alert
    ingest(client, token, "gw1", [alert("gw1", "pump1", 2, T0 + 6000, threshold=0.7)])
    for doc in (full, half, client.get(base + "&points=10", headers=ADMIN).json(),
                client.get(f"/v1/devices/gw1/series?stream=pump1&since={T0 - 86400}"
                           f"&until={T0 - 3600}", headers=ADMIN).json()):
        assert (doc["first_at"], doc["last_at"]) == (T0, T0 + 119 * 60)
    late = client.get(f"{base}&points=10", headers=ADMIN).json()
    assert late["current_threshold"] == 0.7 and late["last_threshold"] == 0.7
    early = client.get(f"/v1/devices/gw1/series?stream=pump1&since={T0}&until={T0 + 1800}",
                       headers=ADMIN).json()
    assert early["current_threshold"] == 0.7 and early["last_threshold"] == 0.55
    none = client.get("/v1/devices/gw1/series?stream=nothing", headers=ADMIN).json()
    assert (none["first_at"], none["last_at"], none["current_threshold"]) == (None, None, None)
    assert client.get("/v1/devices/nope/series?stream=pump1", headers=ADMIN).status_code == 404
    streams = client.get("/v1/devices/gw1/streams", headers=ADMIN).json()
    assert [s["stream"] for s in streams] == ["fan", "pump1"]


def test_streams_model_history_and_where_models_run(client: TestClient) -> None:
    token = enroll(client, "gw1")
    ingest(client, token, "gw1", [aggregate("gw1", "pump1")])
    report = {"device_id": "gw1", "stream": "pump1", "name": "skab-wstat", "version": 3,
              "state": "active", "at": T0}
    # no rollout: the device reports what it runs (stored, not tied to a rollout)
    resp = client.post("/v1/models/status", json=report, headers=bearer(token))
    assert resp.status_code == 204, resp.text
    running = client.get("/v1/models/running", headers=ADMIN).json()["running"]
    assert running == [{"name": "skab-wstat", "version": 3, "device_id": "gw1",
                        "stream": "pump1", "source": "status report"}]
    history = client.get("/v1/devices/gw1/models", headers=ADMIN).json()["reports"]
    assert [(h["stream"], h["name"], h["version"], h["state"]) for h in history] == [
        ("pump1", "skab-wstat", 3, "active")]
    streams = client.get("/v1/devices/gw1/streams", headers=ADMIN).json()
    assert streams == [{"stream": "pump1", "model_name": "skab-wstat", "model_version": 3,
                        "model_state": "active", "update": None}]


def test_a_rejected_candidate_leaves_the_stream_on_its_model(client: TestClient) -> None:
    """docs/rollouts.md: a device refuses v3 (RollbackRefused) on pump1, which runs v2. The
    stream still runs v2, named by its stream everywhere; the rejection is a separate note."""
    token = enroll(client, "gw1")
    ingest(client, token, "gw1", [aggregate("gw1", "pump1")])
    reason = "RollbackRefused: version 3 is not newer than the installed 4"
    for version, state, why in ((2, "active", None), (3, "downloaded", None),
                                (3, "rejected", reason)):
        resp = client.post("/v1/models/status", headers=bearer(token), json={
            "device_id": "gw1", "stream": "pump1", "name": "skab-wstat", "version": version,
            "state": state, "reason": why, "at": T0})
        assert resp.status_code == 204, resp.text
    running = client.get("/v1/models/running", headers=ADMIN).json()["running"]
    assert [(r["device_id"], r["stream"], r["version"]) for r in running] == [
        ("gw1", "pump1", 2)]
    streams = client.get("/v1/devices/gw1/streams", headers=ADMIN).json()
    assert streams == [{"stream": "pump1", "model_name": "skab-wstat", "model_version": 2,
                        "model_state": "active", "update": {
                            "name": "skab-wstat", "version": 3, "state": "rejected",
                            "reason": reason}}]


def test_hostile_stream_name_is_refused_at_ingest_and_texts_stay_data(
    client: TestClient
) -> None:
    token = enroll(client, "gw1")
    xss = "<img src=x onerror=alert(1)>"
    result = ingest(client, token, "gw1", [aggregate("gw1", xss)])
    assert [r["status"] for r in result["results"]] == ["rejected"]
    ingest(client, token, "gw1", [aggregate("gw1")], agent_version=xss)
    device = client.get("/v1/devices", headers=ADMIN).json()["devices"][0]
    assert device["agent_version"] == xss  # stored as sent; the console shows it as text
    assert client.get("/v1/devices", headers=ADMIN).headers["content-type"].startswith(
        "application/json")


def test_console_files_are_local_with_a_strict_csp(client: TestClient) -> None:
    page = client.get("/console/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp
    assert "unsafe-inline" not in csp and "frame-ancestors 'none'" in csp
    assert page.headers["x-content-type-options"] == "nosniff"
    for asset in ("app.js", "style.css"):
        resp = client.get(f"/console/{asset}")
        assert resp.status_code == 200 and resp.headers["content-security-policy"] == csp
    assert client.get("/console/../fleet.db").status_code == 404
    assert client.get("/console/index.html").status_code == 404
    assert client.get("/console", follow_redirects=False).headers["location"] == "/console/"
    root = client.get("/", follow_redirects=False)  # the bare address a person types first
    assert root.status_code == 307 and root.headers["location"] == "/console/"
    for path in STATIC_DIR.iterdir():
        text = path.read_text()
        urls = set(re.findall(r"https?://[^\s\"')]+", text)) - {"http://www.w3.org/2000/svg"}
        assert not urls, (path.name, urls)  # nothing from another origin
    script = (STATIC_DIR / "app.js").read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in script, sink


def test_console_icon_is_served_and_hidden_means_hidden(client: TestClient) -> None:
    for path in ("/console/favicon.svg", "/favicon.ico"):
        resp = client.get(path)
        assert resp.status_code == 200, path
        assert resp.headers["content-type"] == "image/svg+xml"
        assert resp.content.startswith(b"<svg ") and b"<script" not in resp.content
    page = client.get("/console/").text
    assert '<link rel="icon" href="/console/favicon.svg"' in page
    # the nav bar is <header hidden>: an author display rule must not show it on the login page
    assert re.search(r"\[hidden\]\s*\{\s*display:\s*none\s*!important",
                     (STATIC_DIR / "style.css").read_text())
