"""``benchmarks/mqtt_in_drain.py`` at a tiny size: both modes run against a real mosquitto,
print their figures on the last line and leave no work folder behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "mqtt_in_drain.py"


def _run(tmp_path: Path, *args: str) -> dict[str, float]:
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    out = subprocess.run([sys.executable, str(BENCH), *args],
                         env=dict(os.environ, TMPDIR=str(tmp)), capture_output=True, text=True,
                         timeout=180, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert list(tmp.iterdir()) == []
    last = out.stdout.strip().splitlines()[-1]
    return {k: float(v) for k, v in (pair.split("=") for pair in last.split())}


def test_drain_measures_paho_and_the_agent(tmp_path: Path) -> None:
    figures = _run(tmp_path, "--messages", "300", "--repeat", "1")
    assert figures["paho_msgs_s"] > 0 and figures["agent_msgs_s"] > 0
    assert figures["agent_vs_paho"] > 0


def test_flood_counts_what_arrived(tmp_path: Path) -> None:
    figures = _run(tmp_path, "--flood", "--rate", "500", "--messages", "500")
    assert figures["sent"] == 500 and figures["received"] == 500 and figures["lost"] == 0
