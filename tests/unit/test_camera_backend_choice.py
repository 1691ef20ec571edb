"""A camera stream runs the backend and precision its config names (they were ignored: every
camera stream ran ``auto``/``int8`` whatever the config said, without the OpenVINO cache)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

pytest.importorskip("cv2")

from agent.config.loader import parse_config
from agent.config.schema import StreamConfig
from agent.errors import ModelError
from agent.services.camera import build_camera_stream


def _stream_config(tmp_path: Path, backend: str, precision: str) -> StreamConfig:
    (tmp_path / "frames").mkdir(exist_ok=True)
    text = f"""
[agent]
device_id = "gw1"
[[streams]]
name = "cam1"
model = "builtin:mtd-patchcore"
backend = "{backend}"
precision = "{precision}"
[streams.source]
kind = "camera"
folder = "{tmp_path / 'frames'}"
"""
    return parse_config(text, env={}).streams[0]


def test_pinned_backend_and_precision_are_used(tmp_path: Path) -> None:
    sc = _stream_config(tmp_path, "onnxruntime", "fp32")
    cam = build_camera_stream(sc, "gw1", 60.0, lambda e: None,
                              threading.Event())
    backend = cam.pipeline.backend
    assert (backend.name, backend.precision) == ("onnxruntime", "fp32")


def test_a_backend_without_an_artefact_is_a_clear_model_error(tmp_path: Path) -> None:
    pytest.importorskip("ai_edge_litert")
    sc = _stream_config(tmp_path, "litert", "fp32")  # the package's TFLite file is int8 only
    with pytest.raises(ModelError, match="no fp32 artefact that litert can run"):
        build_camera_stream(sc, "gw1", 60.0, lambda e: None,
                            threading.Event())
