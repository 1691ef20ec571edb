"""Camera streams in /healthz, the watchdog decision and /metrics (real source, monitor, store
and HTTP server; the capture is a fake camera that stalls, the model a fake pipeline)."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("cv2")

from agent.errors import SourceError
from agent.health import camera_stall_policy
from agent.httpd import OpsServer
from agent.metrics import Metrics
from agent.monitor import Monitor, WatchedCamera
from agent.pipeline.image import ImageOutput
from agent.records import Frame
from agent.services.camera import CameraStream
from agent.sources.camera import CameraConfig, CameraSource
from agent.store.sqlite import Store
from agent.systemd import Notifier


class _Notifier(Notifier):
    def __init__(self) -> None:
        super().__init__("")
        self.pings = 0

    def watchdog(self) -> bool:
        self.pings += 1
        return True

    def status(self, status: str) -> bool:
        return True


class _Pipeline:
    """Scores every frame 1.0; blocks on frame ``block_at`` until ``release`` is set."""

    def __init__(self, block_at: int | None = None) -> None:
        self.block_at = block_at
        self.entered = threading.Event()
        self.release = threading.Event()

    def process(self, frame: Frame) -> ImageOutput:
        if self.block_at is not None and frame.seq >= self.block_at:
            self.entered.set()
            self.release.wait(10.0)
        return ImageOutput(1.0, 2.0)


class _FramesThenSilence:
    """``good`` frames, then read() blocks like an RTSP camera that went silent."""

    def __init__(self, good: int, unblock: threading.Event) -> None:
        self.good, self.n, self._unblock = good, 0, unblock

    def read(self) -> tuple[bool, Any]:
        if self.good and self.n >= self.good:
            self._unblock.wait(10.0)
            return False, None
        self.n += 1
        time.sleep(0.01)
        return True, np.full((16, 16), self.n % 255, np.uint8)

    def release(self) -> None:
        pass


def _wait(cond: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return int(r.status), r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _monitor(tmp_path: Path, metrics: Metrics, cam: CameraStream, cfg: CameraConfig,
             notifier: Notifier, monotonic: Any = time.monotonic) -> tuple[Monitor, Store]:
    store = Store(tmp_path / "agent.db", time.time, metrics=metrics)
    monitor = Monitor({}, list, lambda: (0, 100), store, metrics, notifier,
                      cameras={"cam1": WatchedCamera(cam, camera_stall_policy(cfg))},
                      watchdog_interval_s=0.0, monotonic=monotonic)
    return monitor, store


def test_a_stalled_camera_is_red_with_the_reason_keeps_the_watchdog_and_is_in_metrics(
        tmp_path: Path) -> None:
    unblock = threading.Event()
    opens: list[int] = []

    def factory(config: CameraConfig) -> Any:
        opens.append(1)
        if len(opens) == 1:
            return _FramesThenSilence(3, unblock)
        raise SourceError("camera capture does not open", target="rtsp://cam.invalid/1")

    cfg = CameraConfig(url="rtsp://cam.invalid/1", stall_s=0.3, reconnect_initial_s=0.05,
                       reconnect_max_s=0.1)
    metrics, stop = Metrics(), threading.Event()
    source = CameraSource(cfg, "cam1", capture_factory=factory)
    cam = CameraStream(source, _Pipeline(), None, lambda e: None, stop,  # type: ignore[arg-type]
                       metrics=metrics)
    notifier = _Notifier()
    monitor, store = _monitor(tmp_path, metrics, cam, cfg, notifier)
    server = OpsServer(metrics.registry, monitor.report).start()
    try:
        cam.start()
        _wait(lambda: source.stalls >= 1 and len(opens) >= 3)
        report = monitor.tick()
        hcode, hbody = _get(f"http://127.0.0.1:{server.port}/healthz")
        mcode, mbody = _get(f"http://127.0.0.1:{server.port}/metrics")
    finally:
        stop.set()
        unblock.set()
        cam.join(5.0)
        server.stop()
        store.close()
    comp = next(c for c in report.components if c.name == "source:cam1")
    assert comp.state == "red" and comp.reason is not None
    # the outage began with the stall; the reason names the latest failure (the reopen)
    assert comp.reason.startswith("down for ") and "does not open" in comp.reason
    assert notifier.pings == 1  # the source reconnects by itself: the watchdog is kept
    assert hcode == 503
    body = json.loads(hbody)["components"]["source:cam1"]
    assert body["state"] == "red" and body["reason"] == comp.reason
    # real time: a frame replaced by a newer one before it was taken (a loaded machine) is
    # dropped and counted, not scored
    assert body["frames_scored"] == 3 - source.dropped >= 1
    assert body["stalls"] >= 1 and body["reconnects"] >= 1
    assert body["frame_age_s"] is not None
    text = mbody.decode()
    assert mcode == 200
    assert 'edge_agent_camera_frames_scored_total{stream="cam1"} 3.0' in text
    assert 'edge_agent_camera_stalls_total{stream="cam1"}' in text
    assert 'edge_agent_camera_reconnects_total{stream="cam1"}' in text
    assert 'edge_agent_camera_frames_dropped_total{reason="newer_frame",stream="cam1"}' in text
    assert 'edge_agent_camera_frame_age_seconds{stream="cam1"}' in text
    assert 'edge_agent_source_up{stream="cam1"} 0.0' in text
    assert 'edge_agent_stage_stalled{stage="source:cam1"} 0.0' in text
    assert metrics.registry.get_sample_value(
        "edge_agent_camera_stalls_total", {"stream": "cam1"}) == float(source.stalls)


def test_a_camera_stream_stuck_in_scoring_withholds_the_watchdog(tmp_path: Path) -> None:
    now = [1000.0]
    unblock = threading.Event()
    cfg = CameraConfig(url="rtsp://cam.invalid/2", stall_s=5.0)
    metrics, stop = Metrics(), threading.Event()
    source = CameraSource(cfg, "cam1", capture_factory=lambda c: _FramesThenSilence(0, unblock))
    pipeline = _Pipeline(block_at=2)
    cam = CameraStream(source, pipeline, None, lambda e: None, stop,  # type: ignore[arg-type]
                       metrics=metrics, monotonic=lambda: now[0])
    notifier = _Notifier()
    monitor, store = _monitor(tmp_path, metrics, cam, cfg, notifier, monotonic=lambda: now[0])
    try:
        cam.start()
        assert pipeline.entered.wait(10.0)
        first = monitor.tick()
        now[0] += 31.0  # past the camera's stall limit (max(2 x 5 s, 30 s)) without a frame
        stuck = monitor.tick()
    finally:
        stop.set()
        pipeline.release.set()
        unblock.set()
        cam.join(5.0)
        store.close()
    assert next(c for c in first.components if c.name == "source:cam1").state == "green"
    comp = next(c for c in stuck.components if c.name == "source:cam1")
    assert comp.state == "red" and comp.reason is not None and "stuck" in comp.reason
    assert notifier.pings == 1  # the first tick only
    assert metrics.registry.get_sample_value(
        "edge_agent_stage_stalled", {"stage": "source:cam1"}) == 1.0
