"""Operator CLI smoke test against a real ``edge-fleet serve`` subprocess (SQLite and
PostgreSQL): keys generate → model sign → model push → rollout create --canary → show →
promote."""

from __future__ import annotations

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

from cloud_sync.package import pack
from fleet.cli import main as fleet_main
from fleet.settings import Settings
from tests.fleet.conftest import wait_healthy
from tests.fleet.model_pkg import SHIPPED

EXE = shutil.which("edge-fleet")
CMD = [EXE] if EXE else [sys.executable, "-m", "fleet.cli"]
ENV = {k: v for k, v in os.environ.items() if k not in ("EDGE_FLEET_ADMIN_TOKEN", "EDGE_FLEET_URL")}


def cli(*args: str | Path, ok: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([*CMD, *map(str, args)], check=False, capture_output=True, text=True,
                          env=ENV, timeout=60)
    if ok:
        assert proc.returncode == 0, proc.stderr
    return proc


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    out = cli("keys", "generate", "--out", tmp_path / "keys", "--key-id", "ops").stdout
    assert "key id ops" in out
    assert (tmp_path / "keys" / "ops.key").stat().st_mode & 0o777 == 0o600
    trusted = tmp_path / "trusted"
    trusted.mkdir()
    shutil.copy(tmp_path / "keys" / "ops.pub", trusted)
    return tmp_path / "keys"


@pytest.fixture
def server(
    settings: Settings, engine: Engine, tmp_path: Path, keys: Path
) -> Iterator[tuple[str, Path]]:
    """``edge-fleet serve --trusted-keys``; yields (base URL, admin token file)."""
    port = _free_port()
    state = tmp_path / "state"
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*CMD, "serve", "--db", settings.db_url, "--port", str(port), "--state-dir",
             str(state), "--trusted-keys", str(tmp_path / "trusted"), "--signing-key",
             str(keys / "ops.key")], stdout=out, stderr=subprocess.STDOUT, env=ENV,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, proc, log, 30)
        yield base, state / "admin.token"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert "Traceback" not in log.read_text()


def test_operator_rollout_flow(server: tuple[str, Path], keys: Path, tmp_path: Path) -> None:
    base, token_file = server
    http = ["--url", base, "--admin-token-file", token_file]
    admin = {"Authorization": f"Bearer {token_file.read_text().strip()}"}
    for i in range(1, 5):
        r = requests.post(f"{base}/v1/devices", json={"device_id": f"gw{i}", "tags": ["line1"]},
                          headers=admin, timeout=10)
        assert r.status_code == 201
    pkg = tmp_path / "skab-wstat-2"
    shutil.copytree(SHIPPED, pkg)
    manifest = json.loads((pkg / "manifest.json").read_text())
    manifest["version"] = 2
    (pkg / "manifest.json").write_text(json.dumps(manifest, indent=1))

    refused = cli("model", "push", pkg, *http, ok=False)  # unsigned
    assert refused.returncode == 1 and "SignatureError" in refused.stderr

    assert "signed skab-wstat@2 with key ops" in cli("model", "sign", pkg, "--key",
                                                     keys / "ops.key").stdout
    assert "pushed skab-wstat@2" in cli("model", "push", pkg, *http).stdout
    listed = cli("model", "list", *http).stdout
    assert listed.splitlines()[0].split()[:3] == ["NAME", "VERSION", "SIZE"]
    assert "skab-wstat  2" in listed

    created = cli("rollout", "create", "skab-wstat", "2", "--tag", "line1", "--canary", "25",
                  *http).stdout
    assert "rollout 1: skab-wstat@2  state canary" in created
    shown = cli("rollout", "show", "1", *http).stdout
    rows = [ln.split() for ln in shown.splitlines() if ln.startswith("gw")]
    assert len(rows) == 4 and sum(r[1] == "yes" for r in rows) == 1  # one canary of four
    assert "DEVICE" in shown and "CANARY" in shown

    stale = cli("rollout", "pause", "1", "--expect", "paused", *http, ok=False)
    assert stale.returncode == 1 and "409" in stale.stderr and "canary, not paused" in stale.stderr
    promoted = cli("rollout", "promote", "1", "--expect", "canary", *http).stdout
    assert "state promoted" in promoted
    rows = [ln.split() for ln in promoted.splitlines() if ln.startswith("gw")]
    assert all("yes" in r for r in rows)
    assert "promoted" in cli("rollout", "list", *http).stdout
    again = cli("rollout", "promote", "1", *http, ok=False)
    assert again.returncode == 1 and "409" in again.stderr
    no_token = subprocess.run([*CMD, "model", "list", "--url", base], check=False,
                              capture_output=True, text=True, env=ENV, timeout=60)
    assert no_token.returncode == 78


def test_model_pack_writes_the_archive_push_sends(tmp_path: Path) -> None:
    """``model pack`` (for a push from the web console) writes the same bytes as ``pack``."""
    out = tmp_path / "pkg.tar.gz"
    done = cli("model", "pack", SHIPPED, "--out", out)
    assert f"packed {out} sha256 " in done.stdout
    pack(SHIPPED, tmp_path / "ref.tar.gz")
    assert out.read_bytes() == (tmp_path / "ref.tar.gz").read_bytes()
    broken = tmp_path / "broken"
    broken.mkdir()
    assert cli("model", "pack", broken, "--out", tmp_path / "x.tar.gz", ok=False).returncode == 78


def test_fleet_url_variable_is_in_the_help(capsys: pytest.CaptureFixture[str]) -> None:
    """The operator commands that speak HTTP say where they go and how to change it."""
    for argv in (["--help"], ["model", "--help"], ["model", "push", "--help"],
                 ["rollout", "--help"], ["rollout", "create", "--help"]):
        with pytest.raises(SystemExit):
            fleet_main(argv)
        assert "$EDGE_FLEET_URL" in " ".join(capsys.readouterr().out.split()), argv
