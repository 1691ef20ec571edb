"""``edge-fleet serve`` on a port another program listens on: exit 78 naming the port, before
the start-up line (uvicorn alone logged "edge-fleet on http://..." and then exited 3)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

EX_CONFIG = 78


def test_serve_on_a_taken_port_is_a_configuration_error(tmp_path: Path) -> None:
    exe = shutil.which("edge-fleet")
    cmd = [exe] if exe else [sys.executable, "-m", "fleet.cli"]
    env = {k: v for k, v in os.environ.items() if k != "EDGE_FLEET_ADMIN_TOKEN"}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [*cmd, "serve", "--db", f"sqlite:///{tmp_path / 'fleet.db'}", "--port", str(port),
             "--state-dir", str(tmp_path / "state")],
            capture_output=True, text=True, env=env, timeout=120, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == EX_CONFIG, out
    assert f"cannot listen on 127.0.0.1:{port}" in out and "--port" in out
    assert "edge-fleet on http" not in out
    assert "Traceback" not in out
