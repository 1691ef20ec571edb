"""The operator's rollback path through a REAL fleet process and a real agent.

``edge-fleet serve`` runs with trusted package keys and a rollback signing key; the operator's
commands are the ``edge-fleet`` CLI (``model push``, ``rollout create``, ``rollout abort``); the
agent (in this process, readings flowing) polls the fleet, downloads, verifies, shadows and
swaps. Packages are signed copies of ``models/skab-wstat``: B (the builtin version, signed), B + 1
and B + 2, written v1, v2, v3 below.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from agent.app import Agent
from cloud_sync.package import generate_keypair
from tests.integration.fleet_peer import ADMIN_TOKEN, FleetProcess
from tests.integration.model_fleet import BUILTIN_VERSION, make_package
from tests.integration.test_model_update import (
    CALIBRATION,
    FlowingSource,
    _agent,
    _running,
    _wait_for,
    _windows_scored,
)

pytestmark = pytest.mark.integration

V1, V2, V3 = BUILTIN_VERSION, BUILTIN_VERSION + 1, BUILTIN_VERSION + 2


@pytest.fixture
def fleet_keys(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    """(package signing key, the fleet's trusted dir, the agent's package trusted dir, the
    agent's rollback keys dir).

    The fleet's rollback key ``fleet-rollback.key`` is in ``tmp_path/fleet-keys``; agents trust
    its public half for rollbacks only, and the operator's key for packages only.
    """
    ops, ops_pub = generate_keypair(tmp_path / "ops-keys", "ops")
    _rb, rb_pub = generate_keypair(tmp_path / "fleet-keys", "fleet-rollback")
    fleet_trusted, agent_trusted = tmp_path / "fleet-trusted", tmp_path / "agent-trusted"
    agent_rollback = tmp_path / "agent-rollback-keys"
    for d, pubs in ((fleet_trusted, [ops_pub]), (agent_trusted, [ops_pub]),
                    (agent_rollback, [rb_pub])):
        d.mkdir()
        for pub in pubs:
            (d / pub.name).write_bytes(pub.read_bytes())
    return ops, fleet_trusted, agent_trusted, agent_rollback


@pytest.fixture
def rfleet(tmp_path: Path, fleet_keys: tuple[Path, Path, Path, Path]
           ) -> Iterator[FleetProcess]:
    """A real fleet holding signed skab-wstat v1, v2 and v3."""
    ops, fleet_trusted, _, _ = fleet_keys
    proc = FleetProcess(tmp_path / "fleet", serve_args=[
        "--trusted-keys", str(fleet_trusted),
        "--rollback-key", str(tmp_path / "fleet-keys" / "fleet-rollback.key"),
    ])
    proc.start()
    try:
        for v in (V1, V2, V3):
            pushed = proc.cli("model", "push", str(make_package(tmp_path / "pkgs", v, ops)))
            assert f"pushed skab-wstat@{v}" in pushed
        yield proc
    finally:
        proc.stop()


def _admin_get(fleet: FleetProcess, path: str) -> Any:
    r = requests.get(fleet.url + path, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                     timeout=10)
    r.raise_for_status()
    return r.json()


def _member(fleet: FleetProcess, rollout_id: int) -> dict[str, Any]:
    ro = _admin_get(fleet, f"/v1/rollouts/{rollout_id}")
    member: dict[str, Any] = ro["devices"][0]
    return member


def _device_model(fleet: FleetProcess) -> tuple[str | None, int | None]:
    d = _admin_get(fleet, "/v1/devices")["devices"][0]
    return d["model_name"], d["model_version"]


def _rollout(fleet: FleetProcess, version: int) -> int:
    out = fleet.cli("rollout", "create", "skab-wstat", str(version), "--device", "gw1")
    return int(out.split()[1].rstrip(":"))  # "rollout 1: skab-wstat@2  state promoted"


def _activate(fleet: FleetProcess, agent: Agent, version: int) -> int:
    """Roll ``version`` out to gw1 and wait until the agent runs it; the rollout id."""
    rid = _rollout(fleet, version)
    _wait_for(lambda: _member(fleet, rid)["state"] == "active", timeout_s=120)
    assert agent.streams["pump"].package.manifest.version == version
    return rid


def _abort_and_wait(fleet: FleetProcess, agent: Agent, rid: int, back_to: int) -> str:
    """``edge-fleet rollout abort``; wait until gw1 is back on ``back_to``; the CLI's output."""
    out = fleet.cli("rollout", "abort", str(rid))
    _wait_for(lambda: _member(fleet, rid)["state"] == "rolled_back", timeout_s=120)
    assert _member(fleet, rid)["reason"] == f"abort: back on skab-wstat@{back_to}"
    assert agent.streams["pump"].package.manifest.version == back_to
    return out


def _reports(fleet: FleetProcess) -> list[tuple[int | None, int, str]]:
    """(rollout_id, version, state) of every status report the fleet stored, in order."""
    conn = sqlite3.connect(fleet.db_path, timeout=30)
    try:
        return [(r[0], int(r[1]), str(r[2])) for r in conn.execute(
            "SELECT rollout_id, version, state FROM model_status_reports ORDER BY pk")]
    finally:
        conn.close()


def _downloads(fleet: FleetProcess) -> dict[tuple[str, int], int]:
    """HTTP status of every skab-wstat package for gw1 and a second device, gw2 (enrolled
    here): a device gets only what it is assigned."""
    out = fleet.cli("device", "add", "gw2", "--db", fleet.db_url,
                    "--state-dir", str(fleet.workdir))
    tokens = {"gw1": fleet.token, "gw2": out.strip().splitlines()[-1].strip()}
    return {(d, v): requests.get(f"{fleet.url}/v1/models/skab-wstat/{v}/package", timeout=10,
                                 headers={"Authorization": f"Bearer {t}"}).status_code
            for d, t in tokens.items() for v in (V1, V2, V3)}


_STEPS = ["downloaded", "verified", "accepted", "shadow", "active"]


def _check_agent_after(agent: Agent, source: FlowingSource, tmp_path: Path,
                       active: int, previous: int | None) -> None:
    """Nothing dropped, alert ids contiguous, active.json and the package folders right."""
    assert _windows_scored(agent) == source.emitted - CALIBRATION
    rows = sqlite3.connect(tmp_path / "state" / "agent.db").execute(
        "SELECT alert_id, seq FROM alerts ORDER BY seq").fetchall()
    assert [r[1] for r in rows] == list(range(1, len(rows) + 1))
    models = tmp_path / "state" / "models"
    state = json.loads((models / "active.json").read_text())["streams"]["pump"]
    assert state["active"]["version"] == active
    assert (state["previous"] or {}).get("version") == previous
    kept = sorted(p.name for p in models.iterdir() if p.name != "incoming")
    assert kept == sorted(["active.json", "high_water.json",
                           *(f"skab-wstat-{v}" for v in (active, previous) if v)])


def test_abort_of_the_first_rollout_goes_back_to_the_builtin_version(
    tmp_path: Path, rfleet: FleetProcess, fleet_keys: tuple[Path, Path, Path, Path],
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """builtin v1 → rollout v2 → abort: the agent reported its builtin v1 at start, so the
    fleet knows the previous version and sends the registry's v1 with a signed rollback."""
    caplog.set_level(logging.WARNING, logger="agent.updater")
    finish = threading.Event()
    source = FlowingSource("pump", finish)
    agent = _agent(tmp_path, rfleet, fleet_keys[2], source, monkeypatch, token=rfleet.token,
                   rollback_keys=fleet_keys[3])
    with _running(agent, finish):
        _wait_for(lambda: _device_model(rfleet) == ("skab-wstat", V1))  # the start report
        rid = _activate(rfleet, agent, V2)
        assert _member(rfleet, rid)["previous_version"] == V1
        shown = _abort_and_wait(rfleet, agent, rid, back_to=V1)
        assert f"back to skab-wstat@{V1}: gw1" in shown
        assert "PREV" in shown and "aborted" in shown
    assert _reports(rfleet) == [
        (None, V1, "active"), *((rid, V2, s) for s in _STEPS), *((rid, V1, s) for s in _STEPS)]
    assert _device_model(rfleet) == ("skab-wstat", V1)
    _check_agent_after(agent, source, tmp_path, active=V1, previous=V2)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_v1_v2_v3_abort_back_to_the_kept_v2(
    tmp_path: Path, rfleet: FleetProcess, fleet_keys: tuple[Path, Path, Path, Path],
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """builtin v1 → v2 → v3 → abort → v2: the agent kept v2 as its previous package; the abort
    installs the downloaded v2 over that folder (it failed with Errno 39 at every poll)."""
    caplog.set_level(logging.WARNING, logger="agent.updater")
    finish = threading.Event()
    source = FlowingSource("pump", finish)
    agent = _agent(tmp_path, rfleet, fleet_keys[2], source, monkeypatch, token=rfleet.token,
                   rollback_keys=fleet_keys[3])
    with _running(agent, finish):
        _wait_for(lambda: _device_model(rfleet) == ("skab-wstat", V1))
        r2 = _activate(rfleet, agent, V2)
        r3 = _activate(rfleet, agent, V3)
        assert (_member(rfleet, r2)["previous_version"], _member(rfleet, r3)["previous_version"]
                ) == (V1, V2)
        assert (tmp_path / "state" / "models" / f"skab-wstat-{V2}").is_dir()  # kept as previous
        assert _downloads(rfleet) == {("gw1", V1): 403, ("gw1", V2): 403, ("gw1", V3): 200,
                                      ("gw2", V1): 403, ("gw2", V2): 403, ("gw2", V3): 403}
        shown = _abort_and_wait(rfleet, agent, r3, back_to=V2)
        assert f"back to skab-wstat@{V2}: gw1" in shown
        assert _admin_get(rfleet, f"/v1/rollouts/{r2}")["state"] == "promoted"
    assert _reports(rfleet) == [
        (None, V1, "active"), *((r2, V2, s) for s in _STEPS), *((r3, V3, s) for s in _STEPS),
        *((r3, V2, s) for s in _STEPS)]
    assert _device_model(rfleet) == ("skab-wstat", V2)
    _check_agent_after(agent, source, tmp_path, active=V2, previous=V3)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
