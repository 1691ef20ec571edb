"""benchmarks/fleet_hostile_bodies.py runs its real ``edge-fleet serve`` on ``--port`` with its
files in ``--workdir`` (kept), and without ``--workdir`` leaves nothing behind (issue 20, item 17).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.integration.fleet_peer import free_port

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "fleet_hostile_bodies.py"


def _run(tmp: Path, *args: str) -> str:
    env = {**os.environ, "TMPDIR": str(tmp)}
    out = subprocess.run([sys.executable, str(SCRIPT), "--clients", "1", "--mb", "1", *args],
                         capture_output=True, text=True, timeout=120, check=False, env=env)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_port_and_workdir_are_used_and_a_temporary_folder_is_removed(tmp_path: Path) -> None:
    port, kept, scratch = free_port(), tmp_path / "kept", tmp_path / "scratch"
    scratch.mkdir()
    out = _run(scratch, "--port", str(port), "--workdir", str(kept))
    assert "statuses={'HTTP/1.1 401 Unauthorized': 3}" in out, out
    assert (kept / "fleet" / "fleet.db").is_file()
    assert out.startswith(f"fleet http://127.0.0.1:{port} workdir {kept}\n"), out
    assert list(scratch.iterdir()) == []
    _run(scratch)  # a temporary folder under TMPDIR, removed at the end
    assert list(scratch.iterdir()) == []
