"""An episode whose peak keeps rising, through ``edge-agent run`` (a subprocess): a real
mosquitto subscriber receives ``raised``, then ``updated`` events, then ``cleared``, all with the
episode's id, in that order; and a real ``edge-fleet serve`` ends up holding the same events
under the same ids and episode id as the broker carried.

The source is the simulator with a drift fault on the flow channel: the score crosses the
threshold early in the drift (``raised``), grows with it (``updated`` each time the peak reaches
``update_ratio`` x the peak last sent), and falls back under the clear level when the drift ends
(``cleared`` by the hysteresis, long before the simulation ends).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.conftest import MosquittoBroker
from tests.integration.fleet_peer import ADMIN_TOKEN, FleetProcess
from tests.integration.mqtt_subscriber import Subscriber
from tests.integration.test_agent_e2e import AgentProcess, run_agent, subscribers, wait_until

pytestmark = pytest.mark.integration

__all__ = ["run_agent", "subscribers"]  # fixtures used here

DEVICE = "gw1"  # the device the fleet fixture enrolled
EVENTS = f"edge/{DEVICE}/s1/events"
TOKEN_ENV = "EDGE_TEST_FLEET_TOKEN"
UPDATE_RATIO = 1.5


def write_config(path: Path, broker: MosquittoBroker, fleet: FleetProcess | None = None) -> Path:
    """The simulator at 200x for 1,500 s of stream time (calibrated at 400 s), a drift of -60
    noise stds on the flow channel from 600 s to 720 s; ``updated`` at 1.5x the peak sent."""
    fleet_section = "[fleet]\nenabled = false\n"
    if fleet is not None:
        fleet_section = (f'[fleet]\nenabled = true\nurl = "{fleet.url}"\n'
                         f'token_env = "{TOKEN_ENV}"\ninterval_s = 0.5\n')
    path.write_text(f"""
[agent]
device_id = "{DEVICE}"
state_dir = "state"
console_alerts = false

[[streams]]
name = "s1"
model = "builtin:skab-wstat"
[streams.source]
kind = "simulator"
speed = 200
duration_s = 1500
[[streams.source.faults]]
kind = "drift"
channel = "Volume Flow RateRMS"
start_s = 600
duration_s = 120
magnitude = -60.0
[streams.rules]
cooldown_s = 0
update_ratio = {UPDATE_RATIO}
update_interval_s = 0

[mqtt]
enabled = true
host = "{broker.host}"
port = {broker.port}
keepalive_s = 5
reconnect_min_s = 1
reconnect_max_s = 1

{fleet_section}""")
    return path


def first_copies(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each alert_id's first delivery (QoS 1 is at least once; consumers deduplicate)."""
    seen: set[str] = set()
    out = []
    for item in items:
        if item["alert_id"] not in seen:
            seen.add(item["alert_id"])
            out.append(item)
    return out


def received(sub: Subscriber) -> list[dict[str, Any]]:
    return first_copies([json.loads(m.payload) for m in sub.messages(EVENTS)])


def one_episode(events: list[dict[str, Any]]) -> bool:
    return any(e["event"] == "cleared" for e in events)


def check_episode(events: list[dict[str, Any]]) -> None:
    """``raised``, at least one ``updated`` with a peak rising by ``UPDATE_RATIO`` each time,
    then ``cleared``; one episode id, the ``raised`` event's id."""
    kinds = [e["event"] for e in events]
    assert kinds[0] == "raised" and kinds[-1] == "cleared", kinds
    assert kinds[1:-1] and set(kinds[1:-1]) == {"updated"}, kinds
    episode = events[0]["alert_id"]
    assert {e["episode_id"] for e in events} == {episode}
    reported = events[0]["score"]
    for e in events[1:-1]:
        assert e["peak_score"] >= UPDATE_RATIO * reported * (1 - 1e-9), (e, reported)
        reported = e["peak_score"]
    assert events[-1]["peak_score"] >= reported
    assert events[-1]["reason"]


def test_a_rising_episode_reaches_the_broker_raised_updated_cleared_in_order(
    tmp_path: Path, mosquitto: MosquittoBroker, subscribers: Callable[..., Subscriber],
    run_agent: Callable[..., AgentProcess],
) -> None:
    sub = subscribers(mosquitto, [EVENTS])
    config = write_config(tmp_path / "agent.toml", mosquitto)
    agent = run_agent(["run", "--config", str(config)], tmp_path)
    assert agent.wait(60) == 0, agent.stderr()[-3000:]
    wait_until(lambda: one_episode(received(sub)), 10, "the cleared event",
               lambda: str([e["event"] for e in received(sub)]))
    got = received(sub)
    check_episode(got)
    # the broker carried them in the order the agent stored them, at QoS 1, not retained
    from tests.integration.test_agent_e2e import stored_alerts  # noqa: PLC0415

    stored = stored_alerts(tmp_path / "state" / "agent.db", ("raised", "updated", "cleared"))
    assert [e["alert_id"] for e in got] == [a["alert_id"] for a in stored]
    assert all(m.qos == 1 and not m.retain for m in sub.messages(EVENTS))


def test_the_fleet_holds_the_episode_the_broker_carried(
    tmp_path: Path, mosquitto: MosquittoBroker, fleet: FleetProcess,
    subscribers: Callable[..., Subscriber], run_agent: Callable[..., AgentProcess],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(TOKEN_ENV, fleet.token)
    sub = subscribers(mosquitto, [EVENTS])
    config = write_config(tmp_path / "agent.toml", mosquitto, fleet)
    agent = run_agent(["run", "--config", str(config)], tmp_path)
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

    def fleet_alerts() -> list[dict[str, Any]]:
        r = requests.get(f"{fleet.url}/v1/alerts", params={"device": DEVICE}, headers=admin,
                         timeout=10)
        assert r.status_code == 200, r.text
        return list(r.json()["items"])

    wait_until(lambda: one_episode(received(sub)), 60, "the cleared event on the broker",
               lambda: agent.stderr()[-3000:])
    broker = received(sub)
    check_episode(broker)
    wait_until(lambda: {a["id"] for a in fleet_alerts()} >= {e["alert_id"] for e in broker}, 60,
               "the fleet to hold every event", lambda: str(fleet_alerts()))
    assert agent.wait(60) == 0, agent.stderr()[-3000:]
    held = {a["id"]: a for a in fleet_alerts()}
    assert set(held) == {e["alert_id"] for e in broker}  # nothing else, nothing missing
    for e in broker:
        a = held[e["alert_id"]]
        assert (a["event"], a["episode_id"], a["stream"]) == (e["event"], e["episode_id"], "s1")
