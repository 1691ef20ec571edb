"""A live serial stream whose wall clock is set back an hour, through a real pty and a real
agent (pipeline, rules, SQLite store): the readings carry no timestamp, so the serial source
stamps them with the wall clock it is given, as NTP would step it.

The peer writes SKAB valve1/0.csv's rows as CSV lines. The wall and monotonic clocks handed to
the source run ``SPEED`` times faster than real time, so one row a second of simulated time
takes ``1 / SPEED`` s; the wall clock steps back an hour between the file's two anomalies.
Before: the second anomaly did not alert (the cooldown compared wall-clock times) and the
interval open at the step took in every later reading. Now both alert and the interval closes.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import serial

from agent.app import Agent
from agent.config.loader import parse_config
from agent.metrics import Metrics
from agent.sources.serial import SerialConfig, SerialSource
from tests.integration.test_agent_e2e import skab_dir
from tests.integration.test_serial_pty import pty_pair  # noqa: F401 - the fixture

pytestmark = pytest.mark.integration

SPEED = 50.0  # simulated seconds per real second
STEP_AT_ROW = 660  # between the alerts at rows ~615 and ~706
T0 = 1_700_000_000.0


class SteppedClocks:
    """Wall and monotonic clocks SPEED times faster than real time; the wall one is set back
    3600 s once ``step()`` is called."""

    def __init__(self) -> None:
        self._m0 = time.monotonic()
        self.offset = 0.0

    def mono(self) -> float:
        return 1000.0 + (time.monotonic() - self._m0) * SPEED

    def wall(self) -> float:
        return T0 + self.mono() + self.offset

    def step(self) -> None:
        self.offset = -3600.0


def test_wall_clock_set_back_on_a_live_serial_stream(
    tmp_path: Path, pty_pair: tuple[int, str]  # noqa: F811 - the fixture
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
        .replace("'", '"'), env={},
    ).resolved(tmp_path)
    clocks = SteppedClocks()
    src_cfg = config.streams[0].source
    assert isinstance(src_cfg, SerialConfig)
    opened = threading.Event()

    def open_port(*args: Any, **kwargs: Any) -> Any:
        port = serial.serial_for_url(*args, **kwargs)  # flushes the input as it opens
        opened.set()
        return port

    source = SerialSource(src_cfg.model_copy(update={"read_timeout_s": 0.05}), "s1",
                          serial_factory=open_port, clock=clocks.wall, monotonic=clocks.mono)
    agent = Agent(config, Metrics(), console=None, sources={"s1": source})
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
