"""A camera folder holding images and their mask PNGs (MTD's ``Imgs``): ``include``/``exclude``
choose the files scored; the console line of a camera alert names the file, no empty ``top:``."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

cv2 = pytest.importorskip("cv2")

from agent.app import Agent  # noqa: E402
from agent.config.loader import parse_config  # noqa: E402
from agent.errors import ConfigError, SourceError  # noqa: E402
from agent.metrics import Metrics  # noqa: E402
from agent.sources.camera import CameraConfig, open_capture  # noqa: E402
from agent.sources.camera_watch import FolderCheckpoint  # noqa: E402
from agent.systemd import Notifier  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "models" / "mtd-patchcore"


def _imgs_folder(folder: Path, n_good: int = 3, n_cracked: int = 2) -> list[str]:
    """Tiles as ``NNN.jpg`` (the package's golden images, the last ones with a drawn crack),
    each with its mask as ``NNN.png`` (black: no defect, white crack: the defect), like MTD."""
    folder.mkdir()
    m = json.loads((PACKAGE / "manifest.json").read_text())["input"]
    g = np.load(PACKAGE / "golden.npy")
    good = [np.clip(np.round((x[0] * m["std"][0] + m["mean"][0]) * 255), 0, 255)
            .astype(np.uint8) for x in g]
    pts = np.array([[60, 20], [75, 70], [70, 120], [85, 170]], np.int32)
    names = []
    for i in range(n_good + n_cracked):
        img = good[i % len(good)].copy()
        mask = np.zeros_like(img)
        if i >= n_good:
            cv2.polylines(img, [pts], False, 15, 2)
            cv2.polylines(mask, [pts], False, 255, 2)
        cv2.imwrite(str(folder / f"{i:03d}.jpg"), img, [cv2.IMWRITE_JPEG_QUALITY, 98])
        cv2.imwrite(str(folder / f"{i:03d}.png"), mask)
        names.append(f"{i:03d}.jpg")
    return names


def _read_all(cap: object) -> list[str]:
    names = []
    for _ in range(100):
        ok, _img = cap.read()  # type: ignore[attr-defined]
        if not ok:
            break
        names.append(cap.origin.file)  # type: ignore[attr-defined]
    return names


def test_include_and_exclude_choose_the_folder_files_read(tmp_path: Path) -> None:
    jpgs = _imgs_folder(tmp_path / "Imgs")
    folder = str(tmp_path / "Imgs")
    assert _read_all(open_capture(CameraConfig(folder=folder))) == sorted(
        jpgs + [n.replace(".jpg", ".png") for n in jpgs])  # both, as before
    assert _read_all(open_capture(CameraConfig(folder=folder, include=["*.jpg"]))) == jpgs
    assert _read_all(open_capture(CameraConfig(folder=folder, exclude=["*.png"]))) == jpgs
    both = CameraConfig(folder=folder, include=["000.*", "00[12].*"], exclude=["*.png", "002.*"])
    assert _read_all(open_capture(both)) == ["000.jpg", "001.jpg"]
    with pytest.raises(SourceError, match=r"no image \(include \['\*.JPG'\]\)"):
        open_capture(CameraConfig(folder=folder, include=["*.JPG"]))  # case-sensitive


def test_a_watched_folder_takes_only_the_included_files(tmp_path: Path) -> None:
    jpgs = _imgs_folder(tmp_path / "Imgs")
    cap = open_capture(CameraConfig(folder=str(tmp_path / "Imgs"), watch=True, poll_s=0.05,
                                    include=["*.jpg"]), FolderCheckpoint("cam"))
    taken = []
    for _ in range(len(jpgs) + 3):  # the first poll only notes the files (not stable yet)
        ok, _img = cap.read()
        assert ok
        if cap.origin is not None and cap.origin.file not in taken:
            taken.append(cap.origin.file)
    assert taken == jpgs


@pytest.mark.parametrize("bad", [
    'device = 0\ninclude = ["*.jpg"]',
    'folder = "f"\nexclude = ["sub/*.png"]',
    'folder = "f"\ninclude = [""]',
])
def test_patterns_apply_only_to_folders_and_are_plain_name_globs(bad: str) -> None:
    text = f'[[streams]]\nname = "cam"\nmodel = "builtin:mtd-patchcore"\n' \
           f'[streams.source]\nkind = "camera"\n{bad}\n'
    with pytest.raises(ConfigError):
        parse_config(text, env={})


def test_the_agent_scores_only_the_images_and_its_console_line_names_the_file(
    tmp_path: Path,
) -> None:
    jpgs = _imgs_folder(tmp_path / "Imgs")
    text = f"""
[agent]
device_id = "gw1"
state_dir = "{tmp_path / 'state'}"
console_alerts = true

[[streams]]
name = "cam1"
model = "builtin:mtd-patchcore"
[streams.source]
kind = "camera"
folder = "{tmp_path / 'Imgs'}"
include = ["*.jpg"]
"""
    console = io.StringIO()
    agent = Agent(parse_config(text, env={}), Metrics(), console=console,
                  notifier=Notifier(""))
    assert agent.run() == 0  # a finite folder: the agent stops by itself
    assert agent.cameras["cam1"].scored == len(jpgs)  # the masks are not scored
    lines = [ln for ln in console.getvalue().splitlines() if ln.startswith("ALERT ")]
    assert lines, console.getvalue()
    for line in lines:
        assert "top:" not in line, line  # an image has no channels
        name = line.rsplit(" file ", 1)[1]
        assert name in jpgs[3:], line  # the cracked tiles, by name
