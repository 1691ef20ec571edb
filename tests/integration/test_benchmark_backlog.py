"""``benchmarks/backlog.py`` at a tiny size against a real ``edge-fleet serve``: it leaves no
work folder behind (its default one is ~900 MB at full size), and uses ``--port``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.fleet_peer import free_port

pytestmark = pytest.mark.integration

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def test_backlog_benchmark_removes_its_work_folder_and_uses_the_given_port(
    tmp_path: Path,
) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    port = free_port()
    out = subprocess.run(
        [sys.executable, str(BENCH / "backlog.py"), "--rows", "60", "--batch", "20",
         "--fleet-workers", "1", "--port", str(port)],
        env=dict(os.environ, TMPDIR=str(tmp)), capture_output=True, text=True, timeout=180,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "lost=0 duplicated=0" in out.stdout
    assert f"fleet at http://127.0.0.1:{port}" in out.stdout
    assert list(tmp.iterdir()) == []


def test_backlog_benchmark_keeps_a_given_workdir(tmp_path: Path) -> None:
    work = tmp_path / "work"
    out = subprocess.run(
        [sys.executable, str(BENCH / "backlog.py"), "--rows", "20", "--batch", "20",
         "--fleet-workers", "1", "--workdir", str(work)],
        capture_output=True, text=True, timeout=180, check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert (work / "agent.db").exists()
