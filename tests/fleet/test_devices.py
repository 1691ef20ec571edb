"""Enrollment, listing, revocation and authentication."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy import Engine, select, text

from fleet.db.devices import hash_token
from fleet.db.schema import devices
from tests.fleet.conftest import enroll
from tests.fleet.wire import aggregate, batch, bearer


def test_enroll_shows_token_once_and_stores_only_its_hash(
    client: TestClient, engine: Engine, admin: dict[str, str]
) -> None:
    token = enroll(client, "gw1", ["line=1", "site/a"])
    assert len(token) >= 40
    with engine.connect() as conn:
        row = conn.execute(select(devices)).one()
        dump = " ".join(
            str(v)
            for table in ("devices", "alerts", "aggregates")
            for r in conn.execute(text(f"SELECT * FROM {table}"))
            for v in r
        )
    assert row.token_hash == hash_token(token)
    assert token not in dump
    listed = client.get("/v1/devices", headers=admin).json()["devices"]
    assert [d["device_id"] for d in listed] == ["gw1"]
    assert listed[0]["tags"] == ["line=1", "site/a"]
    assert "token" not in listed[0] and "token_hash" not in listed[0]


def test_enroll_twice_conflicts_and_bad_input_is_422(
    client: TestClient, admin: dict[str, str]
) -> None:
    enroll(client, "gw1")
    again = client.post("/v1/devices", json={"device_id": "gw1"}, headers=admin)
    assert again.status_code == 409
    assert again.json()["error"] == "conflict"
    for body in ({"device_id": "bad id"}, {"device_id": "gw9", "tags": ["bad tag"]}, [1], {}):
        resp = client.post("/v1/devices", json=body, headers=admin)
        assert resp.status_code == 422, body
        assert resp.json()["error"] == "unprocessable"


def test_admin_endpoints_need_the_admin_token(
    client: TestClient, enrolled: dict[str, str]
) -> None:
    for headers, status in (
        ({}, 401),
        ({"Authorization": "Basic abc"}, 401),
        (bearer("not-a-token"), 401),
        (bearer(enrolled["gw1"]), 403),
    ):
        assert client.get("/v1/devices", headers=headers).status_code == status
        post = client.post("/v1/devices", json={"device_id": "gw3"}, headers=headers)
        assert post.status_code == status
        assert client.delete("/v1/devices/gw2", headers=headers).status_code == status
    resp = client.get("/v1/devices")
    assert resp.headers["www-authenticate"] == "Bearer"
    assert resp.json()["error"] == "unauthorized"


def test_revoked_token_is_refused_and_device_can_re_enroll(
    client: TestClient, admin: dict[str, str], enrolled: dict[str, str]
) -> None:
    body = batch("gw1", [aggregate("gw1")])
    assert client.post("/v1/ingest", json=body, headers=bearer(enrolled["gw1"])).status_code == 200
    assert client.delete("/v1/devices/gw1", headers=admin).status_code == 204
    assert client.delete("/v1/devices/gw1", headers=admin).status_code == 404
    assert client.post("/v1/ingest", json=body, headers=bearer(enrolled["gw1"])).status_code == 401
    assert [d["device_id"] for d in client.get("/v1/devices", headers=admin).json()["devices"]] \
        == ["gw2"]
    everything = client.get("/v1/devices?include_revoked=true", headers=admin).json()["devices"]
    assert {d["device_id"]: d["revoked_at"] is not None for d in everything} == {
        "gw1": True, "gw2": False
    }
    new_token = enroll(client, "gw1")
    resp = client.post("/v1/ingest", json=body, headers=bearer(new_token))
    assert resp.json()["results"][0]["status"] == "duplicate"  # records survive revocation


def test_admin_token_cannot_ingest(client: TestClient, admin: dict[str, str]) -> None:
    resp = client.post("/v1/ingest", json=batch("gw1", []), headers=admin)
    assert resp.status_code == 403


def test_list_shows_last_seen_versions_and_backlog(
    client: TestClient, admin: dict[str, str], enrolled: dict[str, str]
) -> None:
    before = client.get("/v1/devices", headers=admin).json()["devices"][0]
    assert before["last_seen"] is None
    body = batch("gw1", [aggregate("gw1")], agent_version="1.2.3",
                 backlog={"alerts": 4, "aggregates": 9}, model={"name": "m", "version": 7})
    assert client.post("/v1/ingest", json=body, headers=bearer(enrolled["gw1"])).status_code == 200
    gw1 = client.get("/v1/devices", headers=admin).json()["devices"][0]
    assert gw1["device_id"] == "gw1"
    assert gw1["last_seen"] is not None
    assert (gw1["agent_version"], gw1["model_name"], gw1["model_version"]) == ("1.2.3", "m", 7)
    assert gw1["backlog"] == {"alerts": 4, "aggregates": 9}
