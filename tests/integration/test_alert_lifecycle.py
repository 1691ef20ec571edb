"""Alert lifecycle and retained stream state against a real mosquitto.

A real agent (in-process :class:`agent.app.Agent`, its real store and MQTT publisher) fed by a
source the test steers between normal readings and a fault, so an episode is raised and cleared
exactly when the test wants: broker restarts and agent restarts fall inside an episode.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent.app import Agent
from agent.config.loader import parse_config
from agent.records import Reading
from tests.conftest import MosquittoBroker, _require_mosquitto
from tests.integration.mqtt_subscriber import Subscriber, subscriber_factory

pytestmark = pytest.mark.integration

CHANNELS = ("Accelerometer1RMS", "Accelerometer2RMS", "Current", "Pressure", "Temperature",
            "Thermocouple", "Voltage", "Volume Flow RateRMS")
EVENTS = "edge/gw1/pump/events"
STATE = "edge/gw1/pump/state"
ALERTS = "edge/gw1/alerts"


class SteeredSource:
    """Readings 1 s apart (stream time) in bursts; ``fault`` set adds an offset on one channel
    (the shipped model alerts on it), cleared gives normal readings again."""

    def __init__(self, stream: str, start_ts: float = 1_700_000_000.0) -> None:
        self.stream = stream
        self.channels = CHANNELS
        self.fault = threading.Event()
        self.emitted = 0
        self._ts = start_ts
        self._rng = np.random.default_rng(7)
        self._level = np.linspace(1.0, 8.0, len(CHANNELS))

    def run(self, emit: Callable[[Reading], None], reject: object, stop: threading.Event) -> None:
        while not stop.is_set():
            for _ in range(20):
                values = self._level + self._rng.normal(0.0, 0.1, len(CHANNELS))
                if self.fault.is_set():
                    values[2] += 3.0
                emit(Reading(self.stream, self._ts, values, time.monotonic()))
                self._ts += 1.0
                self.emitted += 1
            time.sleep(0.01)


class Running:
    """An agent running in a thread until :meth:`stop`."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.code: int | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.code = self.agent.run()

    def stop(self) -> None:
        self.agent.request_stop("test")
        self.thread.join(30)
        assert not self.thread.is_alive(), "the agent did not stop"


def make_agent(tmp_path: Path, port: int, source: SteeredSource, mqtt: str = "") -> Agent:
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
[streams.rules]
cooldown_s = 0
update_ratio = 0
[mqtt]
enabled = true
host = "127.0.0.1"
port = {port}
keepalive_s = 5
reconnect_min_s = 1
reconnect_max_s = 1
state_interval_s = 0.5
{mqtt}
"""
    config = parse_config(text, env={}).resolved(tmp_path)
    return Agent(config, sources={"pump": source})


def wait_until(pred: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


def stored_events(db: Path) -> list[dict[str, Any]]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        rows = conn.execute("SELECT payload, published_at FROM alerts ORDER BY id").fetchall()
    finally:
        conn.close()
    return [{**json.loads(p), "_published": pub is not None} for p, pub in rows]


def events(sub: Subscriber) -> list[dict[str, Any]]:
    return [json.loads(m.payload) for m in sub.messages(EVENTS)]


def first_copies(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each alert_id's first delivery (consumers deduplicate by alert_id)."""
    seen: set[str] = set()
    out = []
    for item in items:
        if item["alert_id"] not in seen:
            seen.add(item["alert_id"])
            out.append(item)
    return out


@pytest.fixture
def subscribers() -> Iterator[Callable[..., Subscriber]]:
    yield from subscriber_factory(Subscriber)  # type: ignore[misc]


def calibrated(agent: Agent) -> bool:
    state = agent.board.get("pump")
    return state is not None and state.threshold is not None


