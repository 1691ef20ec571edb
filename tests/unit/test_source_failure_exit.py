"""An agent whose sources have all ended exits 0 when each reached the end of its input and
``EX_UNAVAILABLE`` (69) when at least one failed for good, with one ERROR line naming it, so
systemd's ``Restart=on-failure`` restarts a gateway whose camera file cannot be read instead of
counting it as done. Real files (a text file named .avi, a folder of corrupt images), the real
CLI process and the real agent; the failing sensor source is a small fake raising the fatal
error the serial source raises when pyserial rejects its settings."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

cv2 = pytest.importorskip("cv2")

from agent.app import Agent  # noqa: E402
from agent.config.loader import parse_config  # noqa: E402
from agent.errors import ConfigError  # noqa: E402
from agent.exitcodes import EX_UNAVAILABLE  # noqa: E402
from agent.metrics import Metrics  # noqa: E402
from agent.services.camera import CameraStream  # noqa: E402
from agent.sources.base import Emit, Reject  # noqa: E402
from agent.sources.camera import CameraConfig, CameraSource  # noqa: E402
from agent.sources.registry import build_source  # noqa: E402
from agent.sources.simulator import SimulatorConfig  # noqa: E402
from agent.systemd import Notifier  # noqa: E402

CAMERA = """
[agent]
state_dir = "{state}"
console_alerts = false
[[streams]]
name = "cam1"
model = "builtin:mtd-patchcore"
[streams.source]
kind = "camera"
{source}
[streams.rules]
k = 3
n = 5
"""


def test_cli_exits_69_when_the_only_camera_file_cannot_be_read(tmp_path: Path) -> None:
    video = tmp_path / "line1.avi"
    video.write_text("this is not a video\n")
    config = tmp_path / "agent.toml"
    config.write_text(CAMERA.format(state=tmp_path / "state", source=f'path = "{video}"'))
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
    done = subprocess.run(
        [sys.executable, "-m", "agent.cli", "run", "--config", str(config)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300, check=False,
    )
    assert done.returncode == EX_UNAVAILABLE == 69, done.stderr[-3000:]
    ended = [line for line in done.stderr.splitlines() if "every source has ended" in line]
    assert len(ended) == 1, done.stderr[-3000:]
    assert "ERROR" in ended[0] and "1 failed for good" in ended[0]
    assert "cam1" in ended[0] and "line1.avi" in ended[0] and "exit code 69" in ended[0]
    assert "every source is exhausted" not in done.stderr


def test_a_folder_without_one_readable_image_fails_for_good(tmp_path: Path) -> None:
    folder = tmp_path / "frames"
    folder.mkdir()
    for i in range(3):
        (folder / f"{i}.png").write_bytes(b"\x89PNG not really")
    text = CAMERA.format(state=tmp_path / "state", source=f'folder = "{folder}"')
    metrics = Metrics()
    agent = Agent(parse_config(text, env={}), metrics, console=None, notifier=Notifier(""))
    assert agent.run() == EX_UNAVAILABLE
    cam = agent.cameras["cam1"]
    assert cam.failed and not cam.exhausted and cam.rejected == 3
    assert cam.error is not None and "no readable frame" in cam.error
    health = agent.monitor.report().to_json()["components"]
    assert isinstance(health, dict)
    assert health["source:cam1"]["state"] == "red"
    assert "failed for good" in health["source:cam1"]["reason"]
    assert metrics.registry.get_sample_value(
        "edge_agent_records_rejected_total", {"stream": "cam1", "reason": "unreadable_image"}) == 3


def test_a_looped_folder_without_a_readable_image_fails_instead_of_spinning(
        tmp_path: Path) -> None:
    (tmp_path / "0.png").write_bytes(b"")
    src = CameraSource(CameraConfig(folder=str(tmp_path), loop=True), "cam")
    stop = threading.Event()
    stream = CameraStream(src, None, None, lambda e: None, stop)  # type: ignore[arg-type]
    stream.start()
    stream.join(30.0)
    stop.set()
    assert stream.done and stream.failed and src.rejected == 1


def test_an_unexpected_exception_fails_the_camera_stream(caplog: pytest.LogCaptureFixture) -> None:
    def factory(config: CameraConfig) -> CameraSource:
        raise RuntimeError("backend exploded")

    src = CameraSource(CameraConfig(url="rtsp://camera.invalid/s"), "cam",
                       capture_factory=factory)  # type: ignore[arg-type]
    stop = threading.Event()
    stream = CameraStream(src, None, None, lambda e: None, stop)  # type: ignore[arg-type]
    with caplog.at_level(logging.ERROR, logger="agent.camera"):
        stream.start()
        stream.join(30.0)
    stop.set()
    assert stream.done and stream.failed and stream.error == "backend exploded"
    assert any("failed for good" in r.getMessage() and r.exc_info for r in caplog.records)


class _BadSettingsSource:
    """A sensor source that fails for good at once, as the serial source does (ConfigError)
    when pyserial rejects the port settings."""

    def __init__(self, stream: str, channels: tuple[str, ...]) -> None:
        self.stream = stream
        self.channels = channels

    def run(self, emit: Emit, reject: Reject, stop: threading.Event) -> None:
        raise ConfigError("serial port settings rejected: bad parity", stream=self.stream)


SENSORS = """
[agent]
state_dir = "{state}"
console_alerts = false
[[streams]]
name = "pump1"
[streams.source]
kind = "simulator"
speed = 0
duration_s = 600
[[streams]]
name = "pump2"
[streams.source]
kind = "simulator"
speed = 0
duration_s = 600
"""


def test_sensor_sources_same_semantics(tmp_path: Path) -> None:
    channels = build_source(SimulatorConfig(), "pump2").channels
    config = parse_config(SENSORS.format(state=tmp_path / "a"), env={})
    # both simulations end: exit 0
    agent = Agent(config, Metrics(), console=None, notifier=Notifier(""))
    assert agent.run() == 0
    # one ends, one fails for good: the agent used to wait forever (red, watchdog withheld)
    config = parse_config(SENSORS.format(state=tmp_path / "b"), env={})
    agent = Agent(config, Metrics(), console=None, notifier=Notifier(""),
                  sources={"pump2": _BadSettingsSource("pump2", channels)})
    result: list[int] = []
    runner = threading.Thread(target=lambda: result.append(agent.run()), daemon=True)
    runner.start()
    runner.join(120.0)
    if runner.is_alive():
        agent.request_stop("test timeout")
        runner.join(30.0)
    assert result == [EX_UNAVAILABLE]
    assert agent.streams["pump1"].supervisor.done
    assert isinstance(agent.streams["pump2"].supervisor.error, ConfigError)
