"""A camera config without the camera extra: check-config says so, and every hint fits a wheel.

A user who installed the wheel without ``[camera]`` saw ``check-config`` print OK and ``run``
exit 69; the hint said ``pip install -e '.[camera]'``, which only works in a checkout. The
modules are made unimportable in-process (``sys.modules[name] = None``, undone by monkeypatch).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agent.cli import main
from agent.errors import SourceError
from agent.exitcodes import EX_CONFIG, EX_OK
from agent.extras import install_hint
from agent.sources.camera import quiet_opencv
from agent.sources.camera_files import FolderCapture

WHEEL_HINT = "pip install 'edge-anomaly-agent[camera]'"

CAMERA = """
[agent]
device_id = "gw1"
[snapshots]
enabled = {snapshots}
[[streams]]
name = "cam1"
model = "builtin:mtd-patchcore"
[streams.source]
kind = "camera"
folder = "frames"
"""


def _check(tmp_path: Path, capsys: pytest.CaptureFixture[str], snapshots: bool = True,
           ) -> tuple[int, str, str]:
    (tmp_path / "frames").mkdir(exist_ok=True)
    path = tmp_path / "agent.toml"
    path.write_text(CAMERA.format(snapshots=str(snapshots).lower()), encoding="utf-8")
    rc = main(["check-config", str(path)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_hint_names_the_wheel_and_the_checkout() -> None:
    hint = install_hint("camera")
    assert hint.startswith(WHEEL_HINT)
    assert "pip install -e '.[camera]' in a checkout" in hint


def test_camera_config_passes_with_the_extra(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _check(tmp_path, capsys)
    assert (rc, err) == (EX_OK, "")
    assert out.startswith("OK: ")


def test_check_config_reports_missing_opencv(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cv2", None)
    rc, out, err = _check(tmp_path, capsys)
    assert rc == EX_CONFIG
    assert "OK" not in out
    (line,) = [ln for ln in err.splitlines() if "OpenCV" in ln]
    assert "streams[0].source: OpenCV is not installed" in line
    assert WHEEL_HINT in line
    assert "Traceback" not in err


@pytest.mark.parametrize("snapshots", [True, False])
def test_check_config_reports_missing_pillow(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch, snapshots: bool) -> None:
    """An image folder reads each file with Pillow: missing, it is a problem with or without
    snapshots."""
    monkeypatch.setitem(sys.modules, "PIL", None)
    rc, _, err = _check(tmp_path, capsys, snapshots=snapshots)
    assert rc == EX_CONFIG
    (line,) = [ln for ln in err.splitlines() if "Pillow" in ln]
    assert "streams[0].source: Pillow is not installed" in line and WHEEL_HINT in line
    assert "an image folder" in line
    assert ("[snapshots]" in line) is snapshots


def test_run_time_errors_give_the_wheel_hint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cv2", None)
    with pytest.raises(SourceError, match=r"OpenCV is not installed: pip install 'edge-anomaly"):
        quiet_opencv()
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(SourceError, match=r"Pillow is not installed: pip install 'edge-anomaly"):
        FolderCapture(tmp_path)


def test_no_hint_assumes_a_checkout() -> None:
    """Every 'pip install -e' in the agent's and fleet's code comes after the wheel's form."""
    repo = Path(__file__).resolve().parents[2]
    offenders = []
    for path in [*repo.glob("agent/**/*.py"), *repo.glob("fleet/**/*.py")]:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if "pip install -e" in line and "in a checkout" not in line:
                offenders.append(f"{path.relative_to(repo)}:{n}: {line.strip()}")
    assert offenders == []
