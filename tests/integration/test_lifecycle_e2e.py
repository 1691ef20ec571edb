"""Alert lifecycle and retained state through ``edge-agent run`` (a subprocess, a real mosquitto),
and the replay rule for alert ids: the same recording replayed gives the same ids."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import MosquittoBroker
from tests.integration.mqtt_subscriber import Subscriber
from tests.integration.test_agent_e2e import (
    ALERTS,
    DEVICE,
    FAST_RULES,
    SKAB_FILE,
    AgentProcess,
    replay_source,
    run_agent,
    simulator_source,
    skab_dir,
    stored_alerts,
    subscribers,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.integration

__all__ = ["run_agent", "subscribers"]  # fixtures used here

EVENTS = f"edge/{DEVICE}/s1/events"
STATE = f"edge/{DEVICE}/s1/state"
ALL_EVENTS = ("raised", "updated", "cleared")


def first_copies(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: set[str] = set()
    out = []
    for item in items:
        if item["alert_id"] not in seen:
            seen.add(item["alert_id"])
            out.append(item)
    return out


def test_episodes_and_retained_state_through_edge_agent_run(
    tmp_path: Path, mosquitto: MosquittoBroker, subscribers: Callable[..., Subscriber],
    run_agent: Callable[..., AgentProcess],
) -> None:
    sub = subscribers(mosquitto, [EVENTS, ALERTS])
    config = write_config(tmp_path / "agent.toml", simulator_source(),
                          broker_port=mosquitto.port, rules=FAST_RULES)
    agent = run_agent(["run", "--config", str(config)], tmp_path)
    assert agent.wait(60) == 0, agent.stderr()[-3000:]

    stored = stored_alerts(tmp_path / "state" / "agent.db", ALL_EVENTS)
    kinds = [a["payload"]["event"] for a in stored]
    assert "raised" in kinds and "cleared" in kinds, kinds
    wait_until(lambda: len(first_copies([json.loads(m.payload) for m in sub.messages(EVENTS)]))
               >= len(stored), 10, "every event on the events topic")
    got = first_copies([json.loads(m.payload) for m in sub.messages(EVENTS)])
    assert [e["alert_id"] for e in got] == [a["alert_id"] for a in stored]
    assert all(m.qos == 1 and not m.retain for m in sub.messages(EVENTS))
    # each episode: raised, then updated events, then cleared (the last may still be open)
    episodes: dict[str, list[str]] = {}
    for e in got:
        assert e["schema"] == 2
        if e["event"] == "raised":
            assert e["episode_id"] == e["alert_id"] and e["episode_id"] not in episodes
        else:
            assert e["episode_id"] in episodes, "an event of an episode never raised"
            assert episodes[e["episode_id"]][-1] != "cleared"
        episodes.setdefault(e["episode_id"], []).append(e["event"])
    # the deprecated alerts topic keeps getting the raised events, nothing else
    legacy = first_copies([json.loads(m.payload) for m in sub.messages(ALERTS)])
    assert [a["alert_id"] for a in legacy] == list(episodes)

    # a consumer connecting after the run still sees the stream's last state at once
    late = subscribers(mosquitto, [STATE])
    wait_until(lambda: late.messages(STATE) != [], 10, "the retained state")
    msg = late.messages(STATE)[-1]
    state = json.loads(msg.payload)
    assert msg.retain and msg.qos == 1
    assert state["stream"] == "s1" and state["kind"] == "sensor"
    assert state["status"] == "finished", state  # the simulator's duration_s ended normally
    assert state["model_name"] == "skab-wstat" and state["threshold"] > 0


@pytest.mark.dataset
def test_replaying_a_recording_twice_yields_the_same_alert_ids(
    tmp_path: Path, run_agent: Callable[..., AgentProcess],
) -> None:
    csv_path = skab_dir() / SKAB_FILE
    ids = []
    for name in ("first", "second"):  # two gateways, or a state directory started afresh
        where = tmp_path / name
        where.mkdir()
        # recalibrated at each start, so each run scores the same windows (a restored
        # calibration would also score the first 400 readings: other windows, other events)
        config = write_config(where / "agent.toml", replay_source(csv_path, 0),
                              stream="recalibrate_on_start = true")
        agent = run_agent(["run", "--config", str(config)], where)
        assert agent.wait(60) == 0, agent.stderr()[-3000:]
        ids.append([a["alert_id"] for a in stored_alerts(where / "state" / "agent.db",
                                                          ALL_EVENTS)])
    assert ids[0], "no alert raised on the recording"
    assert ids[0] == ids[1]
    # the same state directory again: every event is already stored, none is added
    where = tmp_path / "first"
    agent = run_agent(["run", "--config", str(where / "agent.toml")], where)
    assert agent.wait(60) == 0, agent.stderr()[-3000:]
    assert [a["alert_id"] for a in stored_alerts(where / "state" / "agent.db",
                                                  ALL_EVENTS)] == ids[0]


@pytest.mark.dataset
def test_a_finished_replay_leaves_its_retained_state_finished_not_degraded(
    tmp_path: Path, mosquitto: MosquittoBroker, subscribers: Callable[..., Subscriber],
    run_agent: Callable[..., AgentProcess],
) -> None:
    """A recorded file (``loop`` false) that reached its end left the retained state
    ``degraded`` (its source's health is yellow, "exhausted") although nothing was wrong."""
    sub = subscribers(mosquitto, [STATE])
    config = write_config(tmp_path / "agent.toml", replay_source(skab_dir() / SKAB_FILE, 0),
                          broker_port=mosquitto.port)
    agent = run_agent(["run", "--config", str(config)], tmp_path)
    assert agent.wait(60) == 0, agent.stderr()[-3000:]
    def statuses() -> list[str]:
        return [json.loads(m.payload)["status"] for m in sub.messages(STATE)]

    wait_until(lambda: "finished" in statuses(), 10, f"a finished state: {statuses()}")
    assert statuses()[-1] == "finished", statuses()
    late = subscribers(mosquitto, [STATE])  # what a consumer connecting now is given
    wait_until(lambda: late.messages(STATE) != [], 10, "the retained state")
    msg = late.messages(STATE)[-1]
    state = json.loads(msg.payload)
    assert msg.retain and state["status"] == "finished", state
    assert state["threshold"] is not None and state["score"] is not None, state
