"""Image folder files that crashed the agent or raised false alerts (real files in tmp_path):
a name that is not UTF-8 (cv2.imread of it was a SIGSEGV), unreadable entries, truncated
images (libjpeg filled the rest with grey, scored as a defect) and tiny images are rejected
with a reason; good images, 16-bit, float, colour and alpha ones, decode exactly as before."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

cv2 = pytest.importorskip("cv2")
pytest.importorskip("PIL")

from agent.errors import RecordError, SourceExhausted  # noqa: E402
from agent.records import Frame  # noqa: E402
from agent.sources.camera import CameraConfig, CameraSource  # noqa: E402
from agent.sources.image_file import MIN_IMAGE_SIDE, read_image_file  # noqa: E402


def _texture(h: int = 96, w: int = 128) -> np.ndarray:
    rng = np.random.default_rng(7)
    return np.asarray(cv2.GaussianBlur(rng.integers(0, 256, (h, w), np.uint8), (5, 5), 0))


def _jpeg() -> bytes:
    ok, buf = cv2.imencode(".jpg", _texture(), [cv2.IMWRITE_JPEG_QUALITY, 95])
    assert ok
    return bytes(buf)


def _run(folder: Path) -> tuple[CameraSource, list[Frame], list[RecordError]]:
    src = CameraSource(CameraConfig(folder=str(folder)), "cam")
    frames: list[Frame] = []
    rejected: list[RecordError] = []
    with pytest.raises(SourceExhausted):
        src.run(frames.append, rejected.append, threading.Event())
    return src, frames, rejected


@pytest.mark.skipif(sys.platform != "linux", reason="byte file names: POSIX")
def test_non_utf8_file_name_is_decoded_not_a_crash(tmp_path: Path) -> None:
    data = _jpeg()
    name = os.fsdecode(b"good_\xff.jpg")  # Latin-1 name from an SMB share
    (tmp_path / name).write_bytes(data)
    img = read_image_file(tmp_path / name)
    expected = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    assert np.array_equal(img, expected)
    (tmp_path / os.fsdecode(b"bad_\xfe.jpg")).write_bytes(b"not an image")
    # in a child process: the old cv2.imread(str(path)) killed the interpreter with SIGSEGV
    code = ("import sys, threading; from agent.sources.camera import CameraConfig, CameraSource\n"
            "from agent.errors import SourceExhausted\n"
            "f, r = [], []\n"
            "s = CameraSource(CameraConfig(folder=sys.argv[1]), 'cam')\n"
            "try: s.run(f.append, r.append, threading.Event())\n"
            "except SourceExhausted: pass\n"
            "print(len(f), [str(e) for e in r])\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1 ['image bad_\\\\xfe.jpg skipped: does not decode " \
        "(path=" + str(tmp_path) + "/bad_\\\\xfe.jpg)']"


def test_unreadable_entries_are_rejected_with_a_reason(tmp_path: Path) -> None:
    (tmp_path / "a_dangling.jpg").symlink_to(tmp_path / "nowhere.jpg")
    (tmp_path / "b_dir.png").mkdir()
    (tmp_path / "c_empty.jpg").write_bytes(b"")
    (tmp_path / "d_good.jpg").write_bytes(_jpeg())
    src, frames, rejected = _run(tmp_path)
    assert len(frames) == 1 and src.rejected == 3
    assert [e.reason for e in rejected] == ["unreadable_image"] * 3
    assert "a_dangling.jpg skipped: cannot be read: No such file" in str(rejected[0])
    assert "b_dir.png skipped: cannot be read: Is a directory" in str(rejected[1])
    assert "c_empty.jpg skipped: empty file" in str(rejected[2])


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root reads files without permission")
def test_file_without_read_permission_is_rejected(tmp_path: Path) -> None:
    locked = tmp_path / "locked.jpg"
    locked.write_bytes(_jpeg())
    locked.chmod(0)
    with pytest.raises(RecordError, match="cannot be read: Permission denied"):
        read_image_file(locked)


@pytest.mark.parametrize("keep", [0.1, 0.5, 0.9, -2])
def test_truncated_jpeg_is_rejected_not_scored(tmp_path: Path, keep: float) -> None:
    data = _jpeg()
    cut = int(len(data) * keep) if keep > 0 else len(data) + int(keep)  # -2: only EOI gone
    (tmp_path / "cut.jpg").write_bytes(data[:cut])
    with pytest.raises(RecordError) as err:
        read_image_file(tmp_path / "cut.jpg")
    assert err.value.reason == "unreadable_image"
    assert "cut.jpg skipped: image file is truncated" in str(err.value)


@pytest.mark.parametrize("ext", [".png", ".bmp", ".tif"])
def test_truncated_lossless_images_are_rejected(tmp_path: Path, ext: str) -> None:
    assert cv2.imwrite(str(tmp_path / f"whole{ext}"), _texture())
    data = (tmp_path / f"whole{ext}").read_bytes()
    (tmp_path / f"half{ext}").write_bytes(data[: len(data) // 2])
    with pytest.raises(RecordError, match=f"half{ext} skipped: ") as err:
        read_image_file(tmp_path / f"half{ext}")
    assert err.value.reason == "unreadable_image"


def test_png_with_a_flipped_bit_fails_its_crc(tmp_path: Path) -> None:
    assert cv2.imwrite(str(tmp_path / "whole.png"), _texture())
    data = bytearray((tmp_path / "whole.png").read_bytes())
    data[len(data) // 2] ^= 0x10
    (tmp_path / "flipped.png").write_bytes(bytes(data))
    with pytest.raises(RecordError, match=r"flipped\.png skipped: corrupt .*checksum"):
        read_image_file(tmp_path / "flipped.png")


def test_image_below_the_minimum_size_is_a_bad_image(tmp_path: Path) -> None:
    assert cv2.imwrite(str(tmp_path / "a_tiny.png"), np.full((2, 2), 200, np.uint8))
    small = MIN_IMAGE_SIDE - 1
    assert cv2.imwrite(str(tmp_path / "b_thin.png"), np.full((small, 300), 200, np.uint8))
    assert cv2.imwrite(str(tmp_path / "c_min.png"),
                       np.full((MIN_IMAGE_SIDE, MIN_IMAGE_SIDE), 200, np.uint8))
    _, frames, rejected = _run(tmp_path)
    assert [f.image.shape for f in frames] == [(MIN_IMAGE_SIDE, MIN_IMAGE_SIDE)]
    assert [e.reason for e in rejected] == ["bad_image"] * 2
    assert "a_tiny.png skipped: 2x2 px is smaller than 8x8" in str(rejected[0])


@pytest.mark.parametrize(("ext", "image"), [
    (".png", (np.arange(48 * 40 * 3).reshape(48, 40, 3) * 37 % 65536).astype(np.uint16)),
    (".tif", (np.arange(48 * 40).reshape(48, 40) / (48 * 40)).astype(np.float32)),
    (".png", (np.arange(48 * 40 * 4).reshape(48, 40, 4) % 256).astype(np.uint8)),
    (".bmp", (np.arange(48 * 40 * 3).reshape(48, 40, 3) % 256).astype(np.uint8)),
    (".jpg", _texture()),
])
def test_good_images_decode_exactly_as_cv2_imread(tmp_path: Path, ext: str,
                                                  image: np.ndarray) -> None:
    path = tmp_path / f"good{ext}"
    assert cv2.imwrite(str(path), image)
    got = read_image_file(path)
    want = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    assert got.dtype == want.dtype and np.array_equal(got, want)


def test_bad_files_leave_no_raw_line_on_stderr(tmp_path: Path) -> None:
    # libjpeg's "Premature end of JPEG file", OpenCV's "[ WARN:0@...] ... imread_" and Pillow's
    # warnings went to stderr once per bad file; the agent's own (rate-limited) message is the
    # only word about them now
    data = _jpeg()
    (tmp_path / "a_cut.jpg").write_bytes(data[:len(data) // 3])
    (tmp_path / "b_text.jpg").write_text("not an image")
    (tmp_path / "c_random.png").write_bytes(bytes(range(200)))
    assert cv2.imwrite(str(tmp_path / "d.tif"), _texture().astype(np.float32) / 255)
    tif = (tmp_path / "d.tif").read_bytes()
    (tmp_path / "d.tif").write_bytes(tif[: len(tif) // 2])
    (tmp_path / "e_good.jpg").write_bytes(data)
    code = ("import sys, threading\n"
            "from agent.sources.camera import CameraConfig, CameraSource\n"
            "from agent.errors import SourceExhausted\n"
            "f, r = [], []\n"
            "s = CameraSource(CameraConfig(folder=sys.argv[1]), 'cam')\n"
            "try: s.run(f.append, r.append, threading.Event())\n"
            "except SourceExhausted: pass\n"
            "print(len(f), len(r))\n")
    env = {k: v for k, v in os.environ.items() if k != "OPENCV_LOG_LEVEL"}
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                         text=True, timeout=120, check=False, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1 4"
    assert out.stderr == ""
