"""The real ``edge-fleet serve`` in a subprocess, spoken to over real HTTP with requests."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from sqlalchemy import Engine

from fleet.settings import Settings
from tests.fleet.conftest import wait_healthy
from tests.fleet.wire import aggregate, alert, batch


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def server(settings: Settings, engine: Engine, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """``edge-fleet serve`` on a free port; yields (base URL, state dir)."""
    port = _free_port()
    state = tmp_path / "state"
    exe = shutil.which("edge-fleet")
    cmd = [exe] if exe else [sys.executable, "-m", "fleet.cli"]
    env = {k: v for k, v in os.environ.items() if k != "EDGE_FLEET_ADMIN_TOKEN"}
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*cmd, "serve", "--db", settings.db_url, "--port", str(port), "--state-dir",
             str(state)], stdout=out, stderr=subprocess.STDOUT, env=env,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, proc, log, 30)
        yield base, state
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert "Traceback" not in log.read_text()


def test_real_server_enroll_ingest_gzip_and_query(server: tuple[str, Path]) -> None:
    base, state = server
    token_file = state / "admin.token"
    assert token_file.stat().st_mode & 0o777 == 0o600
    admin_token = token_file.read_text().strip()
    assert admin_token not in (state.parent / "serve.log").read_text()
    admin = {"Authorization": f"Bearer {admin_token}"}
    with requests.Session() as http:
        resp = http.post(f"{base}/v1/devices", json={"device_id": "gw1"}, headers=admin,
                         timeout=10)
        assert resp.status_code == 201
        device = {"Authorization": f"Bearer {resp.json()['token']}"}
        body = gzip.compress(json.dumps(batch("gw1", [aggregate("gw1"), alert("gw1")])).encode())
        headers = {**device, "Content-Type": "application/json", "Content-Encoding": "gzip"}
        first = http.post(f"{base}/v1/ingest", data=body, headers=headers, timeout=10)
        assert first.status_code == 200, first.text
        assert [r["status"] for r in first.json()["results"]] == ["accepted", "accepted"]
        again = http.post(f"{base}/v1/ingest", data=body, headers=headers, timeout=10)
        assert [r["status"] for r in again.json()["results"]] == ["duplicate", "duplicate"]
        for bad, status in ((b"\x1f\x8b\x08garbage", 400), (body[:-8], 400)):
            resp = http.post(f"{base}/v1/ingest", data=bad, headers=headers, timeout=10)
            assert resp.status_code == status
            assert resp.json()["error"] == "bad_request"
        items = http.get(f"{base}/v1/devices/gw1/aggregates", headers=device, timeout=10)
        assert len(items.json()["items"]) == 1
        listed = http.get(f"{base}/v1/devices", headers=admin, timeout=10).json()["devices"]
        assert listed[0]["backlog"] == {"alerts": 2, "aggregates": 7}
        metrics = http.get(f"{base}/metrics", timeout=10).text
        assert 'fleet_ingest_records_total{kind="alert",status="duplicate"} 1.0' in metrics
