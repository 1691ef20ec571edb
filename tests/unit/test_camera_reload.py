"""A SIGHUP reload checks a camera stream's model as an image package (it was loaded as a
sensor package, so every reload of a config with a camera stream was refused)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.app import check_reload


def _config(tmp_path: Path, model: str) -> Path:
    (tmp_path / "frames").mkdir(exist_ok=True)
    path = tmp_path / "agent.toml"
    path.write_text(
        f'[agent]\nstate_dir = "{tmp_path / "state"}"\n[[streams]]\nname = "cam1"\n'
        f'model = "{model}"\n[streams.source]\nkind = "camera"\nfolder = "frames"\n'
        "[streams.rules]\nk = 3\nn = 5\n"
    )
    return path


def test_reload_accepts_a_camera_stream_with_an_image_model(tmp_path: Path) -> None:
    config = check_reload(_config(tmp_path, "builtin:mtd-patchcore"))
    assert config is not None and config.streams[0].source.kind == "camera"


def test_reload_refuses_a_sensor_model_on_a_camera(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert check_reload(_config(tmp_path, "builtin:skab-wstat")) is None
    assert "skab-wstat is a sensor model" in caplog.text
