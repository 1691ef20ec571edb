"""One agent, one config: a camera stream (image folder) beside a simulated sensor stream."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest

cv2 = pytest.importorskip("cv2")

from agent.app import Agent  # noqa: E402
from agent.config.loader import parse_config  # noqa: E402
from agent.metrics import Metrics  # noqa: E402
from agent.systemd import Notifier  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "models" / "mtd-patchcore"


def _write_frames(folder: Path) -> None:
    """10 good tiles (the package's golden images) then 10 with a drawn crack."""
    folder.mkdir()
    m = json.loads((PACKAGE / "manifest.json").read_text())["input"]
    g = np.load(PACKAGE / "golden.npy")
    good = [np.clip(np.round((x[0] * m["std"][0] + m["mean"][0]) * 255), 0, 255)
            .astype(np.uint8) for x in g]
    for i in range(20):
        img = good[i % len(good)].copy()
        if i >= 10:
            pts = np.array([[60, 20], [75, 70], [70, 120], [85, 170]], np.int32)
            cv2.polylines(img, [pts], False, 15, 2)
        cv2.imwrite(str(folder / f"{i:03d}.png"), img)


def test_camera_and_sensor_streams_side_by_side(tmp_path: Path) -> None:
    _write_frames(tmp_path / "frames")
    text = f"""
[agent]
device_id = "gw1"
state_dir = "{tmp_path / 'state'}"
console_alerts = false

[[streams]]
name = "pump"
[streams.source]
kind = "simulator"
speed = 0
duration_s = 1500
[[streams.source.faults]]
kind = "offset"
channel = "Volume Flow RateRMS"
start_s = 600
duration_s = 300
magnitude = -15.0

[[streams]]
name = "cam1"
model = "builtin:mtd-patchcore"
[streams.source]
kind = "camera"
folder = "{tmp_path / 'frames'}"  # fps = 0 (default): every image is scored, none dropped
[streams.rules]
k = 3
n = 5
cooldown_s = 0
"""
    metrics = Metrics()
    agent = Agent(parse_config(text, env={}), metrics, console=None, notifier=Notifier(""))
    assert set(agent.streams) == {"pump"} and set(agent.cameras) == {"cam1"}
    assert agent.run() == 0  # both inputs are finite: the agent stops by itself
    cam = agent.cameras["cam1"]
    assert cam.scored == 20 and cam.errors == 0
    # the camera stream is a component of /healthz and its counters are exported
    health = agent.monitor.report().to_json()["components"]
    assert isinstance(health, dict) and "source:cam1" in health and "source:pump" in health
    assert metrics.registry.get_sample_value(
        "edge_agent_camera_frames_scored_total", {"stream": "cam1"}) == 20.0
    assert cam.source.dropped == 0 and cam.source.abandoned == 0
    for reason in ("newer_frame", "stopped", "score_error"):
        assert metrics.registry.get_sample_value(
            "edge_agent_camera_frames_dropped_total", {"stream": "cam1", "reason": reason}) == 0
    db = sqlite3.connect(tmp_path / "state" / "agent.db")
    alerts = dict(db.execute("select stream, count(*) from alerts group by stream").fetchall())
    assert alerts.get("cam1") == 1  # one episode: the cracked frames
    assert alerts.get("pump", 0) >= 1  # the injected flow drop
    rows = db.execute("select stream, sum(count), sum(windows), max(max_score) from aggregates "
                      "group by stream").fetchall()
    by = {r[0]: r for r in rows}
    assert by["cam1"][1] == 20 and by["cam1"][2] == 20
    assert by["cam1"][3] > agent.cameras["cam1"].package.threshold
    assert by["pump"][1] > 1000
