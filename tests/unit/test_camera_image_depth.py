"""16-bit and float images from a real folder (files written by cv2.imwrite) keep their full
range: scaled by dtype, not clipped to 0..255 (which made them black or saturated)."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

cv2 = pytest.importorskip("cv2")

from agent.errors import SourceExhausted  # noqa: E402
from agent.records import Frame  # noqa: E402
from agent.sources.camera import CameraConfig, CameraSource, to_model_image  # noqa: E402

#: 0..255 in 8-bit steps down the rows, the same in every column: a full-range test card.
RAMP8 = np.repeat(np.arange(0, 256, 8, dtype=np.uint8)[:, None], 16, axis=1)


def _frames(folder: Path) -> list[Frame]:
    src = CameraSource(CameraConfig(folder=str(folder), fps=50.0), "cam")
    frames: list[Frame] = []
    with pytest.raises(SourceExhausted):
        src.run(frames.append, lambda e: None, threading.Event())
    assert src.rejected == 0 and src.dropped == 0
    return frames


def test_16_bit_png_is_scaled_by_1_over_257(tmp_path: Path) -> None:
    ramp16 = RAMP8.astype(np.uint16) * 257  # 0..65535
    assert cv2.imwrite(str(tmp_path / "a.png"), ramp16)
    assert cv2.imread(str(tmp_path / "a.png"), cv2.IMREAD_UNCHANGED).dtype == np.uint16
    (frame,) = _frames(tmp_path)
    assert frame.image.dtype == np.uint8
    assert np.array_equal(frame.image, RAMP8)


def test_16_bit_colour_png_is_scaled_then_made_gray(tmp_path: Path) -> None:
    bgr16 = np.stack([RAMP8.astype(np.uint16) * 257] * 3, axis=2)
    assert cv2.imwrite(str(tmp_path / "c.png"), bgr16)
    (frame,) = _frames(tmp_path)
    assert np.array_equal(frame.image, RAMP8)


def test_float32_tiff_in_0_1_is_multiplied_by_255(tmp_path: Path) -> None:
    ramp = RAMP8.astype(np.float32) / 255.0  # 0..1
    assert cv2.imwrite(str(tmp_path / "f.tif"), ramp)
    read = cv2.imread(str(tmp_path / "f.tif"), cv2.IMREAD_UNCHANGED)
    assert read.dtype == np.float32 and float(read.max()) == pytest.approx(248 / 255)
    (frame,) = _frames(tmp_path)
    assert frame.image.dtype == np.uint8
    assert np.array_equal(frame.image, RAMP8)  # was all 0 and 1 (black) before


def test_float_out_of_range_and_nan_are_clipped() -> None:
    img = np.array([[-0.5, 0.0, 0.25, 1.0, 3.0, np.nan]], np.float32)
    assert to_model_image(img, None, True).tolist() == [[0, 0, 64, 255, 255, 0]]
