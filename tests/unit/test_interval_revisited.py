"""An interval stored again because the stream's timestamps went back to it (a wall clock set
back) is logged as that, not as "the agent restarted within it", and nothing is lost: every
reading is in a stored aggregate (real SQLite files; an agent with a live stream whose clock
steps back 90 s)."""

from __future__ import annotations

import dataclasses
import logging
import sqlite3
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from agent.app import Agent
from agent.config.loader import parse_config
from agent.errors import SourceExhausted
from agent.metrics import Metrics
from agent.records import Reading
from agent.sources.base import Emit, Reject
from agent.store.sqlite import Store
from agent.systemd import Notifier
from tests.unit.test_store import make_aggregate

T0 = 1_700_000_040.0  # an interval start (multiple of 60 s)
RESTARTED = "(the agent restarted within it)"
WENT_BACK = "by this process (the stream's timestamps went back to it: a clock step back)"


def stored_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "was already stored" in r.getMessage()]


def test_the_cause_of_a_stored_interval_is_told_apart(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    db = tmp_path / "agent.db"
    first = make_aggregate(T0)
    with Store(db) as store:
        assert store.add_aggregate(first, "part")
    caplog.set_level(logging.INFO, logger="agent.store")
    with Store(db) as store:  # the next process
        assert store.add_aggregate(dataclasses.replace(first, count=7), "part")
        assert stored_lines(caplog)[-1].endswith(f"{RESTARTED}; these readings are stored as "
                                                 "part gw1:pump1:1700000040000:1")
        # the same process again (a step back), and an interval only the last process stored
        assert store.add_aggregate(dataclasses.replace(first, count=8), "part")
        assert WENT_BACK in stored_lines(caplog)[-1]
        assert store.add_aggregate(make_aggregate(T0 + 60), "part")
        assert store.add_aggregate(dataclasses.replace(make_aggregate(T0 + 60), count=9), "part")
        assert WENT_BACK in stored_lines(caplog)[-1]
    with Store(db) as store:
        assert store.add_aggregate(dataclasses.replace(first, count=10), "part")
        assert RESTARTED in stored_lines(caplog)[-1]
        ids = [a["aggregate_id"] for a in store.aggregates()]
    assert sorted(ids) == sorted([
        "gw1:pump1:1700000040000", *(f"gw1:pump1:1700000040000:{k}" for k in (1, 2, 3)),
        "gw1:pump1:1700000100000", "gw1:pump1:1700000100000:1"])


CHANNELS = ("Accelerometer1RMS", "Accelerometer2RMS", "Current", "Pressure", "Temperature",
            "Thermocouple", "Voltage", "Volume Flow RateRMS")


class SteppedLiveSource:
    """1 Hz readings from T0 for 150 s, then the wall clock is set back 90 s and 100 more."""

    stream: str = "s1"
    channels: tuple[str, ...] = CHANNELS
    stamps = [T0 + i for i in range(150)] + [T0 + 60 + i for i in range(100)]

    def run(self, emit: Emit, reject: Reject, stop: threading.Event) -> None:
        rng = np.random.default_rng(0)
        for t in self.stamps:
            emit(Reading(self.stream, t, 1.0 + 0.01 * rng.standard_normal(len(CHANNELS)),
                         received_mono=time.monotonic()))
        raise SourceExhausted("end", stream=self.stream)


def test_a_live_stream_stepped_back_keeps_every_reading_and_says_why(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = parse_config(
        f'[agent]\ndevice_id = "gw"\nstate_dir = "{tmp_path / "state"}"\n'
        'console_alerts = false\n[mqtt]\nenabled = false\n[[streams]]\nname = "s1"\n'
        'model = "builtin:skab-wstat"\nbackend = "onnxruntime"\n[streams.source]\n'
        'kind = "serial"\nport = "/dev/null"\nchannels = [' +
        ", ".join(f'"{c}"' for c in CHANNELS) + "]\n", env={}).resolved(tmp_path)
    caplog.set_level(logging.INFO)
    agent = Agent(config, Metrics(), console=None, notifier=Notifier(""),
                  sources={"s1": SteppedLiveSource()})
    agent.run()
    lines = stored_lines(caplog)
    assert len(lines) == 2 and all(WENT_BACK in line for line in lines), lines
    assert not [r for r in caplog.records if RESTARTED in r.getMessage()]
    conn = sqlite3.connect(tmp_path / "state" / "agent.db")
    try:
        counts = dict(conn.execute("SELECT aggregate_id, count FROM aggregates").fetchall())
    finally:
        conn.close()
    assert sum(counts.values()) == len(SteppedLiveSource.stamps)  # every reading, once
    assert counts == {"gw:s1:1700000040000": 60, "gw:s1:1700000100000": 60,
                      "gw:s1:1700000160000": 30, "gw:s1:1700000100000:1": 60,
                      "gw:s1:1700000160000:1": 40}
