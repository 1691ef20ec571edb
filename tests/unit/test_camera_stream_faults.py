"""A camera stream says what is wrong once: a camera that does not open, rejected inputs."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

cv2 = pytest.importorskip("cv2")

from agent.errors import SourceError  # noqa: E402
from agent.metrics import Metrics  # noqa: E402
from agent.services.camera import CameraStream  # noqa: E402
from agent.sources.camera import CameraConfig, CameraSource  # noqa: E402


def _stream(source: CameraSource, metrics: Metrics, stop: threading.Event) -> CameraStream:
    # pipeline and package are not reached: no frame is scored in these tests
    return CameraStream(source, None, None, lambda e: None, stop,  # type: ignore[arg-type]
                        metrics=metrics)


def _count(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_a_camera_that_never_opens_is_one_warning_and_counted(
        caplog: pytest.LogCaptureFixture) -> None:
    opens: list[int] = []
    stop = threading.Event()

    def factory(config: CameraConfig) -> Any:
        opens.append(1)
        if len(opens) >= 6:
            stop.set()
        raise SourceError("camera capture does not open", target="rtsp://camera.invalid/s")

    cfg = CameraConfig(url="rtsp://camera.invalid/s", reconnect_initial_s=0.01,
                       reconnect_max_s=0.02)
    metrics = Metrics()
    cam = _stream(CameraSource(cfg, "cam1", capture_factory=factory), metrics, stop)
    with caplog.at_level(logging.INFO, logger="agent.camera"):
        cam.start()
        cam.join(5.0)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(opens) >= 6
    assert len(warnings) == 1 and "does not open" in warnings[0].getMessage()
    assert "rtsp://camera.invalid/s" in warnings[0].getMessage()
    assert cam.in_outage
    assert _count(metrics, "edge_agent_source_errors_total", stream="cam1") == len(opens)


def test_rejected_images_are_counted_and_logged_once_per_reason(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    for i in range(4):
        (tmp_path / f"{i}-bad.png").write_bytes(b"")
    cv2.imwrite(str(tmp_path / "9-good.png"), np.zeros((8, 8), np.uint8))
    metrics = Metrics()
    stop = threading.Event()
    source = CameraSource(CameraConfig(folder=str(tmp_path), fps=100.0), "cam1")
    cam = _stream(source, metrics, stop)
    cam.on_frame = lambda frame: None  # type: ignore[method-assign]  # no model needed
    with caplog.at_level(logging.INFO, logger="agent.camera"):
        cam.start()
        cam.join(5.0)
    assert cam.done and cam.rejected == 4
    assert _count(metrics, "edge_agent_records_rejected_total", stream="cam1",
                  reason="unreadable_image") == 4
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "0-bad.png" in warnings[0]
    ended = [r.getMessage() for r in caplog.records if "input ended" in r.getMessage()]
    assert ended and "4 inputs rejected" in ended[0]
