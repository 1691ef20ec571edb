"""Model updates end to end: a real agent, readings flowing, packages over a real HTTP server.

The server is :class:`tests.integration.model_fleet.FakeFleet` (``http.server`` implementing the
device side of the model-loop contract with Range support and fault injection); packages are
signed copies of ``models/skab-wstat`` with bumped versions.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from agent.app import Agent
from agent.config.loader import parse_config
from agent.errors import SourceExhausted
from agent.records import Reading
from cloud_sync.package import generate_keypair
from tests.integration.model_fleet import SOURCE_PACKAGE, FakeFleet, make_package

pytestmark = pytest.mark.integration

CHANNELS = tuple(json.loads((SOURCE_PACKAGE / "manifest.json").read_text())["input"]["channels"])
CALIBRATION = 400
TOKEN = "device-token"


class FlowingSource:
    """Readings at a steady pace until ``finish`` is set, then a fixed tail, then exhausted.

    Noise around fixed channel levels, with a 30-sample offset on one channel every 300 samples
    (alerts). Counts every reading it emitted.
    """

    def __init__(self, stream: str, finish: threading.Event, tail: int = 200,
                 per_burst: int = 20, pause_s: float = 0.01) -> None:
        self.stream = stream
        self.channels = CHANNELS
        self.finish = finish
        self.tail = tail
        self.per_burst = per_burst
        self.pause_s = pause_s
        self.emitted = 0
        self._rng = np.random.default_rng(7)
        self._level = np.linspace(1.0, 8.0, len(CHANNELS))

    def _reading(self) -> Reading:
        i = self.emitted
        values = self._level + self._rng.normal(0.0, 0.1, len(CHANNELS))
        if i > CALIBRATION and i % 300 < 30:
            values[2] += 3.0
        return Reading(self.stream, 1_700_000_000.0 + i, values, time.monotonic())

    def run(self, emit: Callable[[Reading], None], reject: object, stop: threading.Event) -> None:
        left: int | None = None
        while not stop.is_set():
            if left is None and self.finish.is_set():
                left = self.tail
            for _ in range(self.per_burst):
                emit(self._reading())
                self.emitted += 1
                if left is not None:
                    left -= 1
                    if left <= 0:
                        raise SourceExhausted("tail done")
            time.sleep(self.pause_s)


@pytest.fixture
def fleet() -> Iterator[FakeFleet]:
    with FakeFleet(TOKEN) as f:
        yield f


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    """(private key file, trusted keys directory holding its public half)."""
    priv, _pub = generate_keypair(tmp_path / "keys")
    trusted = tmp_path / "trusted"
    trusted.mkdir()
    (trusted / _pub.name).write_bytes(_pub.read_bytes())
    return priv, trusted


def _agent(tmp_path: Path, fleet: FakeFleet, trusted: Path, source: FlowingSource,
           monkeypatch: pytest.MonkeyPatch, shadow: int = 50) -> Agent:
    monkeypatch.setenv("EDGE_TEST_TOKEN", TOKEN)
    text = f"""
[agent]
device_id = "gw1"
state_dir = "{tmp_path / 'state'}"
console_alerts = false
[[streams]]
name = "pump"
model = "builtin:skab-wstat"
[streams.source]
kind = "simulator"
[fleet]
enabled = true
url = "{fleet.url}"
token_env = "EDGE_TEST_TOKEN"
interval_s = 0.5
[updater]
enabled = true
poll_interval_s = 0.2
trusted_keys_dir = "{trusted}"
shadow_windows = {shadow}
acceptance_runs = 20
"""
    config = parse_config(text, env={}).resolved(tmp_path)
    return Agent(config, sources={"pump": source})


def _wait_for(cond: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


def _windows_scored(agent: Agent) -> float:
    return agent.metrics.registry.get_sample_value(
        "edge_agent_windows_total", {"stream": "pump"}
    ) or 0.0


def test_shadow_then_swap_while_readings_flow_drops_nothing(
    tmp_path: Path, fleet: FakeFleet, keys: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """v1 (builtin) → v2 through every state, without a dropped reading or a broken alert id."""
    priv, trusted = keys
    finish = threading.Event()
    source = FlowingSource("pump", finish)
    agent = _agent(tmp_path, fleet, trusted, source, monkeypatch)
    fleet.publish(make_package(tmp_path, 2, priv), tmp_path)
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    _wait_for(lambda: (2, "active") in fleet.states())
    time.sleep(1.0)  # the post-swap watch and more alerts on v2
    finish.set()
    thread.join(30)
    assert not thread.is_alive()
    assert [s for _, s in fleet.states()] == [
        "downloaded", "verified", "accepted", "shadow", "active",
    ]
    assert _windows_scored(agent) == source.emitted - CALIBRATION
    rows = sqlite3.connect(tmp_path / "state" / "agent.db").execute(
        "SELECT alert_id, seq, payload FROM alerts ORDER BY seq"
    ).fetchall()
    assert [r[1] for r in rows] == list(range(1, len(rows) + 1))
    assert [r[0] for r in rows] == [f"gw1:pump:{r[1]}" for r in rows]
    versions = [json.loads(r[2])["model"]["version"] for r in rows]
    assert versions == sorted(versions) and versions[-1] == 2 and versions[0] == 1
    state = json.loads((tmp_path / "state" / "models" / "active.json").read_text())
    assert state["streams"]["pump"]["active"]["version"] == 2
    assert agent.metrics.registry.get_sample_value(
        "edge_agent_model_version", {"stream": "pump"}) == 2
