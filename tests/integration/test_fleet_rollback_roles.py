"""Key roles end to end: the real ``edge-fleet`` signs an abort's rollback with its
``--rollback-key``, and the agent's checks accept it only from its rollback trust set.

Packages are signed by the operator's key (the agents' ``trusted_keys_dir``); the fleet's
rollback key is in the agents' ``rollback_keys_dir`` only. gw1 runs v2, then v3 (reported
``active`` through the real client), the v3 rollout is aborted: the fleet assigns v2 with a
rollback for gw1, stream pump, 3 → 2, which the agent's guard and archive check accept over
real HTTP; the same rollback is refused by a guard that trusts the package key for rollbacks,
and for another stream.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import requests

from agent.services.package_guard import HighWater, PackageGuard
from cloud_sync.archive import unpack_verified
from cloud_sync.client import FleetClient
from cloud_sync.package import generate_keypair, load_public_keys, pack
from cloud_sync.protocol import ModelStatusReport
from cloud_sync.rollback import RollbackPolicy
from tests.integration.fleet_peer import ADMIN_TOKEN, FleetProcess
from tests.integration.model_fleet import make_package

pytestmark = pytest.mark.integration

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def _trust(pub: Path, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / pub.name).write_bytes(pub.read_bytes())
    return directory


def test_fleet_rollback_is_accepted_only_from_the_rollback_trust_set(tmp_path: Path) -> None:
    ops, ops_pub = generate_keypair(tmp_path / "operator", "ops")
    rb, rb_pub = generate_keypair(tmp_path / "fleet-keys", "fleet-rollback")
    fleet = FleetProcess(tmp_path / "fleet", serve_args=[
        "--trusted-keys", str(_trust(ops_pub, tmp_path / "fleet-trusted")),
        "--rollback-key", str(rb)])
    fleet.start()
    try:
        for version in (2, 3):
            archive = tmp_path / "pkgs" / f"v{version}.tar.gz"
            pack(make_package(tmp_path / "pkgs", version, ops), archive)
            r = requests.post(f"{fleet.url}/v1/models", data=archive.read_bytes(), timeout=30,
                              headers={**ADMIN, "Content-Type": "application/gzip"})
            assert r.status_code == 201, r.text
        client = FleetClient(fleet.url, fleet.token)
        for version in (2, 3):
            ro = requests.post(f"{fleet.url}/v1/rollouts", headers=ADMIN, timeout=10, json={
                "name": "skab-wstat", "version": version, "devices": ["gw1"]}).json()
            client.report_status(ModelStatusReport(
                device_id="gw1", stream="pump", name="skab-wstat", version=version,
                rollout_id=ro["id"], state="active", at=time.time()))
        r = requests.post(f"{fleet.url}/v1/rollouts/{ro['id']}/abort", headers=ADMIN, timeout=10)
        assert r.json()["state"] == "aborted"
        a = client.assignment("pump")
        assert a is not None and a.version == 2 and a.rollback is not None
        assert (a.rollback.stream, a.rollback.key_id) == ("pump", "fleet-rollback")

        hw = HighWater(tmp_path / "state" / "high_water.json")
        hw.ran("pump", "skab-wstat", 3)
        running = ("skab-wstat", 3)
        agent_pkg_keys = load_public_keys(_trust(ops_pub, tmp_path / "agent-trusted"))
        rollback_keys = load_public_keys(_trust(rb_pub, tmp_path / "agent-rollback"))
        guard = PackageGuard(hw, RollbackPolicy(rollback_keys), "gw1", 1 << 28)
        assert guard.before_download(a, "pump", running) is None
        archive = client.download(a.url, tmp_path / "dl.tar.gz", a.archive_size,
                                  a.archive_sha256)
        m = unpack_verified(archive, tmp_path / "state" / "skab-wstat-2", agent_pkg_keys,
                            max_bytes=1 << 28,
                            check=lambda got: guard.check("pump", running, a, got))
        assert m.version == 2

        # the package key is not a rollback key; the rollback names stream pump only
        wrong_role = PackageGuard(hw, RollbackPolicy(agent_pkg_keys), "gw1", 1 << 28)
        assert "not a trusted rollback key" in str(wrong_role.before_download(a, "pump", running))
        hw.ran("fan", "skab-wstat", 3)
        assert "device/stream/name" in str(guard.before_download(a, "fan", running))
        # the fleet's rollback key cannot sign a package the agent installs
        assert "fleet-rollback" not in agent_pkg_keys
    finally:
        fleet.stop()
