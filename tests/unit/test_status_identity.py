"""Who answers on the metrics port: ``/healthz`` names its agent, ``status --config`` checks it,
and a port already taken at start is a config problem (exit 78), not a silent stranger."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread

import pytest
from prometheus_client import CollectorRegistry

from agent import __version__, cli
from agent.health import Component, Report
from agent.httpd import OpsServer

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def gw2() -> Iterator[OpsServer]:
    """An agent ``gw2`` serving /healthz on a free port."""
    server = OpsServer(CollectorRegistry(), lambda: Report((Component("pipeline", "green"),), 1.0),
                       identity=lambda: {"device_id": "gw2", "version": __version__}).start()
    yield server
    server.stop()


def _config(path: Path, device: str, port: int) -> Path:
    path.write_text(f'[agent]\ndevice_id = "{device}"\nstate_dir = "{path.parent / "state"}"\n'
                    f"console_alerts = false\nmetrics_port = {port}\n"
                    '[[streams]]\nname = "demo"\n[streams.source]\nkind = "simulator"\n')
    return path


def test_healthz_names_the_agent(gw2: OpsServer) -> None:
    with urllib.request.urlopen(f"http://127.0.0.1:{gw2.port}/healthz", timeout=10) as resp:
        body = json.loads(resp.read())
    assert (body["device_id"], body["version"], body["status"]) == ("gw2", __version__, "green")


def test_status_of_the_configured_agent(gw2: OpsServer, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _config(tmp_path / "gw2.toml", "gw2", gw2.port)
    assert cli.main(["status", "--config", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == (
        f"edge-agent at http://127.0.0.1:{gw2.port}: GREEN (device_id gw2, version {__version__})")


def test_status_says_when_another_agent_answers(gw2: OpsServer, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _config(tmp_path / "gw1.toml", "gw1", gw2.port)
    assert cli.main(["status", "--config", str(cfg)]) == cli.STATUS_OTHER_AGENT == 4
    captured = capsys.readouterr()
    assert captured.out == ""  # not a single GREEN line about the other agent
    assert "another agent answers (device_id 'gw2', not 'gw1'" in captured.err
    assert "[agent] metrics_port" in captured.err
    # --url asks whoever is there, on purpose: no device to compare
    assert cli.main(["status", "--url", f"http://127.0.0.1:{gw2.port}"]) == 0


def test_status_of_an_agent_naming_no_device(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """An agent from before /healthz named its device: a warning, then its health."""
    old = OpsServer(CollectorRegistry(), lambda: Report((Component("pipeline", "green"),), 1.0))
    old.start()
    try:
        cfg = _config(tmp_path / "gw1.toml", "gw1", old.port)
        assert cli.main(["status", "--config", str(cfg)]) == 0
    finally:
        old.stop()
    assert "names no device_id; cannot check it is 'gw1'" in capsys.readouterr().err


def test_run_with_the_metrics_port_taken_is_a_config_error(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = int(taken.getsockname()[1])
        cfg = _config(tmp_path / "agent.toml", "gw1", port)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        out = subprocess.run([sys.executable, "-m", "agent.cli", "run", "--config", str(cfg)],
                             capture_output=True, text=True, timeout=120, check=False, env=env)
    assert out.returncode == 78, out.stderr
    assert (f"{cfg}: agent.metrics_port: 127.0.0.1:{port} is already in use (another agent, "
            "or another program): set [agent] metrics_port to a free port") in out.stderr


def test_status_of_another_services_healthz_is_no_health_report(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``status --url`` pointed at edge-fleet (``/healthz`` answers ``{"status": "ok"}``)
    printed ``edge-agent at ...: OK`` and exited 2 (red)."""
    class FleetLike(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b'{"status":"ok"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), FleetLike)
    Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert cli.main(["status", "--url", url]) == cli.STATUS_UNREACHABLE == 3
    finally:
        server.shutdown()
        server.server_close()
    captured = capsys.readouterr()
    assert "not an edge-agent health report" in captured.err
    assert "OK" not in captured.out