def test_raised_and_cleared_arrive_in_order_after_a_broker_restart_mid_episode(
    tmp_path: Path, mosquitto_persistent: MosquittoBroker,
    subscribers: Callable[..., Subscriber],
) -> None:
    broker = mosquitto_persistent
    sub = subscribers(broker, [EVENTS, ALERTS], persistent=True)
    source = SteeredSource("pump")
    run = Running(make_agent(tmp_path, broker.port, source))
    try:
        wait_until(lambda: calibrated(run.agent), 60, "the calibration")
        source.fault.set()
        wait_until(lambda: any(e["event"] == "raised" for e in events(sub)), 60,
                   "the raised event")
        raised = next(e for e in events(sub) if e["event"] == "raised")
        assert raised["episode_id"] == raised["alert_id"]

        # a late subscriber sees the present at once: the retained state of the open episode
        late = subscribers(broker, [STATE])
        wait_until(lambda: any(json.loads(m.payload)["status"] == "anomalous"
                               for m in late.messages(STATE)), 10, "the retained state")
        first = late.messages(STATE)[0]
        assert first.retain and first.qos == 1
        assert json.loads(first.payload)["episode_id"] == raised["alert_id"]

        broker.stop()  # mid-episode: the cleared event waits in the outbox
        source.fault.clear()
        db = tmp_path / "state" / "agent.db"
        wait_until(lambda: any(e["event"] == "cleared" for e in stored_events(db)), 60,
                   "the cleared event in the outbox")
        cleared = next(e for e in stored_events(db) if e["event"] == "cleared")
        assert not cleared["_published"]
        broker.start()
        wait_until(lambda: any(e["event"] == "cleared" for e in events(sub)), 60,
                   "the cleared event after the restart")
    finally:
        run.stop()
    got = first_copies(events(sub))
    episode = [e for e in got if e["episode_id"] == raised["alert_id"]]
    assert [e["event"] for e in episode] == ["raised", "cleared"]
    assert episode[1]["peak_score"] >= raised["score"]
    assert episode[1]["schema"] == 2 and episode[1]["alert_id"] != raised["alert_id"]
    # the deprecated alerts topic: the raised events only (schema 2), the same payloads
    legacy = first_copies([json.loads(m.payload) for m in sub.messages(ALERTS)])
    assert [a["event"] for a in legacy] == ["raised"] * len(legacy)
    assert raised in legacy
    # every stored event reached the consumer, in outbox order
    assert [e["alert_id"] for e in got] == [e["alert_id"] for e in stored_events(db)]


def test_an_agent_restart_mid_episode_still_clears_the_episode(
    tmp_path: Path, mosquitto: MosquittoBroker, subscribers: Callable[..., Subscriber],
) -> None:
    sub = subscribers(mosquitto, [EVENTS])
    source = SteeredSource("pump")
    run = Running(make_agent(tmp_path, mosquitto.port, source))
    try:
        wait_until(lambda: calibrated(run.agent), 60, "the calibration")
        source.fault.set()
        wait_until(lambda: any(e["event"] == "raised" for e in events(sub)), 60,
                   "the raised event")
        reg = run.agent.metrics.registry
        labels = {"stream": "pump"}
        assert reg.get_sample_value("edge_agent_stream_anomaly_active", labels) == 1
        threshold = reg.get_sample_value("edge_agent_stream_threshold", labels)
        score = reg.get_sample_value("edge_agent_stream_score", labels)
        assert threshold is not None and threshold > 0 and score is not None
    finally:
        run.stop()  # the episode is still open: the fault goes on
    raised = next(e for e in events(sub) if e["event"] == "raised")
    conn = sqlite3.connect(tmp_path / "state" / "agent.db")
    try:
        assert conn.execute("SELECT episode_id FROM episodes").fetchall() == [
            (raised["alert_id"],)]
    finally:
        conn.close()

    # the next agent (calibration restored) sees normal readings and ends the same episode
    again = SteeredSource("pump", start_ts=source._ts)
    run = Running(make_agent(tmp_path, mosquitto.port, again))
    try:
        assert run.agent.board.get("pump").episode_id == raised["alert_id"]  # type: ignore[union-attr]
        wait_until(lambda: any(e["event"] == "cleared" for e in events(sub)), 60,
                   "the cleared event from the restarted agent")
        assert run.agent.metrics.registry.get_sample_value(
            "edge_agent_stream_anomaly_active", {"stream": "pump"}) == 0
    finally:
        run.stop()
    cleared = next(e for e in events(sub) if e["event"] == "cleared")
    assert cleared["episode_id"] == raised["alert_id"]
    assert not [e for e in first_copies(events(sub)) if e["event"] == "raised"
                and e["alert_id"] != raised["alert_id"]]


