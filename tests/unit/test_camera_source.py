"""Camera source: video file, image folder, newest-frame slot, stall watchdog and reconnect."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

cv2 = pytest.importorskip("cv2")

from agent.errors import RecordError, SourceError, SourceExhausted  # noqa: E402
from agent.records import Frame  # noqa: E402
from agent.sources.camera import CameraConfig, CameraSource, to_model_image  # noqa: E402
from agent.sources.registry import build_source  # noqa: E402


def _frame(i: int, size: int = 64) -> np.ndarray:
    img = np.full((size, size, 3), 40, np.uint8)
    cv2.putText(img, str(i), (4, size // 2), cv2.FONT_HERSHEY_SIMPLEX, 0.6, (255, 255, 255), 1)
    return img


def _run(source: CameraSource, until: int | None = None, timeout: float = 10.0) -> list[Frame]:
    frames: list[Frame] = []
    stop = threading.Event()

    def emit(frame: Frame) -> None:
        frames.append(frame)
        if until is not None and len(frames) >= until:
            stop.set()

    t = threading.Timer(timeout, stop.set)
    t.start()
    try:
        source.run(emit, lambda e: None, stop)
    finally:
        t.cancel()
    return frames


def test_video_file_frames_in_order_resized_to_gray(tmp_path: Path) -> None:
    path = tmp_path / "v.avi"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 30.0, (64, 64))
    for i in range(20):
        writer.write(_frame(i))
    writer.release()
    src = build_source(CameraConfig(path=str(path), fps=200.0), "cam", image_size=(32, 48))
    assert isinstance(src, CameraSource)
    frames: list[Frame] = []
    with pytest.raises(SourceExhausted):
        src.run(frames.append, lambda e: None, threading.Event())
    assert src.frames == 20
    assert len(frames) + src.dropped == 20
    assert all(f.image.shape == (32, 48) and f.image.dtype == np.uint8 for f in frames)
    seqs = [f.seq for f in frames]
    assert seqs == sorted(seqs) and seqs[-1] == 20  # the newest frame is never dropped
    assert all(f.stream == "cam" for f in frames)


def test_image_folder_in_name_order(tmp_path: Path) -> None:
    for i in range(5):
        cv2.imwrite(str(tmp_path / f"{i:02d}.png"), _frame(i))
    (tmp_path / "notes.txt").write_text("not an image")
    src = CameraSource(CameraConfig(folder=str(tmp_path)), "cam")  # unpaced: no drops
    frames: list[Frame] = []
    with pytest.raises(SourceExhausted):
        src.run(frames.append, lambda e: None, threading.Event())
    assert [f.seq for f in frames] == [1, 2, 3, 4, 5]
    assert frames[0].image.shape == (64, 64)  # grayscale, size kept
    first = cv2.cvtColor(_frame(0), cv2.COLOR_BGR2GRAY)
    assert np.array_equal(frames[0].image, first)


def test_missing_folder_is_a_source_error(tmp_path: Path) -> None:
    src = CameraSource(CameraConfig(folder=str(tmp_path / "nope")), "cam")
    with pytest.raises(SourceError):
        src.run(lambda f: None, lambda e: None, threading.Event())


def test_config_needs_exactly_one_input() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        CameraConfig(device=0, url="rtsp://x")
    with pytest.raises(ValueError, match="exactly one"):
        CameraConfig()


def test_slow_consumer_gets_the_newest_frame_and_drops_are_counted(tmp_path: Path) -> None:
    for i in range(30):
        cv2.imwrite(str(tmp_path / f"{i:02d}.png"), _frame(i))
    src = CameraSource(CameraConfig(folder=str(tmp_path), fps=200.0), "cam")
    frames: list[Frame] = []

    def slow(frame: Frame) -> None:
        frames.append(frame)
        time.sleep(0.03)

    with pytest.raises(SourceExhausted):
        src.run(slow, lambda e: None, threading.Event())
    assert src.dropped > 0
    assert len(frames) + src.dropped == 30
    assert frames[-1].seq == 30


class _StallingCapture:
    """Delivers ``good`` frames, then blocks in read() like a silent RTSP camera."""

    def __init__(self, good: int, release_event: threading.Event) -> None:
        self.good = good
        self.n = 0
        self.released = False
        self._unblock = release_event

    def read(self) -> tuple[bool, Any]:
        if self.n >= self.good:
            self._unblock.wait(5.0)
            return False, None
        self.n += 1
        time.sleep(0.01)
        return True, np.full((16, 16), self.n, np.uint8)

    def release(self) -> None:
        self.released = True


def test_stall_reconnects_and_frame_age_stays_bounded() -> None:
    unblock = threading.Event()
    caps: list[_StallingCapture] = []

    def factory(config: CameraConfig) -> _StallingCapture:
        cap = _StallingCapture(20 if not caps else 10_000, unblock)
        caps.append(cap)
        return cap

    cfg = CameraConfig(url="rtsp://camera.invalid/stream", stall_s=0.3,
                       reconnect_initial_s=0.05, reconnect_max_s=0.1)
    src = CameraSource(cfg, "cam", capture_factory=factory)
    statuses: list[object] = []
    src.set_status_listener(statuses.append)
    ages: list[float] = []
    stop = threading.Event()
    frames: list[Frame] = []

    def sample_age() -> None:
        while not stop.wait(0.02):
            age = src.frame_age_s
            if age is not None:
                ages.append(age)

    sampler = threading.Thread(target=sample_age)
    sampler.start()

    def emit(frame: Frame) -> None:
        frames.append(frame)
        if len(caps) >= 2 and caps[1].n >= 30:
            stop.set()

    timer = threading.Timer(10.0, stop.set)
    timer.start()
    try:
        src.run(emit, lambda e: None, stop)
    finally:
        timer.cancel()
        stop.set()
        unblock.set()
        sampler.join()
    assert len(caps) == 2, "one reconnect after the stall"
    assert src.reconnects == 1 and src.stalls == 1
    assert caps[1].n >= 30  # frames flow again after the reconnect
    assert max(ages) < 0.3 + 0.1 + 0.3  # stall_s + backoff + slack: the age never runs away
    assert isinstance(statuses[0], SourceError) and statuses[-1] is None  # outage, recovery


def test_to_model_image_converts_colour_and_16_bit() -> None:
    bgr = np.zeros((10, 20, 3), np.uint8)
    bgr[..., 2] = 255  # red
    gray = to_model_image(bgr, (5, 10), grayscale=True)
    assert gray.shape == (5, 10) and 70 <= int(gray[0, 0]) <= 80  # 0.299 * 255
    deep = np.full((4, 4), 65535, np.uint16)
    assert int(to_model_image(deep, None, grayscale=True)[0, 0]) == 255


def test_unreadable_images_in_a_folder_are_rejected_and_the_folder_goes_on(
        tmp_path: Path) -> None:
    # name order: a corrupt JPEG, a zero-byte PNG and a text file named .png come first; the
    # folder used to end at the first of them with 0 frames and no word about why
    (tmp_path / "00-corrupt.jpg").write_bytes(b"\xff\xd8garbage" * 10)
    (tmp_path / "01-empty.png").write_bytes(b"")
    (tmp_path / "02-text.png").write_text("not an image")
    for i in range(3):
        cv2.imwrite(str(tmp_path / f"{i + 10:02d}.png"), _frame(i))
    src = CameraSource(CameraConfig(folder=str(tmp_path), fps=50.0), "cam")
    rejected: list[RecordError] = []
    frames: list[Frame] = []
    with pytest.raises(SourceExhausted):
        src.run(frames.append, rejected.append, threading.Event())
    # paced at 50 fps a folder has newest-frame semantics: on a loaded machine a frame not
    # taken within 20 ms is replaced by the next one (counted as dropped, not lost silently)
    assert len(frames) + src.dropped == 3 and len(frames) >= 1 and src.rejected == 3
    assert [e.reason for e in rejected] == ["unreadable_image"] * 3
    assert "00-corrupt.jpg" in str(rejected[0]) and "empty file" in str(rejected[1])


class _ListCapture:
    def __init__(self, images: list[np.ndarray]) -> None:
        self.images = images

    def read(self) -> tuple[bool, Any]:
        if not self.images:
            return False, None
        time.sleep(0.02)  # one at a time: the newest-frame slot drops none
        return True, self.images.pop(0)

    def release(self) -> None:
        self.images = []


def test_frames_that_cannot_be_converted_are_rejected_not_fatal() -> None:
    images = [np.zeros((8, 8, 2), np.uint8), np.zeros((8, 8, 5), np.uint8),
              np.zeros((0, 8), np.uint8), np.zeros((8, 8, 1), np.uint8),
              np.full((8, 8, 3), 100, np.uint8)]
    src = CameraSource(CameraConfig(path="v.avi", fps=0.0), "cam", image_size=(4, 4),
                       capture_factory=lambda c: _ListCapture(images))
    rejected: list[RecordError] = []
    frames: list[Frame] = []
    with pytest.raises(SourceExhausted):
        src.run(frames.append, rejected.append, threading.Event())
    assert [e.reason for e in rejected] == ["bad_image"] * 3 and src.rejected == 3
    assert [f.image.shape for f in frames] == [(4, 4), (4, 4)]


def test_to_model_image_odd_inputs() -> None:
    assert to_model_image(np.zeros((8, 8, 1), np.uint8), (4, 4), True).shape == (4, 4)
    nan = np.full((4, 4), np.nan)
    assert int(to_model_image(nan, None, True).max()) == 0
    assert to_model_image(np.zeros((4, 4), np.uint8), None, grayscale=False).shape == (4, 4, 3)
    with pytest.raises(ValueError, match="neither grayscale"):
        to_model_image(np.zeros((4, 4, 2), np.uint8), None, True)
