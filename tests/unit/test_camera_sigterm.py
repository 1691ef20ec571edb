"""SIGTERM to a camera-only agent (the real CLI process, a looping image folder): the shutdown
line says it stops on the signal, not that every source is exhausted (the camera thread ends on
the stop like an ended file did)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

cv2 = pytest.importorskip("cv2")

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "models" / "mtd-patchcore"


def test_sigterm_on_a_camera_only_agent_says_it_stops_on_the_signal(tmp_path: Path) -> None:
    frames = tmp_path / "frames"
    frames.mkdir()
    m = json.loads((PACKAGE / "manifest.json").read_text())["input"]
    for i in range(3):
        cv2.imwrite(str(frames / f"{i}.png"), np.full((m["height"], m["width"]), 120, np.uint8))
    config = tmp_path / "agent.toml"
    config.write_text(
        f'[agent]\nstate_dir = "{tmp_path / "state"}"\nconsole_alerts = false\n'
        '[[streams]]\nname = "cam1"\nmodel = "builtin:mtd-patchcore"\n'
        f'[streams.source]\nkind = "camera"\nfolder = "{frames}"\nfps = 5\nloop = true\n'
        "[streams.rules]\nk = 3\nn = 5\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent.cli", "run", "--config", str(config)],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env, cwd=tmp_path,
    )
    lines: list[str] = []
    running = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if "running as device" in line:
                running.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert running.wait(240), "".join(lines)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, "".join(lines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    reader.join(10)
    log = "".join(lines)
    assert "every source is exhausted" not in log, log
    assert "stopping on SIGTERM; shutting down" in log, log
    assert "stopped:" in log