@pytest.fixture
def no_retain_broker(tmp_path: Path) -> Iterator[MosquittoBroker]:
    broker = MosquittoBroker(_require_mosquitto(), tmp_path / "no-retain",
                             extra_config=["retain_available false"])
    broker.start()
    try:
        yield broker
    finally:
        broker.kill()


def test_a_broker_that_refuses_retained_messages_still_gets_every_alert(
    tmp_path: Path, no_retain_broker: MosquittoBroker, subscribers: Callable[..., Subscriber],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # mosquitto refuses a CONNECT with a retained will (MQTT 5: "Retain not supported") and
    # drops a client that publishes a retained message
    sub = subscribers(no_retain_broker, [EVENTS, ALERTS, STATE])
    source = SteeredSource("pump")
    run = Running(make_agent(tmp_path, no_retain_broker.port, source))
    try:
        wait_until(lambda: run.agent.publisher is not None and run.agent.publisher.connected,
                   30, "the connection")
        wait_until(lambda: calibrated(run.agent), 60, "the calibration")
        source.fault.set()
        wait_until(lambda: any(e["event"] == "raised" for e in events(sub)), 60,
                   "the raised event")
        source.fault.clear()
        wait_until(lambda: any(e["event"] == "cleared" for e in events(sub)), 60,
                   "the cleared event")
        wait_until(lambda: sub.messages(STATE) != [], 10, "a state message")
    finally:
        run.stop()
    assert [json.loads(m.payload)["event"] for m in sub.messages(ALERTS)][:1] == ["raised"]
    assert not any(m.retain for m in sub.messages(STATE))
    assert any("Retain not supported" in r.getMessage() for r in caplog.records)
    m = run.agent.metrics.registry
    assert (m.get_sample_value("edge_agent_mqtt_state_total",
                               {"result": "retain_refused"}) or 0) > 0


def _two_streams(tmp_path: Path, port: int, streams: tuple[str, ...]) -> str:
    text = f"""
[agent]
device_id = "gw1"
state_dir = "{tmp_path / 'state'}"
console_alerts = false
[mqtt]
enabled = true
host = "127.0.0.1"
port = {port}
keepalive_s = 5
reconnect_min_s = 1
reconnect_max_s = 1
"""
    for name in streams:
        text += f"""
[[streams]]
name = "{name}"
model = "builtin:skab-wstat"
[streams.source]
kind = "simulator"
"""
    return text


def test_a_stream_removed_by_a_reload_loses_its_retained_state(
    tmp_path: Path, mosquitto: MosquittoBroker, subscribers: Callable[..., Subscriber],
) -> None:
    both = parse_config(_two_streams(tmp_path, mosquitto.port, ("pump", "fan")),
                        env={}).resolved(tmp_path)
    kept = parse_config(_two_streams(tmp_path, mosquitto.port, ("pump",)),
                        env={}).resolved(tmp_path)
    sub = subscribers(mosquitto, ["edge/gw1/+/state"])
    agent = Agent(both, sources={"pump": SteeredSource("pump"), "fan": SteeredSource("fan")},
                  reload=lambda: kept)
    run = Running(agent)
    fan = "edge/gw1/fan/state"
    wait_until(lambda: sub.messages(fan) != [] and sub.messages(STATE) != [], 30,
               "both states")
    agent.request_reload()
    run.thread.join(30)
    assert not run.thread.is_alive() and agent.next_config is kept
    wait_until(lambda: sub.messages(fan)[-1].payload == b"", 10, "the removal of fan's state")
    late = subscribers(mosquitto, ["edge/gw1/+/state"])
    wait_until(lambda: late.messages(STATE) != [], 10, "pump's retained state")
    time.sleep(0.5)  # retained messages come right after the SUBACK, before this
    assert late.messages(fan) == []
