"""A model archive damaged in the fleet's database: the real ``edge-fleet serve`` (SQLite file),
the real device client and the operator CLI.

The fleet served the damaged bytes as they were (it records ``archive_sha256`` but did not check
it), and ``rollout show`` said nothing until the devices' retries ran out. Now the download is
refused with 500 ``corrupt_archive`` naming the package, the detection is logged once and
counted, ``model list`` and ``rollout show`` show the package corrupt, and pushing the same
package again repairs it.
"""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest
import requests

from cloud_sync.client import FleetClient
from cloud_sync.errors import FleetError
from cloud_sync.package import generate_keypair, pack
from tests.integration.fleet_peer import ADMIN_TOKEN, FleetProcess
from tests.integration.model_fleet import make_package

pytestmark = pytest.mark.integration

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def _damage(db: Path, name: str, version: int) -> None:
    conn = sqlite3.connect(db, timeout=30)
    try:
        (archive,) = conn.execute("SELECT archive FROM models WHERE name = ? AND version = ?",
                                  (name, version)).fetchone()
        data = bytearray(archive)
        data[len(data) // 2] ^= 0xFF
        with conn:
            conn.execute("UPDATE models SET archive = ? WHERE name = ? AND version = ?",
                         (bytes(data), name, version))
    finally:
        conn.close()


def test_a_damaged_stored_archive_is_refused_marked_corrupt_and_repaired_by_a_push(
    tmp_path: Path,
) -> None:
    key, pub = generate_keypair(tmp_path / "operator", "ops")
    trusted = tmp_path / "fleet-trusted"
    trusted.mkdir()
    (trusted / pub.name).write_bytes(pub.read_bytes())
    fleet = FleetProcess(tmp_path / "fleet", serve_args=["--trusted-keys", str(trusted)])
    fleet.start()
    client = FleetClient(fleet.url, fleet.token)
    try:
        archive = tmp_path / "v2.tar.gz"
        pack(make_package(tmp_path / "pkgs", 2, key), archive)
        push = {"data": archive.read_bytes(), "timeout": 30,
                "headers": {**ADMIN, "Content-Type": "application/gzip"}}
        assert requests.post(f"{fleet.url}/v1/models", **push).status_code == 201  # type: ignore[arg-type]
        ro = requests.post(f"{fleet.url}/v1/rollouts", headers=ADMIN, timeout=10, json={
            "name": "skab-wstat", "version": 2, "devices": ["gw1"]}).json()
        a = client.assignment("pump")
        assert a is not None and a.version == 2
        _damage(fleet.db_path, "skab-wstat", 2)

        for attempt in range(2):
            r = requests.get(f"{fleet.url}{a.url}", timeout=30,
                             headers={"Authorization": f"Bearer {fleet.token}"})
            assert r.status_code == 500, (attempt, r.status_code, r.content[:200])
            body = r.json()
            assert body["error"] == "corrupt_archive", body
            assert "model skab-wstat@2 is corrupt in the fleet's store" in body["detail"], body
        with pytest.raises(FleetError):  # the agent's client: no archive, nothing to install
            client.download(a.url, tmp_path / "dl.tar.gz", a.archive_size, a.archive_sha256)
        assert not (tmp_path / "dl.tar.gz").exists()

        metrics = requests.get(f"{fleet.url}/metrics", timeout=10).text
        assert "fleet_model_archive_corrupt_total 3.0" in metrics, [
            line for line in metrics.splitlines() if "corrupt" in line]
        assert fleet.log_tail(200).count("is corrupt in the fleet's store") == 1, fleet.log_tail()
        listed = fleet.cli("model", "list")
        assert "CORRUPT: push again" in listed, listed
        shown = fleet.cli("rollout", "show", str(ro["id"]))
        assert "CORRUPT PACKAGE: model skab-wstat@2 is corrupt" in shown, shown

        # the same package pushed again replaces the damaged bytes
        assert requests.post(f"{fleet.url}/v1/models", **push).status_code == 201  # type: ignore[arg-type]
        got = client.download(a.url, tmp_path / "dl.tar.gz", a.archive_size, a.archive_sha256)
        assert hashlib.sha256(got.read_bytes()).hexdigest() == a.archive_sha256
        assert "CORRUPT" not in fleet.cli("model", "list")
        assert "CORRUPT" not in fleet.cli("rollout", "show", str(ro["id"]))
    finally:
        client.close()
        fleet.stop()
