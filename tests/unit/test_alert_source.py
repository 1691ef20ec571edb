"""Alerts of recorded camera inputs name their frame: the payload's optional ``source`` (an
image folder's file, a video file's name and 0-based frame index); sensor and live-camera
payloads are unchanged (no ``source`` key), and the fleet's wire schema accepts the field.
Real files written with OpenCV, the real source, stream and agent code; the model is the shipped
``mtd-patchcore`` package (as in ``test_camera_rules``)."""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

cv2 = pytest.importorskip("cv2")

from agent.errors import SourceExhausted  # noqa: E402
from agent.records import (  # noqa: E402
    MAX_SOURCE_FILE_CHARS,
    Alert,
    Frame,
    FrameOrigin,
    TopChannel,
)
from agent.sources.camera import CameraConfig, CameraSource  # noqa: E402
from cloud_sync.protocol import AlertBody, AlertSourceBody  # noqa: E402
from tests.unit.test_camera_rules import PATTERN, _images, run_camera_agent  # noqa: E402


def _run_agent(tmp_path: Path, source: str) -> list[dict[str, Any]]:
    """Run the agent over ``source`` (a camera source's keys) and return the stored payloads."""
    run_camera_agent(tmp_path, source)
    db = sqlite3.connect(tmp_path / "state" / "agent.db")
    try:
        rows = db.execute("select payload from alerts order by id").fetchall()
    finally:
        db.close()
    # the raised events (an image folder has no episodes; a video's episodes also clear)
    return [p for p in map(json.loads, (r[0] for r in rows)) if p["event"] == "raised"]


def test_folder_alerts_name_the_file(tmp_path: Path) -> None:
    good, cracked = _images()
    folder = tmp_path / "parts"
    folder.mkdir()
    for i, bad in enumerate(PATTERN):
        img = (cracked if bad else good)[i % len(good)]
        assert cv2.imwrite(str(folder / f"{'crack' if bad else 'good'}_{i:02d}.png"), img)
    payloads = _run_agent(tmp_path, f'folder = "{folder}"')
    assert [p["source"] for p in payloads] == [
        {"file": f"crack_{i:02d}.png"} for i, bad in enumerate(PATTERN) if bad]
    for p in payloads:  # the fleet's schema takes the payload as uploaded (no snapshot key)
        AlertBody.model_validate({k: v for k, v in p.items() if k != "snapshot"})


def test_video_alerts_name_the_file_and_frame_index(tmp_path: Path) -> None:
    good, cracked = _images()
    path = tmp_path / "line1.avi"
    h, w = good[0].shape
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 10.0, (w, h))
    assert writer.isOpened()
    for i, bad in enumerate(PATTERN):
        writer.write(cv2.cvtColor((cracked if bad else good)[i % len(good)], cv2.COLOR_GRAY2BGR))
    writer.release()
    payloads = _run_agent(tmp_path, f'path = "{path}"')
    # one alert per run of anomalous frames, on the run's first frame (0-based in the file)
    firsts = [i for i, bad in enumerate(PATTERN) if bad and (i == 0 or not PATTERN[i - 1])]
    assert [p["source"] for p in payloads] == [{"file": "line1.avi", "frame": i} for i in firsts]


def _frames(config: CameraConfig) -> list[Frame]:
    frames: list[Frame] = []
    src = CameraSource(config, "cam")
    with pytest.raises(SourceExhausted):
        src.run(frames.append, lambda e: None, threading.Event())
    return frames


def test_non_utf8_file_name_is_kept_and_its_payload_encodes(tmp_path: Path) -> None:
    ok, data = cv2.imencode(".png", np.full((16, 16), 100, np.uint8))
    assert ok
    raw = os.fsencode(tmp_path) + b"/crack_\xff.png"
    with open(raw, "wb") as fh:
        fh.write(data.tobytes())
    frames = _frames(CameraConfig(folder=str(tmp_path)))
    assert [f.origin for f in frames] == [FrameOrigin(os.fsdecode(b"crack_\xff.png"))]
    assert frames[0].origin is not None
    alert = _alert(frames[0].origin)
    text = json.dumps(alert.to_payload(), ensure_ascii=False, separators=(",", ":"),
                      allow_nan=False)
    text.encode("utf-8")  # no lone surrogate left
    assert json.loads(text)["source"] == {"file": "crack_\ufffd.png"}
    AlertBody.model_validate(json.loads(text))


