"""An enrolled device's tags can be changed (API route, admin only; ``edge-fleet device tag``),
and a batch from the wrong ``device_id`` gets a 403 naming both ids and which to change."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from fleet.cli import main
from fleet.db.devices import change_tags
from tests.fleet.conftest import enroll
from tests.fleet.wire import aggregate, batch, batch2, bearer, gz, gzip_headers


def test_a_batch_from_another_device_id_names_both_ids_and_what_to_change(
    client: TestClient, enrolled: dict[str, str]
) -> None:
    for resp in (
        client.post("/v1/ingest", json=batch("line1-gw01", [aggregate("line1-gw01")]),
                    headers=bearer(enrolled["gw1"])),
        client.post("/v1/ingest", content=gz(batch2("line1-gw01", [], [aggregate("line1-gw01")])),
                    headers=gzip_headers(enrolled["gw1"])),
    ):
        assert resp.status_code == 403
        detail = resp.json()["detail"]
        assert "'line1-gw01'" in detail and "'gw1'" in detail
        assert "device_id = 'gw1'" in detail  # which one to change, and to what
        assert "re-enroll" not in detail


def test_admin_changes_an_enrolled_devices_tags(
    client: TestClient, admin: dict[str, str], enrolled: dict[str, str]
) -> None:
    enroll(client, "gw3", ["line=3", "site/a"])
    resp = client.patch("/v1/devices/gw3/tags", json={"add": ["line=4", "pump"],
                                                       "remove": ["site/a"]}, headers=admin)
    assert resp.status_code == 200, resp.text
    assert resp.json()["tags"] == ["line=4", "pump"]
    listed = {d["device_id"]: d["tags"]
              for d in client.get("/v1/devices", headers=admin).json()["devices"]}
    assert listed["gw3"] == ["line=4", "pump"]
    # the token still works
    body = batch("gw1", [aggregate("gw1")])
    assert client.post("/v1/ingest", json=body, headers=bearer(enrolled["gw1"])).status_code == 200

    assert client.patch("/v1/devices/gw3/tags", json={"add": ["x"]},
                        headers=bearer(enrolled["gw1"])).status_code == 403
    assert client.patch("/v1/devices/gw3/tags", json={"add": ["x"]}).status_code == 401
    assert client.patch("/v1/devices/nope/tags", json={"add": ["x"]},
                        headers=admin).status_code == 404
    assert client.patch("/v1/devices/gw3/tags", json={"add": ["bad tag!"]},
                        headers=admin).status_code == 422
    assert client.patch("/v1/devices/gw3/tags", json={"tags": ["x"]},
                        headers=admin).status_code == 422


def test_change_tags_rules() -> None:
    assert change_tags(["a", "k=1"], ["k=2", "a"], []) == ["a", "k=2"]
    assert change_tags(["k=1", "kk=2", "k"], [], ["k"]) == ["kk=2"]


def test_edge_fleet_device_tag_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = f"sqlite:///{tmp_path / 'fleet.db'}"
    common = ["--db", db, "--state-dir", str(tmp_path)]
    assert main(["device", "add", "gw1", "--tag", "line=3", "--create-db", *common]) == 0
    capsys.readouterr()
    assert main(["device", "tag", "gw1", "--add", "line=4", "--add", "cell/7", *common]) == 0
    assert capsys.readouterr().out.strip() == "gw1: tags cell/7 line=4"
    assert main(["device", "tag", "gw1", "--remove", "line", *common]) == 0
    assert capsys.readouterr().out.strip() == "gw1: tags cell/7"
    assert main(["device", "tag", "nope", "--add", "x", *common]) == 1
    assert "no active device 'nope'" in capsys.readouterr().err
    assert main(["device", "tag", "gw1", *common]) == 78
