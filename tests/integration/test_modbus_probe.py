"""``edge-agent probe`` and ``edge-agent sim-modbus`` against real Modbus servers.

The probe reads pymodbus's server in-process (its output captured); the SKAB recording is served
by a separate ``edge-agent sim-modbus`` process and read back through ``edge-agent probe``.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.cli import EX_CONFIG, main
from agent.sources.modbus_map import encode_float32
from agent.sources.modbus_sim import SimServer
from tests.conftest import _accepts, _free_port
from tests.integration.test_serial_pty import wait_for

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SKAB = REPO.parent / "shared" / "datasets" / "skab" / "valve1" / "0.csv"


def config(tmp_path: Path, port: int, extra: str = "") -> Path:
    path = tmp_path / "agent.toml"
    path.write_text(f"""
[[streams]]
name = "plc"
[streams.source]
kind = "modbus"
port = {port}
poll_interval_s = 0.05
timeout_s = 0.2
reconnect_initial_s = 0.05
channels = [
    {{ name = "level", address = 0, type = "float32" }},
    {{ name = "alarm", table = "coil", address = 0, type = "bool" }},
]
{extra}""")
    return path


@pytest.fixture
def server() -> Iterator[SimServer]:
    sim = SimServer(_free_port(), coils=[True])
    sim.set_holding(0, encode_float32(4.25))
    sim.start()
    yield sim
    sim.stop()


def json_lines(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_probe_prints_readings_and_exits_0(tmp_path: Path, server: SimServer,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    path = config(tmp_path, server.port)
    assert main(["probe", "--config", str(path), "--seconds", "0.5", "--json"]) == 0
    events = json_lines(capsys.readouterr().out)
    readings = [e for e in events if "values" in e]
    assert readings and readings[0]["values"] == {"level": 4.25, "alarm": 1.0}
    (summary,) = [e for e in events if "summary" in e]
    assert summary == {"stream": "plc", "summary": {"readings": len(readings), "rejected": {},
                                                    "errors": 0}}
    assert main(["probe", "--config", str(path), "--seconds", "0.3"]) == 0
    assert "plc  level=4.25 alarm=1" in capsys.readouterr().out


def test_probe_shows_every_rejection_and_exits_1(tmp_path: Path, server: SimServer,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    server.exception_code = 6
    path = config(tmp_path, server.port)
    assert main(["probe", "--config", str(path), "--seconds", "0.5"]) == 1
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "REJECTED" in line]
    assert len(lines) >= 3
    assert all("REJECTED exception_device_busy: exception response 6" in line for line in lines)
    assert f"plc: 0 readings, {len(lines)} rejected (exception_device_busy {len(lines)})" in out


def test_probe_with_nothing_to_read_exits_1(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = config(tmp_path, _free_port())
    assert main(["probe", "--config", str(path), "--seconds", "0.5", "--json"]) == 1
    events = json_lines(capsys.readouterr().out)
    assert any("cannot connect" in str(e.get("down")) for e in events)
    assert events[-1]["summary"]["readings"] == 0  # type: ignore[index]


def test_probe_of_an_unknown_stream_is_a_config_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    path = config(tmp_path, _free_port())
    assert main(["probe", "--config", str(path), "--stream", "nope"]) == EX_CONFIG
    assert "--stream: no stream named 'nope' (streams: plc)" in capsys.readouterr().err


@pytest.mark.dataset
def test_sim_modbus_serves_the_recording_in_real_time(tmp_path: Path) -> None:
    if not SKAB.is_file():
        pytest.skip(f"dataset not present: {SKAB}")
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    sim = subprocess.Popen([sys.executable, "-m", "agent.cli", "sim-modbus", "--csv", str(SKAB),
                            "--port", str(port), "--speed", "20"], env=env,
                           stdout=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: _accepts("127.0.0.1", port), timeout=30.0)
        path = tmp_path / "agent.toml"
        path.write_text((REPO / "systemd" / "skab-modbus.toml").read_text()
                        .replace("port = 5020", f"port = {port}")
                        .replace('"../state/skab-modbus"', f'"{tmp_path}/state"'))
        probe = subprocess.run([sys.executable, "-m", "agent.cli", "probe", "--config",
                                str(path), "--seconds", "1", "--json"], env=env,
                               capture_output=True, text=True, timeout=60, check=False)
        assert probe.returncode == 0, probe.stderr
        readings = [e["values"] for e in json_lines(probe.stdout) if "values" in e]
        assert len(readings) >= 5
        rows = _rows_as_float32(SKAB)
        assert all(tuple(r.values()) in rows for r in readings)
        assert len({tuple(r.values()) for r in readings}) >= 2  # the rows advance
    finally:
        sim.terminate()
        sim.wait(10)
    assert sim.stdout is not None
    assert '{ name = "Accelerometer1RMS", address = 0, type = "float32" },' in sim.stdout.read()


def _rows_as_float32(path: Path) -> set[tuple[float, ...]]:
    """The recording's rows as the float32 values a Modbus client decodes."""
    rows = set()
    for line in path.read_text().splitlines()[1:]:
        fields = line.split(";")[1:9]
        rows.add(tuple(struct.unpack(">f", struct.pack(">f", float(f)))[0] for f in fields))
    return rows
