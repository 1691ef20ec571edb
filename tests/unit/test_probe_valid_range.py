"""``edge-agent probe`` rejects what ``run`` rejects: a reading outside the stream's
``valid_range`` or beyond a float32 (``1e39``) is ``REJECTED out_of_range``, not a reading
(the probe counted it as read while ``run`` dropped it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.cli import main

HEADER = "time,a,b"


def _config(tmp_path: Path, rows: list[str], extra: str = "") -> Path:
    (tmp_path / "rec.csv").write_text("\n".join([HEADER, *rows]) + "\n")
    path = tmp_path / "agent.toml"
    path.write_text(
        '[agent]\ndevice_id = "gw"\nstate_dir = "st"\n[[streams]]\nname = "s"\n'
        'model = "builtin:skab-wstat"\n' + extra +
        '[streams.source]\nkind = "replay"\npath = "rec.csv"\ntime_column = "time"\n'
        'speed = 0\nchannels = ["a", "b"]\n'
    )
    return path


def test_probe_rejects_out_of_range_readings_as_run_does(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = ["1700000000,1.0,2.0", "1700000001,1e39,2.0", "1700000002,1.0,-5.0",
            "1700000003,1.5,2.5"]
    config = _config(tmp_path, rows,
                     '[[streams.valid_range]]\nchannel = "b"\nlow = 0.0\nhigh = 10.0\n')
    assert main(["probe", "--config", str(config), "--seconds", "5"]) == 0
    out = capsys.readouterr().out
    assert "REJECTED out_of_range: a = 1e+39 outside its valid range" in out
    assert "REJECTED out_of_range: b = -5 outside its valid range [0, 10]" in out
    assert "s: 2 readings, 2 rejected (out_of_range 2), 0 errors" in out


def test_probe_names_a_valid_range_on_a_channel_the_source_lacks(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _config(tmp_path, ["1700000000,1.0,2.0"],
                     '[[streams.valid_range]]\nchannel = "c"\nlow = 0.0\nhigh = 1.0\n')
    main(["probe", "--config", str(config), "--seconds", "5"])
    assert "valid_range names channel 'c'" in capsys.readouterr().out
