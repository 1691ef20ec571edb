"""check-config reads what run reads: camera files and folders, credential files.

A missing camera video or folder, and a password or token file that is empty or not UTF-8,
passed ``check-config`` (exit 0) and then failed at run time.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.cli import main
from agent.exitcodes import EX_CONFIG

SENSOR = """
[agent]
device_id = "gw1"
[[streams]]
name = "pump"
[streams.source]
kind = "simulator"
"""


def _check(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    path = tmp_path / "agent.toml"
    path.write_text(text, encoding="utf-8")
    rc = main(["check-config", str(path)])
    return rc, capsys.readouterr().err


@pytest.mark.parametrize(("line", "key"), [('path = "missing.avi"', "source.path"),
                                           ('folder = "missing"', "source.folder")])
def test_missing_camera_input_is_a_config_problem(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, key: str) -> None:
    text = SENSOR + f"""
[[streams]]
name = "cam1"
model = "builtin:mtd-patchcore"
[streams.source]
kind = "camera"
{line}
"""
    rc, err = _check(tmp_path, text, capsys)
    assert rc == EX_CONFIG
    assert f"streams[1].{key}: no such" in err and "missing" in err
    assert "Traceback" not in err


def test_existing_camera_folder_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "frames").mkdir()
    text = SENSOR + """
[[streams]]
name = "cam1"
model = "builtin:mtd-patchcore"
[streams.source]
kind = "camera"
folder = "frames"
"""
    assert _check(tmp_path, text, capsys)[0] == 0


@pytest.mark.parametrize(("content", "says"), [(b"", "is empty"),
                                               (b"\xff\xfesecret", "cannot read")])
def test_bad_mqtt_password_file(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                content: bytes, says: str) -> None:
    (tmp_path / "pw").write_bytes(content)
    text = SENSOR + '[mqtt]\nenabled = true\nusername = "u"\npassword_file = "pw"\n'
    rc, err = _check(tmp_path, text, capsys)
    assert rc == EX_CONFIG and "mqtt.password_file" in err and says in err


def test_empty_fleet_token_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "gw1.token").write_text("\n")
    text = SENSOR + ('[fleet]\nenabled = true\nurl = "http://127.0.0.1:9"\n'
                     'token_file = "gw1.token"\n')
    rc, err = _check(tmp_path, text, capsys)
    assert rc == EX_CONFIG and "fleet.token_file" in err and "empty" in err


def test_good_credentials_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "pw").write_text("secret\n")
    (tmp_path / "gw1.token").write_text("tok\n")
    text = SENSOR + ('[mqtt]\nenabled = true\nusername = "u"\npassword_file = "pw"\n'
                     '[fleet]\nenabled = true\nurl = "http://127.0.0.1:9"\n'
                     'token_file = "gw1.token"\n')
    rc, err = _check(tmp_path, text, capsys)
    assert rc == 0, err


SKAB_CHANNELS = ["Accelerometer1RMS", "Accelerometer2RMS", "Current", "Pressure", "Temperature",
                 "Thermocouple", "Voltage", "Volume Flow RateRMS"]


def _replay(tmp_path: Path, header: list[str]) -> str:
    rows = ";".join(header) + "\n" + ";".join(
        ["2020-01-01 00:00:00"] + ["1.0"] * (len(header) - 1)) + "\n"
    (tmp_path / "rec.csv").write_text(rows, encoding="utf-8")
    return """
[agent]
device_id = "gw1"
[[streams]]
name = "pump"
model = "builtin:skab-wstat"
[streams.source]
kind = "replay"
path = "rec.csv"
"""


def test_replay_without_the_models_channels_is_a_config_problem(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """run refused it with exit 78 while check-config said OK (a tester's find)."""
    text = _replay(tmp_path, ["datetime", *SKAB_CHANNELS[:-1]])
    rc, err = _check(tmp_path, text, capsys)
    assert rc == EX_CONFIG
    assert "streams[0].model: needs channels ['Volume Flow RateRMS']" in err


def test_replay_without_a_time_column_is_a_config_problem(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = _replay(tmp_path, ["when", *SKAB_CHANNELS])
    rc, err = _check(tmp_path, text, capsys)
    assert rc == EX_CONFIG and "streams[0].source.path: replay file has no time column" in err


def test_replay_with_the_models_channels_passes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _check(tmp_path, _replay(tmp_path, ["datetime", *SKAB_CHANNELS]), capsys)[0] == 0


def test_a_fleet_ca_file_that_is_not_a_certificate(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "gw1.token").write_text("tok\n")
    (tmp_path / "gw1.token").chmod(0o600)
    (tmp_path / "ca.pem").write_text("not a certificate\n")
    text = SENSOR + ('[fleet]\nenabled = true\nurl = "https://127.0.0.1:9"\n'
                     'token_file = "gw1.token"\nca_file = "ca.pem"\n')
    rc, err = _check(tmp_path, text, capsys)
    assert rc == EX_CONFIG and "fleet.ca_file: cannot load" in err


@pytest.mark.parametrize("state_dir", ["afile/st", "afile"], ids=["under-a-file", "a-file"])
def test_a_state_dir_that_cannot_be_a_directory_is_a_config_problem(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], state_dir: str) -> None:
    (tmp_path / "afile").write_text("not a directory\n")
    text = SENSOR.replace('device_id = "gw1"', f'device_id = "gw1"\nstate_dir = "{state_dir}"')
    rc, err = _check(tmp_path, text, capsys)
    assert rc == EX_CONFIG
    assert f"agent.state_dir: {str(tmp_path / 'afile')!r} is not a directory" in err
    # run refuses it the same way (before: "cannot create the state lock", exit 1)
    assert main(["run", "--config", str(tmp_path / "agent.toml")]) == EX_CONFIG
    assert "agent.state_dir:" in capsys.readouterr().err


def test_a_state_dir_to_be_created_in_a_writable_folder_passes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = SENSOR.replace('device_id = "gw1"', 'device_id = "gw1"\nstate_dir = "new/deeper"')
    rc, err = _check(tmp_path, text, capsys)
    assert rc == 0, err
    assert not (tmp_path / "new").exists()  # check-config creates nothing


@pytest.mark.parametrize(("path", "says"), [
    ("{tmp}", "'{tmp}' is a directory, not a file"),
    ("/dev/null", "'/dev/null' is not a regular file (a device or a pipe)"),
    ("{tmp}/missing.csv", "no such file '{tmp}/missing.csv'"),
], ids=["directory", "device", "missing"])
def test_a_replay_path_that_is_no_file_says_what_it_is(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], path: str, says: str) -> None:
    text = f"""
[agent]
device_id = "gw1"
[[streams]]
name = "pump"
model = "builtin:skab-wstat"
[streams.source]
kind = "replay"
path = "{path.format(tmp=tmp_path)}"
"""
    rc, err = _check(tmp_path, text, capsys)
    assert rc == EX_CONFIG
    assert f"streams[0].source.path: {says.format(tmp=tmp_path)}" in err, err
