"""Recorded camera inputs (a video file, an image folder at ``fps`` = 0) deliver every frame to
the model: the reader waits for a slow consumer instead of dropping frames, the watchdog does
not take that wait for a stall, the end of the file still ends the stream, and every frame read
is scored, rejected or dropped with a counted reason. Real files written with OpenCV, the real
source, stream and agent code; the model is the shipped ``mtd-patchcore`` package."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

cv2 = pytest.importorskip("cv2")

from agent.app import Agent  # noqa: E402
from agent.config.loader import parse_config  # noqa: E402
from agent.errors import SourceExhausted  # noqa: E402
from agent.metrics import Metrics  # noqa: E402
from agent.records import Frame  # noqa: E402
from agent.sources.camera import RECORDED_QUEUE_FRAMES, CameraConfig, CameraSource  # noqa: E402
from agent.systemd import Notifier  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "models" / "mtd-patchcore"


def _write_video(path: Path, n: int, size: int = 64) -> None:
    """``n`` MJPG frames; frame i is a flat image of intensity 20 + 15 i (order is checkable)."""
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 30.0, (size, size))
    assert writer.isOpened()
    for i in range(n):
        writer.write(np.full((size, size, 3), 20 + 15 * i, np.uint8))
    writer.release()


def _wait(cond: Any, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_video_file_at_fps_0_gives_a_slow_consumer_every_frame_in_order(tmp_path: Path) -> None:
    path = tmp_path / "line1.avi"
    _write_video(path, 8)
    # the consumer takes longer per frame than stall_s: the reader waits on it (full queue),
    # which must not count as a stall (a stall would reopen the file and read it again)
    src = CameraSource(CameraConfig(path=str(path), stall_s=0.3), "cam")
    assert not src.realtime
    frames: list[Frame] = []

    def slow(frame: Frame) -> None:
        frames.append(frame)
        time.sleep(0.5)

    with pytest.raises(SourceExhausted):
        src.run(slow, lambda e: None, threading.Event())
    assert [f.seq for f in frames] == list(range(1, 9))
    levels = [int(f.image.mean()) for f in frames]
    assert levels == sorted(levels) and levels[-1] - levels[0] > 90  # frame 0 .. frame 7
    assert src.frames == src.emitted == 8
    assert src.dropped == src.abandoned == src.rejected == 0
    assert src.stalls == 0 and src.reconnects == 0


def test_image_folder_with_an_unreadable_file_every_image_accounted_for(tmp_path: Path) -> None:
    for i in range(7):
        cv2.imwrite(str(tmp_path / f"{i:02d}.png"), np.full((32, 32), 30 * i, np.uint8))
    (tmp_path / "03b-corrupt.png").write_bytes(b"\x89PNG garbage")
    src = CameraSource(CameraConfig(folder=str(tmp_path)), "cam")
    frames: list[Frame] = []
    rejected: list[object] = []

    def slow(frame: Frame) -> None:
        frames.append(frame)
        time.sleep(0.05)

    with pytest.raises(SourceExhausted):
        src.run(slow, rejected.append, threading.Event())
    assert [int(f.image[0, 0]) for f in frames] == [30 * i for i in range(7)]
    assert len(rejected) == src.rejected == 1 and src.dropped == 0


def test_stop_while_the_reader_waits_counts_the_queued_frames(tmp_path: Path) -> None:
    for i in range(20):
        cv2.imwrite(str(tmp_path / f"{i:02d}.png"), np.full((16, 16), i, np.uint8))
    src = CameraSource(CameraConfig(folder=str(tmp_path)), "cam")
    stop = threading.Event()
    frames: list[Frame] = []

    def emit(frame: Frame) -> None:
        frames.append(frame)
        if len(frames) == 3:
            _wait(lambda: src.frames >= 3 + RECORDED_QUEUE_FRAMES)  # the queue is full
            stop.set()

    src.run(emit, lambda e: None, stop)  # returns on the stop: no exhaustion
    assert len(frames) == 3
    # every frame read is emitted or abandoned (the grabber may finish its last read after run)
    assert _wait(lambda: src.frames == src.emitted + src.abandoned), (src.frames, src.abandoned)
    assert src.abandoned >= RECORDED_QUEUE_FRAMES and src.frames < 20  # it waited, not raced on
    assert src.dropped == 0


def test_paced_folder_keeps_newest_frame_semantics(tmp_path: Path) -> None:
    for i in range(30):
        cv2.imwrite(str(tmp_path / f"{i:02d}.png"), np.full((16, 16), i, np.uint8))
    src = CameraSource(CameraConfig(folder=str(tmp_path), fps=200.0), "cam")
    assert src.realtime
    frames: list[Frame] = []

    def slow(frame: Frame) -> None:
        frames.append(frame)
        time.sleep(0.05)

    with pytest.raises(SourceExhausted):
        src.run(slow, lambda e: None, threading.Event())
    assert src.dropped > 0 and frames[-1].seq == 30  # the newest is scored, older ones dropped
    assert src.frames == src.emitted + src.dropped + src.abandoned == 30


def _good_tiles(n: int) -> list[np.ndarray]:
    m = json.loads((PACKAGE / "manifest.json").read_text())["input"]
    g = np.load(PACKAGE / "golden.npy")
    return [np.clip(np.round((g[i % len(g)][0] * m["std"][0] + m["mean"][0]) * 255), 0, 255)
            .astype(np.uint8) for i in range(n)]


def test_agent_scores_every_frame_of_a_folder_and_a_video_file(tmp_path: Path) -> None:
    """A new user's camera-only agent on recorded inputs: 7 of 7 folder images and every frame
    of a video are scored (5 of 7 images used to be dropped unscored), and it exits 0."""
    tiles = _good_tiles(7)
    folder = tmp_path / "frames"
    folder.mkdir()
    for i, tile in enumerate(tiles):
        cv2.imwrite(str(folder / f"{i}.png"), tile)
    video = tmp_path / "line1.avi"
    h, w = tiles[0].shape
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"MJPG"), 30.0, (w, h))
    for i in range(12):
        writer.write(cv2.cvtColor(tiles[i % 7], cv2.COLOR_GRAY2BGR))
    writer.release()
    text = f"""
