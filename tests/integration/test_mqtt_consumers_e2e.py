"""``edge-agent run`` with Home Assistant discovery and Sparkplug B output both enabled, against a
real mosquitto, seen by a Home Assistant-like subscriber and a protobuf-decoding Sparkplug host.

Uses the harness of :mod:`tests.integration.test_agent_e2e` (subprocess, config writer, the
simulator source). Every wait polls with a deadline.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import MosquittoBroker
from tests.integration.mqtt_subscriber import Subscriber as MqttSubscriber
from tests.integration.mqtt_subscriber import subscriber_factory
from tests.integration.sparkplug_host import SparkplugHost, wait_until
from tests.integration.test_agent_e2e import (
    DEVICE,
    AgentProcess,
    simulator_source,
    write_config,
)

pytestmark = pytest.mark.integration

CONSUMERS = '\n[mqtt.homeassistant]\nenabled = true\n\n[mqtt.sparkplug]\nenabled = true\n' \
            'group_id = "plant1"\n'


class Subscriber(MqttSubscriber):
    device = DEVICE


@pytest.fixture
def subscribers() -> Iterator[Callable[..., Subscriber]]:
    yield from subscriber_factory(Subscriber)  # type: ignore[misc]


@pytest.fixture
def agents() -> Iterator[list[AgentProcess]]:
    made: list[AgentProcess] = []
    yield made
    for a in made:
        a.kill()


def test_edge_agent_run_publishes_discovery_and_a_sparkplug_session(
    tmp_path: Path, mosquitto: MosquittoBroker, subscribers: Callable[..., Subscriber],
    agents: list[AgentProcess],
) -> None:
    ha = subscribers(mosquitto, ["homeassistant/#", f"edge/{DEVICE}/availability"])
    host = SparkplugHost(mosquitto)
    try:
        config = write_config(tmp_path / "agent.toml", simulator_source(),
                              broker_port=mosquitto.port)
        config.write_text(config.read_text() + CONSUMERS)
        agent = AgentProcess(["run", "--config", str(config)], tmp_path)
        agents.append(agent)

        binary = f"homeassistant/binary_sensor/{DEVICE}/s1_anomaly/config"
        sensor = f"homeassistant/sensor/{DEVICE}/s1_score/config"
        wait_until(lambda: ha.messages(binary) and ha.messages(sensor), 60,
                   "the discovery configs of stream s1", agent.stderr)
        anomaly = json.loads(ha.messages(binary)[-1].payload)
        assert anomaly["state_topic"] == f"edge/{DEVICE}/s1/state"
        assert anomaly["availability_topic"] == f"edge/{DEVICE}/availability"
        assert anomaly["device"]["identifiers"] == [DEVICE]
        late = subscribers(mosquitto, ["homeassistant/+/+/+/config"])
        wait_until(lambda: {m.topic for m in late.messages() if m.retain} == {binary, sensor},
                   10, "both configs retained")

        wait_until(lambda: host.messages("DBIRTH", "s1"), 60, "NBIRTH and DBIRTH of s1",
                   agent.stderr)
        nbirth = host.messages("NBIRTH")[0]
        assert nbirth.topic == f"spBv1.0/plant1/NBIRTH/{DEVICE}"
        assert nbirth.value("bdSeq") == 0
        dbirth = host.messages("DBIRTH", "s1")[0]
        assert {m.name for m in dbirth.payload.metrics} == {
            "Anomaly/Score", "Anomaly/Threshold", "Anomaly/Active", "Status", "Model/Version"}

        agent.terminate()
        assert agent.wait(60) == 0, agent.stderr()
        wait_until(lambda: host.messages("NDEATH"), 10, "NDEATH on stop")
        assert host.messages("NDEATH")[0].value("bdSeq") == nbirth.value("bdSeq")
        wait_until(lambda: ha.availability()[-1:] == ["offline"], 10, "availability offline")
        assert (tmp_path / "state" / "sparkplug.bdseq").is_file()
    finally:
        host.close()
