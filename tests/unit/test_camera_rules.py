"""Camera rule defaults: each anomalous image of a folder alerts; a video alerts once per run of
anomalous frames; keys given in [streams.rules] win (real images and a real video in tmp_path,
scored by the shipped image model)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest

cv2 = pytest.importorskip("cv2")
pytest.importorskip("PIL")

from agent.app import Agent  # noqa: E402
from agent.config.loader import parse_config  # noqa: E402
from agent.config.schema import RulesConfig  # noqa: E402
from agent.metrics import Metrics  # noqa: E402
from agent.pipeline.rules import AlertRules, RuleParams  # noqa: E402
from agent.services.camera_rules import (  # noqa: E402
    FOLDER_RULES,
    STREAM_RULES,
    camera_rule_params,
)
from agent.sources.camera import CameraConfig  # noqa: E402
from agent.systemd import Notifier  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "models" / "mtd-patchcore"
#: good (False) and cracked (True) parts in the order they are written
PATTERN = [False, True, True, False, False, True, False, True, True, True, False, False]


def _images() -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The package's golden good tiles, and the same with a drawn crack."""
    m = json.loads((PACKAGE / "manifest.json").read_text())["input"]
    good = [np.clip(np.round((x[0] * m["std"][0] + m["mean"][0]) * 255), 0, 255)
            .astype(np.uint8) for x in np.load(PACKAGE / "golden.npy")]
    cracked = []
    for tile in good:
        img = tile.copy()
        pts = np.array([[60, 20], [75, 70], [70, 120], [85, 170]], np.int32)
        cv2.polylines(img, [pts], False, 15, 2)
        cracked.append(img)
    return good, cracked


def run_camera_agent(tmp_path: Path, source: str, rules: str = "") -> Agent:
    """Run an agent with one camera stream ``cam1`` (``source``: the camera source's keys;
    ``rules``: an optional ``[streams.rules]`` table) on ``builtin:mtd-patchcore`` until its
    input ends, state in ``tmp_path/state``; asserts it exited 0."""
    text = f"""
[agent]
device_id = "gw1"
state_dir = "{tmp_path / 'state'}"
console_alerts = false
[[streams]]
name = "cam1"
model = "builtin:mtd-patchcore"
[streams.source]
kind = "camera"
{source}
{rules}
"""
    agent = Agent(parse_config(text, env={}), Metrics(), console=None, notifier=Notifier(""))
    assert agent.run() == 0
    return agent


def _alerts(tmp_path: Path, source: str, rules: str = "") -> int:
    agent = run_camera_agent(tmp_path, source, rules)
    assert agent.cameras["cam1"].scored == len(PATTERN)
    db = sqlite3.connect(tmp_path / "state" / "agent.db")
    try:
        return int(db.execute("select count(*) from alerts where "
                              "json_extract(payload, '$.event') = 'raised'").fetchone()[0])
    finally:
        db.close()


def test_folder_defaults_alert_on_every_anomalous_image(tmp_path: Path) -> None:
    good, cracked = _images()
    (tmp_path / "parts").mkdir()
    for i, bad in enumerate(PATTERN):
        img = (cracked if bad else good)[i % len(good)]
        assert cv2.imwrite(str(tmp_path / "parts" / f"{i:03d}.png"), img)
    assert _alerts(tmp_path, f'folder = "{tmp_path / "parts"}"') == sum(PATTERN)  # 6


def test_folder_with_explicit_rules_keeps_them(tmp_path: Path) -> None:
    good, cracked = _images()
    (tmp_path / "parts").mkdir()
    for i, bad in enumerate(PATTERN):
        img = (cracked if bad else good)[i % len(good)]
        assert cv2.imwrite(str(tmp_path / "parts" / f"{i:03d}.png"), img)
    # the sensor-style cooldown given explicitly: all frames are seconds apart at most (stream
    # time), so one alert
    rules = "[streams.rules]\nk = 1\nn = 1\ncooldown_s = 3600\nclear_windows = 1"
    assert _alerts(tmp_path, f'folder = "{tmp_path / "parts"}"', rules) == 1


def test_video_defaults_alert_once_per_run_of_anomalous_frames(tmp_path: Path) -> None:
    good, cracked = _images()
    path = tmp_path / "line.avi"
    h, w = good[0].shape
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 10.0, (w, h))
    assert writer.isOpened()
    for i, bad in enumerate(PATTERN):
        writer.write(cv2.cvtColor((cracked if bad else good)[i % len(good)], cv2.COLOR_GRAY2BGR))
    writer.release()
    runs = sum(1 for i, bad in enumerate(PATTERN) if bad and (i == 0 or not PATTERN[i - 1]))
    assert _alerts(tmp_path, f'path = "{path}"') == runs  # 3


def test_defaults_by_input_and_explicit_keys_win() -> None:
    folder, video = CameraConfig(folder="f"), CameraConfig(path="v.avi")
    assert camera_rule_params(RulesConfig(), folder) == FOLDER_RULES
    assert camera_rule_params(RulesConfig(), video) == STREAM_RULES
    assert camera_rule_params(RulesConfig(), CameraConfig(url="rtsp://c/1")) == STREAM_RULES
    # a table with any key wins whole, the keys it leaves out at the sensor defaults (as before)
    assert camera_rule_params(RulesConfig(cooldown_s=30.0), video) == RuleParams(7, 10, 0.9, 5,
                                                                                 30.0)
    assert camera_rule_params(RulesConfig(k=3, n=5), folder) == RuleParams(3, 5, 0.9, 5, 60.0)


def test_clear_windows_0_alerts_on_every_window_above() -> None:
    r = AlertRules(RuleParams(k=1, n=1, clear_ratio=1.0, clear_windows=0, cooldown_s=0))
    assert [r.update(s, 1.0, t) for t, s in enumerate([2, 2, 0, 2, 1, 3])] == [
        True, True, False, True, False, True]
    r = AlertRules(STREAM_RULES)
    assert [r.update(s, 1.0, t) for t, s in enumerate([2, 2, 0, 2, 1, 3])] == [
        True, False, False, True, False, False]
