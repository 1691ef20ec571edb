"""The benchmarks' work folders are removed at the end (also after an error or SIGTERM), and
every benchmark that starts a peer takes ``--port`` and ``--workdir``."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _workspace() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_workspace", BENCH / "workspace.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_temporary_work_folder_is_removed_after_success_error_and_sigterm(
    tmp_path: Path,
) -> None:
    ws = _workspace()
    before = signal.getsignal(signal.SIGTERM)
    seen: list[Path] = []
    with ws.workspace(None, "bench-", tmp_path) as d:
        (d / "agent.db").write_bytes(b"x" * 1000)
        seen.append(d)
    with pytest.raises(RuntimeError), ws.workspace(None, "bench-", tmp_path) as d:
        seen.append(d)
        (d / "fleet").mkdir()
        raise RuntimeError("the fleet did not start")
    with pytest.raises(SystemExit) as exc, ws.workspace(None, "bench-", tmp_path) as d:
        seen.append(d)
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs in this (the main) thread
    assert exc.value.code == 128 + signal.SIGTERM
    assert len(set(seen)) == 3
    assert all(p.parent == tmp_path for p in seen)
    assert list(tmp_path.iterdir()) == []
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_given_workdir_is_created_and_kept(tmp_path: Path) -> None:
    ws = _workspace()
    mine = tmp_path / "keep" / "here"
    with ws.workspace(mine, "bench-") as d:
        assert d == mine
        (d / "agent.db").write_text("x")
    assert (mine / "agent.db").exists()
    assert ws.pick_port(4321) == 4321
    assert 0 < ws.pick_port(None) < 65536


@pytest.mark.parametrize("script", ["backlog.py", "fleet_hostile_bodies.py", "fleet_ingest.py",
                                    "fleet_scale.py", "ingest.py", "latency.py", "skab_loop.py"])
def test_every_benchmark_that_starts_a_peer_takes_port_and_workdir(script: str) -> None:
    if script in ("fleet_ingest.py", "fleet_scale.py"):  # the fleet extra (CI's Python 3.10
        # run has the test one)
        pytest.importorskip("psycopg")
    out = subprocess.run([sys.executable, str(BENCH / script), "--help"], capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert "--port" in out.stdout and "--workdir" in out.stdout