[agent]
device_id = "gw1"
state_dir = "{tmp_path / 'state'}"
console_alerts = false

[[streams]]
name = "folder"
model = "builtin:mtd-patchcore"
[streams.source]
kind = "camera"
folder = "{folder}"
[streams.rules]
k = 3
n = 5

[[streams]]
name = "video"
model = "builtin:mtd-patchcore"
[streams.source]
kind = "camera"
path = "{video}"
[streams.rules]
k = 3
n = 5
"""
    metrics = Metrics()
    agent = Agent(parse_config(text, env={}), metrics, console=None, notifier=Notifier(""))
    assert agent.run() == 0  # both inputs end by themselves
    counts = {"folder": 7, "video": 12}
    for name, n in counts.items():
        cam = agent.cameras[name]
        assert cam.exhausted and not cam.failed
        assert cam.scored == n and cam.source.frames == n, (name, cam.scored, cam.source.frames)
        assert metrics.registry.get_sample_value(
            "edge_agent_camera_frames_scored_total", {"stream": name}) == n
        for reason in ("newer_frame", "stopped", "score_error"):
            assert metrics.registry.get_sample_value(
                "edge_agent_camera_frames_dropped_total", {"stream": name, "reason": reason}) == 0
    db = sqlite3.connect(tmp_path / "state" / "agent.db")
    rows = dict(db.execute("select stream, sum(windows) from aggregates group by stream"))
    db.close()
    assert rows == counts


class _SlowReads:
    """``n`` frames; read number ``slow_at`` takes ``delay`` seconds (a big image on a slow
    card). Counts how often it was opened."""

    opened = 0

    def __init__(self, n: int, slow_at: int, delay: float) -> None:
        type(self).opened += 1
        self.n, self.i, self.slow_at, self.delay = n, 0, slow_at, delay

    def read(self) -> tuple[bool, Any]:
        if self.i >= self.n:
            return False, None
        self.i += 1
        if self.i == self.slow_at:
            time.sleep(self.delay)
        return True, np.full((8, 8), self.i, np.uint8)

    def release(self) -> None:
        pass


def test_a_recorded_read_slower_than_stall_s_is_not_reopened() -> None:
    # reopening would read the input again from its first frame (duplicates)
    _SlowReads.opened = 0
    src = CameraSource(CameraConfig(path="big.avi", stall_s=0.1), "cam",
                       capture_factory=lambda c: _SlowReads(5, 3, 0.6))
    frames: list[Frame] = []
    with pytest.raises(SourceExhausted):
        src.run(frames.append, lambda e: None, threading.Event())
    assert [int(f.image[0, 0]) for f in frames] == [1, 2, 3, 4, 5]
    assert _SlowReads.opened == 1 and src.reconnects == 0 and src.stalls == 0
