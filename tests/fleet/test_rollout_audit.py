"""The audit log's rollout entries say which rollout, model, stream, target and (abort) reason;
``--action rollout`` (CLI and API) matches every ``rollout.*`` action; nothing matching prints
"No entries match". SQLite and PostgreSQL; the CLI reads the database the API wrote."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from fleet.cli import main
from fleet.settings import Settings
from tests.fleet.test_rollouts import fleet, keys, mclient  # noqa: F401 (fixtures)


def _entries(client: TestClient, admin: dict[str, str], action: str | None) -> list[dict[str, Any]]:
    r = client.get("/v1/audit", params={"action": action}, headers=admin)
    assert r.status_code == 200, r.text
    entries: list[dict[str, Any]] = r.json()["entries"]
    return entries


def test_rollout_entries_carry_details_and_match_by_prefix(
    mclient: TestClient, admin: dict[str, str], fleet: dict[str, dict[str, str]],  # noqa: F811
    settings: Settings, capsys: pytest.CaptureFixture[str],
) -> None:
    r = mclient.post("/v1/rollouts", json={"name": "skab-wstat", "version": 2, "tag": "line1",
                                           "canary_percent": 10, "stream": "pump"},
                     headers=admin)
    assert r.status_code == 201, r.text
    rid = r.json()["id"]
    r = mclient.post(f"/v1/rollouts/{rid}/abort", headers=admin)
    assert r.status_code == 200, r.text
    reason = r.json()["reason"]
    assert reason.startswith("aborted by the operator")

    entries = _entries(mclient, admin, "rollout")
    assert [e["action"] for e in entries] == ["rollout.abort", "rollout.create"]
    abort, create = entries
    assert create["target"] == str(rid)
    assert create["detail"] == {
        "rollout": rid, "model": "skab-wstat@2", "stream": "pump", "tag": "line1",
        "device_count": 10, "canary_percent": 10.0, "halt_after_failures": 1, "state": "canary"}
    assert abort["detail"] == {**create["detail"], "state": "aborted", "reason": reason}
    assert [e["action"] for e in _entries(mclient, admin, "rollout.abort")] == ["rollout.abort"]
    assert _entries(mclient, admin, "rollout.ab") == []  # a prefix ends at a dot
    everything = [e["action"] for e in _entries(mclient, admin, None)]
    assert "rollout.abort" in everything and "model.push" in everything
    for empty in ("", "."):  # no filter, not "matches nothing"
        assert [e["action"] for e in _entries(mclient, admin, empty)] == everything

    db = ["--db", settings.db_url]
    capsys.readouterr()
    assert main(["audit", "list", "--action", "rollout", *db]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["ID", "AT", "(UTC)", "ACTOR", "VIA", "ACTION", "TARGET", "DETAIL"]
    assert [ln.split()[5] for ln in lines[1:]] == ["rollout.abort", "rollout.create"]
    assert f"rollout={rid} model=skab-wstat@2 stream=pump tag=line1 device_count=10" in lines[2]
    assert 'reason="aborted by the operator' in lines[1]
    assert main(["audit", "list", "--action", "model", *db]) == 0  # model.push, twice
    assert len(capsys.readouterr().out.splitlines()) == 3
    assert main(["audit", "list", "--action", "webhook", *db]) == 0
    assert capsys.readouterr().out == "No entries match\n"


def test_rollout_by_devices_names_them(
    mclient: TestClient, admin: dict[str, str], fleet: dict[str, dict[str, str]],  # noqa: F811
) -> None:
    r = mclient.post("/v1/rollouts", json={"name": "skab-wstat", "version": 2,
                                           "devices": ["gw1", "gw2"]}, headers=admin)
    assert r.status_code == 201, r.text
    (create,) = _entries(mclient, admin, "rollout.create")
    assert create["detail"]["devices"] == ["gw1", "gw2"]
    assert create["detail"]["stream"] == "*" and "tag" not in create["detail"]
