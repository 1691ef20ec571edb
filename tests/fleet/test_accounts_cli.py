"""``edge-fleet user|token`` on a real SQLite file: accounts made on the command line log in and
act over the API with the roles they were given; every change is in the audit log."""

from __future__ import annotations

import io
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from fastapi.testclient import TestClient

from fleet.app import create_app
from fleet.cli import EX_CONFIG, EX_REFUSED, main
from fleet.settings import Settings
from tests.fleet.accounts_util import PASSWORD, login
from tests.fleet.conftest import wait_healthy


def test_user_and_token_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = f"sqlite:///{tmp_path / 'fleet.db'}"
    common = ["--db", db, "--state-dir", str(tmp_path)]
    pw = tmp_path / "pw"
    pw.write_text(PASSWORD + "\n")
    assert main(["user", "add", "root", "--role", "admin", "--password-file", str(pw),
                 "--create-db", *common]) == 0
    assert main(["user", "add", "bot", "--role", "operator", "--no-password", *common]) == 0
    assert main(["user", "add", "bot", "--role", "viewer", "--no-password", *common]) == \
        EX_REFUSED
    short = tmp_path / "short"
    short.write_text("abc")
    assert main(["user", "add", "x", "--role", "viewer", "--password-file", str(short),
                 *common]) == EX_REFUSED
    assert main(["user", "add", "y", "--role", "viewer", "--password-file",
                 str(tmp_path / "missing"), *common]) == EX_CONFIG
    capsys.readouterr()
    assert main(["token", "create", "--user", "bot", "--role", "admin", *common]) == EX_REFUSED
    assert main(["token", "create", "--user", "bot", "--role", "viewer", "--label", "ci",
                 *common]) == 0
    token = capsys.readouterr().out.strip()
    assert token.startswith("efu_")
    out_file = tmp_path / "op.token"
    assert main(["token", "create", "--user", "bot", "--role", "operator", "--token-file",
                 str(out_file), *common]) == 0
    assert out_file.stat().st_mode & 0o777 == 0o600
    capsys.readouterr()
    assert main(["token", "list", *common]) == 0
    listing = capsys.readouterr().out
    assert "ci" in listing and token not in listing

    settings = Settings(db_url=db, admin_token="", state_dir=tmp_path)
    with TestClient(create_app(settings)) as client:
        viewer = {"Authorization": f"Bearer {token}"}
        operator = {"Authorization": f"Bearer {out_file.read_text().strip()}"}
        assert client.get("/v1/devices", headers=viewer).status_code == 200
        assert client.post("/v1/devices", json={"device_id": "gw1"},
                           headers=viewer).status_code == 403
        assert client.post("/v1/devices", json={"device_id": "gw1"},
                           headers=operator).status_code == 201
        login(client, "root")
        assert client.get("/v1/users").status_code == 200
        assert main(["user", "set", "root", "--disable", *common]) == 0
        assert client.get("/v1/users").status_code == 401  # its sessions ended
        assert main(["token", "revoke", "1", *common]) == 0
        assert client.get("/v1/devices", headers=viewer).status_code == 401
        entries = client.get("/v1/audit", headers=operator).json()["entries"]
    actions = [(e["action"], e["via"], e["target"]) for e in reversed(entries)]
    assert [a for a in actions if a[1] == "cli"] == [
        ("user.create", "cli", "root"), ("user.create", "cli", "bot"),
        ("token.create", "cli", "bot"), ("token.create", "cli", "bot"),
        ("user.change", "cli", "root"), ("token.revoke", "cli", "bot"),
    ]
    assert ("device.enroll", "token", "gw1") in actions


def test_serve_without_the_bootstrap_token(tmp_path: Path) -> None:
    """``serve --no-admin-token`` generates no token file and accepts only accounts."""
    db = f"sqlite:///{tmp_path / 'fleet.db'}"
    state = tmp_path / "state"
    pw = tmp_path / "pw"
    pw.write_text(PASSWORD)
    assert main(["user", "add", "root", "--role", "admin", "--password-file", str(pw),
                 "--db", db, "--state-dir", str(state), "--create-db"]) == 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = shutil.which("edge-fleet")
    cmd = [exe] if exe else [sys.executable, "-m", "fleet.cli"]
    env = {k: v for k, v in os.environ.items() if k != "EDGE_FLEET_ADMIN_TOKEN"}
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([*cmd, "serve", "--db", db, "--port", str(port), "--state-dir",
                                 str(state), "--no-admin-token"], stdout=out,
                                stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, proc, log, 60)
        assert not (state / "admin.token").exists()
        with requests.Session() as http:
            assert http.get(f"{base}/v1/devices", timeout=10).status_code == 401
            resp = http.post(f"{base}/v1/session", json={"username": "root",
                                                         "password": PASSWORD}, timeout=10)
            assert resp.status_code == 200, resp.text
            assert http.get(f"{base}/v1/users", timeout=10).status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert "Traceback" not in log.read_text()


def test_user_add_without_a_terminal_says_to_use_a_password_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The first admin from a script or CI: no prompt to hang on, the way to do it instead."""
    common = ["--db", f"sqlite:///{tmp_path / 'fleet.db'}", "--state-dir", str(tmp_path),
              "--create-db"]
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # not a terminal
    assert main(["user", "add", "me", "--role", "admin", *common]) == EX_CONFIG
    err = capsys.readouterr().err
    assert err == (
        "edge-fleet: configuration error: no terminal to ask the password: use --password-file "
        "FILE (the file holds the password; a final newline is dropped), e.g. `edge-fleet user "
        "add NAME --role admin --password-file FILE`; or --no-password for an account that uses "
        "API tokens only\n")
    assert main(["user", "list", *common]) == 0
    assert "me" not in capsys.readouterr().out.split()  # nothing created

