"""Config mistakes on camera streams are config problems (exit 78) with their key paths, and a
model of the wrong kind says which source it needs instead of dumping a schema."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.cli import EX_CONFIG, main
from agent.config.loader import parse_config
from agent.config.schema import SENSOR_ONLY_KEYS
from agent.errors import ConfigError

CAMERA = """
[agent]
state_dir = "{state}"
[[streams]]
name = "cam1"
model = "builtin:mtd-patchcore"
{extra}
[streams.source]
kind = "camera"
folder = "{folder}"
[streams.rules]
k = 3
n = 5
{rules}
"""


def _camera(tmp_path: Path, extra: str = "", rules: str = "") -> Path:
    (tmp_path / "frames").mkdir(exist_ok=True)
    path = tmp_path / "agent.toml"
    path.write_text(CAMERA.format(state=tmp_path / "state", folder=tmp_path / "frames",
                                  extra=extra, rules=rules))
    return path


@pytest.mark.parametrize(("key", "value"), [
    ("window", "10"), ("hop", "2"), ("calibration_samples", "400"),
    ("recalibrate_on_start", "true"), ("calibration_max_age_s", "60.0"),
    ("threshold_quantile", "0.99"),
])
def test_a_sensor_only_key_on_a_camera_stream_is_a_problem_at_its_path(
        tmp_path: Path, key: str, value: str) -> None:
    assert key in SENSOR_ONLY_KEYS
    text = _camera(tmp_path, f"{key} = {value}").read_text()
    with pytest.raises(ConfigError) as info:
        parse_config(text, env={})
    assert [p.split(": ", 1)[0] for p in info.value.problems] == [f"streams[0].{key}"]
    assert "only to sensor streams" in info.value.problems[0]


def test_check_config_and_run_exit_78_naming_every_sensor_only_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _camera(tmp_path, "window = 10\nthreshold_quantile = 0.99", "top_channels = 2")
    assert main(["check-config", str(path)]) == EX_CONFIG
    err = capsys.readouterr().err
    for key in ("streams[0].window", "streams[0].threshold_quantile",
                "streams[0].rules.top_channels"):
        assert f"{key}: applies only to sensor streams" in err
    assert main(["run", "--config", str(path)]) == EX_CONFIG
    assert "streams[0].window: applies only to sensor streams" in capsys.readouterr().err


def test_a_camera_stream_without_sensor_keys_is_valid(tmp_path: Path) -> None:
    config = parse_config(_camera(tmp_path).read_text(), env={})
    assert config.streams[0].source.kind == "camera"


def test_an_image_model_on_a_sensor_source_says_use_a_camera_source(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "agent.toml"
    path.write_text(f'[agent]\nstate_dir = "{tmp_path / "state"}"\n[[streams]]\nname = "pump"\n'
                    'model = "builtin:mtd-patchcore"\n[streams.source]\nkind = "simulator"\n')
    assert main(["check-config", str(path)]) == EX_CONFIG
    err = capsys.readouterr().err
    assert "streams[0].model: mtd-patchcore is an image model; use a camera source" in err
    assert "does not match the schema" not in err and "Field required" not in err


def test_a_sensor_model_on_a_camera_source_says_use_a_sensor_source(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _camera(tmp_path)
    path.write_text(path.read_text().replace("builtin:mtd-patchcore", "builtin:skab-wstat"))
    assert main(["check-config", str(path)]) == EX_CONFIG
    err = capsys.readouterr().err
    assert "streams[0].model: skab-wstat is a sensor model" in err
    assert "use a sensor source" in err
