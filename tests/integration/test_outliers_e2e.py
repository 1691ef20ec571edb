"""Huge finite readings through the real ``edge-agent`` process: SKAB valve1/0.csv replayed with
one injected row.

Before: one ``1e39`` in the calibration period crashed the agent (``ValueError: Out of range
float values are not JSON compliant`` saving the calibration); one ``1e20`` there raised the
threshold from 5.1 to 9.7 and no fault alerted; after calibration, windows holding such a value
scored NaN and vanished uncounted. Now a value no float32 model input holds is rejected at the
source (``out_of_range``), a far-out one is left out of the calibration, and a window whose
score is not finite is scored off-scale, counted and alerted on.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.test_agent_e2e import (  # noqa: F401 - run_agent is a fixture
    SKAB_FILE,
    AgentProcess,
    replay_source,
    run_agent,
    skab_dir,
    stored_alerts,
    stored_calibration,
    write_config,
)

pytestmark = pytest.mark.integration

CALIBRATED = re.compile(r"stream s1: calibrated on (\d+) readings, threshold ([0-9.]+)")


def with_value(dest: Path, row: int, channel: str, value: str) -> Path:
    """SKAB_FILE with ``channel`` of data row ``row`` (0-based) replaced by ``value``."""
    lines = (skab_dir() / SKAB_FILE).read_text().splitlines()
    col = lines[0].split(";").index(channel)
    fields = lines[1 + row].split(";")
    fields[col] = value
    lines[1 + row] = ";".join(fields)
    dest.write_text("\n".join(lines) + "\n")
    return dest


def replay(tmp: Path, csv: Path, run_agent: Callable[..., AgentProcess]) -> AgentProcess:  # noqa: F811
    tmp.mkdir()
    config = write_config(tmp / "agent.toml", replay_source(csv, 0))
    agent = run_agent(["run", "--config", str(config)], tmp)
    agent.wait(60)
    return agent


def calibration(agent: AgentProcess) -> tuple[int, float]:
    found = CALIBRATED.search(agent.stderr())
    assert found, agent.stderr()[-3000:]
    return int(found.group(1)), float(found.group(2))


@pytest.fixture
def clean(tmp_path: Path, run_agent: Callable[..., AgentProcess]) -> tuple[float, int]:  # noqa: F811
    """Threshold and alert count of the unmodified file."""
    agent = replay(tmp_path / "clean", skab_dir() / SKAB_FILE, run_agent)
    assert agent.proc.returncode == 0, agent.stderr()[-3000:]
    alerts = stored_alerts(tmp_path / "clean" / "state" / "agent.db")
    assert alerts
    return calibration(agent)[1], len(alerts)


@pytest.mark.parametrize(("value", "where"), [("1e39", "source"), ("1e20", "calibration")])
def test_one_huge_reading_in_the_calibration_period(
    tmp_path: Path, run_agent: Callable[..., AgentProcess], clean: tuple[float, int],  # noqa: F811
    value: str, where: str,
) -> None:
    threshold, n_alerts = clean
    csv = with_value(tmp_path / "huge.csv", 100, "Current", value)
    agent = replay(tmp_path / "run", csv, run_agent)
    err = agent.stderr()
    assert agent.proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err
    readings, fitted = calibration(agent)
    if where == "source":  # rejected at the source: the calibration takes the next reading
        assert "record rejected (out_of_range)" in err and "Current = 1e+39" in err
        assert readings == 400
    else:  # accepted (a float32 holds it), left out of the fit
        assert "1 far-out reading(s) left out of the calibration" in err
        assert readings == 399
    assert fitted == pytest.approx(threshold, rel=0.03)
    db = tmp_path / "run" / "state" / "agent.db"
    assert stored_calibration(db)[4] == pytest.approx(fitted, abs=1e-3)  # what the next start uses
    assert len(stored_alerts(db)) == n_alerts
    # the next start restores it (the readings it was fitted on are stored with it)
    again = run_agent(["run", "--config", str(tmp_path / "run" / "agent.toml")], tmp_path / "run")
    assert again.wait(60) == 0, again.stderr()[-3000:]
    assert "calibration restored (fitted " in again.stderr() and f"threshold {fitted:.3f})" in (
        again.stderr()), again.stderr()[-3000:]


def test_a_reading_the_model_cannot_represent_after_calibration_alerts(
    tmp_path: Path, run_agent: Callable[..., AgentProcess], clean: tuple[float, int],  # noqa: F811
) -> None:
    n_alerts = clean[1]
    csv = with_value(tmp_path / "huge.csv", 450, "Current", "3e38")  # a float32, z overflows
    agent = replay(tmp_path / "run", csv, run_agent)
    err = agent.stderr()
    assert agent.proc.returncode == 0, err[-3000:]
    assert re.search(r"stream s1: \d+ window\(s\) scored non-finite", err), err[-3000:]
    alerts = stored_alerts(tmp_path / "run" / "state" / "agent.db")
    off_scale = [a for a in alerts if a["payload"]["score"] > 1e300]
    assert len(off_scale) == 1, [a["payload"]["score"] for a in alerts]
    top = off_scale[0]["payload"]["top_channels"]
    assert top[0]["channel"] == "Current" and top[0]["contribution"] == 1.0
    assert len(alerts) == n_alerts + 1  # its own episode, before the valve fault
