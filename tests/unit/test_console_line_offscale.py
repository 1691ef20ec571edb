"""Console lines of off-scale scores: an ``edge-agent run`` over a recorded file in which one
reading overflows the model (scored 1.8e308, detection-robustness.md) prints the peak in a few
characters, not as a 309-digit number."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agent.cli import main
from agent.records import Alert

DATASETS = Path(__file__).resolve().parents[2].parent / "shared" / "datasets"


def test_a_cleared_line_with_an_off_scale_peak_stays_short() -> None:
    alert = Alert("gw:s:2", "gw", "s", 2, "m", 1, 4.29, 5.26, 0.0, 9.0, 9.0,
                  event="cleared", episode_id="gw:s:1", peak_score=1.7976931348623157e308)
    line = alert.console_line()
    assert "peak 1.8e+308, threshold 5.26" in line
    assert len(line) < 150


def test_run_over_a_recording_with_an_overflowing_reading_prints_short_lines(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = DATASETS / "skab" / "valve1" / "0.csv"
    if not source.is_file():
        pytest.skip(f"SKAB dataset not found at {source} (needs ../shared/datasets)")
    lines = source.read_text().splitlines()
    fields = lines[601].split(";")  # row 600: inside the valve fault, after calibration
    fields[3] = "3e38"              # Current: a float32 holds it, the scaled window does not
    lines[601] = ";".join(fields)
    (tmp_path / "valve.csv").write_text("\n".join(lines) + "\n")
    config = tmp_path / "agent.toml"
    config.write_text(
        '[agent]\ndevice_id = "gw"\nstate_dir = "st"\nconsole_alerts = true\n'
        '[[streams]]\nname = "s"\nmodel = "builtin:skab-wstat"\ncalibration_samples = 400\n'
        '[streams.source]\nkind = "replay"\npath = "valve.csv"\nspeed = 0\nloop = false\n'
    )
    assert main(["run", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    events = [line for line in out.splitlines() if re.match(r"(ALERT|UPDATED|CLEARED) ", line)]
    assert any("e+308" in line for line in events), out  # the off-scale score is shown
    assert all(len(line) < 250 for line in events), out
