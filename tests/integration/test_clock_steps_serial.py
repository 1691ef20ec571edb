"""A live serial stream whose wall clock is set back, or forward, an hour, through a real pty and
a real agent (pipeline, rules, SQLite store): the readings carry no timestamp, so the serial source
stamps them with the wall clock it is given, as NTP would step it.

The peer writes SKAB valve1/0.csv's rows as CSV lines. The wall and monotonic clocks handed to
the source run ``SPEED`` times faster than real time, so one row a second of simulated time
takes ``1 / SPEED`` s; the wall clock steps back (or forward) an hour between the file's two
anomalies.
Before: the second anomaly did not alert (the cooldown compared wall-clock times) and the
interval open at the step took in every later reading, so nothing was uploaded until shutdown.
Now both alert and the interval closes; with the backward step the agent uploads to a real
``edge-fleet serve``, which holds intervals from after the step while the agent still runs.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import serial

from agent.app import Agent
from agent.config.loader import parse_config
from agent.metrics import Metrics
from agent.sources.serial import SerialConfig, SerialSource
from tests.integration.fleet_peer import FleetProcess
from tests.integration.test_agent_e2e import skab_dir
from tests.integration.test_serial_pty import pty_pair  # noqa: F401 - the fixture

pytestmark = pytest.mark.integration

SPEED = 50.0  # simulated seconds per real second
STEP_AT_ROW = 660  # between the alerts at rows ~615 and ~706
T0 = 1_700_000_000.0


class SteppedClocks:
    """Wall and monotonic clocks SPEED times faster than real time; the wall one is set by
    ``size_s`` (-3600: back an hour) once ``step()`` is called."""

    def __init__(self, size_s: float = -3600.0) -> None:
        self._m0 = time.monotonic()
        self.offset = 0.0
        self.size_s = size_s

    def mono(self) -> float:
        return 1000.0 + (time.monotonic() - self._m0) * SPEED

    def wall(self) -> float:
        return T0 + self.mono() + self.offset

    def step(self) -> None:
        self.offset = self.size_s


@pytest.fixture
def fleet(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[FleetProcess | None]:
    """A real ``edge-fleet serve`` for the parameters that ask for one (``with_fleet``)."""
    if not request.node.callspec.params["with_fleet"]:
        yield None
        return
    proc = FleetProcess(tmp_path / "fleet", device_id="gw-test")
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def _fleet_starts(proc: FleetProcess) -> list[float]:
    """Interval starts (epoch s) of the aggregates the fleet holds."""
    db = sqlite3.connect(proc.db_path, timeout=30)
    try:
        rows = db.execute("SELECT interval_start FROM aggregates").fetchall()
    finally:
        db.close()
    return [dt.datetime.fromisoformat(str(v)).replace(tzinfo=dt.timezone.utc).timestamp()
            if isinstance(v, str) else float(v) for (v,) in rows]


@pytest.mark.parametrize(("size_s", "direction", "with_fleet"),
                         [(-3600.0, "back", True), (3600.0, "forward", False)])
def test_wall_clock_stepped_on_a_live_serial_stream(
    tmp_path: Path, pty_pair: tuple[int, str],  # noqa: F811 - the fixture
    size_s: float, direction: str, with_fleet: bool, fleet: FleetProcess | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    master, port = pty_pair
    lines = (skab_dir() / "valve1" / "0.csv").read_text().splitlines()
    channels = [c for c in lines[0].split(";") if c not in ("datetime", "anomaly", "changepoint")]
    rows = [",".join(r.split(";")[1:1 + len(channels)]) for r in lines[1:] if r.strip()]
    config = parse_config(
        f'[agent]\ndevice_id = "gw-test"\nstate_dir = "{tmp_path / "state"}"\n'
        'console_alerts = false\n[mqtt]\nenabled = false\n'
        '[[streams]]\nname = "s1"\n[streams.rules]\ncooldown_s = 30.0\n'
        f'[streams.source]\nkind = "serial"\nport = "{port}"\nchannels = {channels!r}\n'
        .replace("'", '"') + ("" if fleet is None else
        f'[fleet]\nenabled = true\nurl = "{fleet.url}"\ntoken_env = "EDGE_TEST_TOKEN"\n'
        'interval_s = 0.5\nhealth_interval_s = 0\n'), env={},
    ).resolved(tmp_path)
    if fleet is not None:
        monkeypatch.setenv("EDGE_TEST_TOKEN", fleet.token)
    clocks = SteppedClocks(size_s)
    src_cfg = config.streams[0].source
    assert isinstance(src_cfg, SerialConfig)
    opened = threading.Event()

    def open_port(*args: Any, **kwargs: Any) -> Any:
        port = serial.serial_for_url(*args, **kwargs)  # flushes the input as it opens
        opened.set()
        return port

    source = SerialSource(src_cfg.model_copy(update={"read_timeout_s": 0.05}), "s1",
                          serial_factory=open_port, clock=clocks.wall, monotonic=clocks.mono)
    metrics = Metrics()
    agent = Agent(config, metrics, console=None, sources={"s1": source})
    runner = threading.Thread(target=agent.run, daemon=True)
    runner.start()
    try:
        assert opened.wait(60), "the agent never opened the port"
        start = time.monotonic()
        for i, row in enumerate(rows):
            if i == STEP_AT_ROW:
                clocks.step()
            due = start + i / SPEED
            time.sleep(max(0.0, due - time.monotonic()))
            os.write(master, row.encode() + b"\n")
        time.sleep(1.0)
        if fleet is not None:  # readings after the step are stamped before the first one
            first = T0 + 1000.0
            deadline = time.monotonic() + 30
            while not [t for t in _fleet_starts(fleet) if t < first]:
                assert time.monotonic() < deadline, (
                    "the fleet holds no interval from after the backward step while the agent "
                    f"runs: {sorted(_fleet_starts(fleet))}")
                time.sleep(0.2)
    finally:
        agent.request_stop()
        runner.join(30)
    assert not runner.is_alive()
    db = sqlite3.connect(tmp_path / "state" / "agent.db")
    try:
        alerts = [p for (p,) in db.execute("SELECT payload FROM alerts")
                  if json.loads(p).get("event", "raised") == "raised"]  # not updated/cleared
        counts = [c for (c,) in db.execute("SELECT count FROM aggregates")]
        readings = sum(counts)
    finally:
        db.close()
    assert readings == len(rows)  # every row arrived
    assert len(alerts) == 2, alerts  # one per anomaly of the file, before and after the step
    assert max(counts) < 2 * 60, counts  # the interval open at the step was closed
    steps = {d: metrics.registry.get_sample_value(
        "edge_agent_clock_steps_total", {"stream": "s1", "direction": d}) or 0.0
        for d in ("back", "forward")}
    assert steps == {d: float(d == direction) for d in steps}  # found once, in its direction