def test_looped_video_counts_from_0_each_pass_and_paced_frames_keep_their_index(
        tmp_path: Path) -> None:
    path = tmp_path / "v.avi"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 30.0, (32, 32))
    for i in range(5):
        writer.write(np.full((32, 32, 3), 20 + 40 * i, np.uint8))
    writer.release()
    frames = _frames(CameraConfig(path=str(path)))
    assert [f.origin for f in frames] == [FrameOrigin("v.avi", i) for i in range(5)]
    # looped: stop after two passes
    got: list[Frame] = []
    stop = threading.Event()

    def emit(frame: Frame) -> None:
        got.append(frame)
        if len(got) == 8:
            stop.set()

    CameraSource(CameraConfig(path=str(path), loop=True), "cam").run(emit, lambda e: None, stop)
    assert [f.origin.frame for f in got if f.origin] == [0, 1, 2, 3, 4, 0, 1, 2]
    # brightness follows the index: the index is the file's frame, not a count of frames taken
    levels = [int(f.image.mean()) for f in got]
    assert levels[5] == levels[0] and levels[7] == levels[2]


def test_live_camera_frames_have_no_origin() -> None:
    class FakeLive:
        def __init__(self) -> None:
            self.n = 0

        def read(self) -> tuple[bool, Any]:
            self.n += 1
            return True, np.full((16, 16), self.n % 255, np.uint8)

        def release(self) -> None:
            pass

    got: list[Frame] = []
    stop = threading.Event()

    def emit(frame: Frame) -> None:
        got.append(frame)
        if len(got) == 3:
            stop.set()

    CameraSource(CameraConfig(device=0), "cam", capture_factory=lambda c: FakeLive()).run(
        emit, lambda e: None, stop)
    assert len(got) == 3 and all(f.origin is None for f in got)


def _alert(origin: FrameOrigin | None = None, **kw: Any) -> Alert:
    return Alert("gw1:pump1:42", "gw1", "pump1", 42, "ae", 3, 2.51, 1.0, 1714564800.0,
                 1714564801.0, 1714564801.02, (TopChannel("temp", 0.75),), origin=origin, **kw)


#: The payload of a sensor alert without ``source`` (byte for byte): schema 2, the schema-1
#: keys after the lifecycle keys.
SENSOR_PAYLOAD = (
    '{"schema":2,"event":"raised","episode_id":"gw1:pump1:42","alert_id":"gw1:pump1:42","device_id":"gw1","stream":"pump1","seq":42,'
    '"model":{"name":"ae","version":3},"score":2.51,"threshold":1.0,'
    '"window_start":"2024-05-01T12:00:00.000Z","window_end":"2024-05-01T12:00:01.000Z",'
    '"raised_at":"2024-05-01T12:00:01.020Z","top_channels":[{"channel":"temp","contribution":0.75}]}'
)


def test_sensor_payload_is_unchanged() -> None:
    payload = _alert().to_payload()
    assert "source" not in payload
    assert json.dumps(payload, ensure_ascii=False, separators=(",", ":"),
                      allow_nan=False) == SENSOR_PAYLOAD


def test_source_payload_shapes_and_long_names() -> None:
    assert _alert(FrameOrigin("defects/crack_01.png")).to_payload()["source"] == {
        "file": "defects/crack_01.png"}
    assert _alert(FrameOrigin("line1.avi", 1234)).to_payload()["source"] == {
        "file": "line1.avi", "frame": 1234}
    long = FrameOrigin("d/" * 600 + "x.png").to_payload()
    assert len(str(long["file"])) == MAX_SOURCE_FILE_CHARS and str(long["file"]).endswith("x.png")
    AlertSourceBody.model_validate(long)


def test_alert_body_accepts_source_and_rejects_bad_ones() -> None:
    base = json.loads(SENSOR_PAYLOAD)
    assert AlertBody.model_validate(base).source is None
    body = AlertBody.model_validate({**base, "source": {"file": "line1.avi", "frame": 1234}})
    assert body.source == AlertSourceBody(file="line1.avi", frame=1234)
    assert AlertBody.model_validate({**base, "source": {"file": "a.png"}}).source == (
        AlertSourceBody(file="a.png"))
    assert AlertSourceBody.model_fields["file"].metadata[-1].max_length == MAX_SOURCE_FILE_CHARS
    for bad in ({"file": "v.avi", "frame": -1}, {"file": ""}, {"frame": 3},
                {"file": "x" * (MAX_SOURCE_FILE_CHARS + 1)}, {"file": "a.png", "extra": 1},
                "a.png"):
        with pytest.raises(ValidationError):
            AlertBody.model_validate({**base, "source": bad})
