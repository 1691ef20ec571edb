"""Home Assistant MQTT discovery against a real mosquitto, the real alerts publisher and store.

The StateBoard is fed directly (the pipeline's feed is another component). "Retained" is
checked the way Home Assistant sees it: a subscriber that connects after the publish gets the
config messages with the retain flag. Every wait polls with a deadline.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from prometheus_client import CollectorRegistry

from agent.metrics import Metrics
from agent.publish.homeassistant import HomeAssistantDiscovery
from agent.publish.mqtt import MqttConfig, MqttPublisher
from agent.publish.mqtt_config import HomeAssistantConfig
from agent.publish.stream_state import StateBoard, StreamState
from agent.store.sqlite import Store
from tests.conftest import MosquittoBroker
from tests.integration.mqtt_subscriber import Subscriber as MqttSubscriber
from tests.integration.mqtt_subscriber import subscriber_factory
from tests.integration.sparkplug_host import wait_until

pytestmark = pytest.mark.integration

DEVICE = "gw1"
AVAILABILITY = f"edge/{DEVICE}/availability"
CONFIG_TOPIC = re.compile(r"^homeassistant/(binary_sensor|sensor)/gw1/[a-zA-Z0-9_-]+/config$")

#: The configuration variables Home Assistant documents for MQTT binary sensors and sensors
#: (home-assistant.io/integrations/binary_sensor.mqtt/ and /sensor.mqtt/), and for discovery
#: messages (origin); anything else would be ignored by Home Assistant, i.e. a mistake here.
COMMON_KEYS = {
    "availability", "availability_mode", "availability_template", "availability_topic",
    "default_entity_id", "device", "device_class", "enabled_by_default", "encoding",
    "entity_category", "entity_picture", "expire_after", "force_update", "icon",
    "json_attributes_template", "json_attributes_topic", "name", "origin",
    "payload_available", "payload_not_available", "qos", "state_topic", "unique_id",
    "value_template",
}
KEYS = {
    "binary_sensor": COMMON_KEYS | {"off_delay", "payload_off", "payload_on"},
    "sensor": COMMON_KEYS | {"last_reset_value_template", "options", "state_class",
                             "suggested_display_precision", "unit_of_measurement"},
}
DEVICE_KEYS = {"configuration_url", "connections", "hw_version", "identifiers", "manufacturer",
               "model", "model_id", "name", "serial_number", "suggested_area", "sw_version",
               "via_device"}
ORIGIN_KEYS = {"name", "sw_version", "support_url"}


class Subscriber(MqttSubscriber):
    device = DEVICE


@pytest.fixture
def subscribers() -> Iterator[Callable[..., Subscriber]]:
    yield from subscriber_factory(Subscriber)  # type: ignore[misc]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "agent.db")
    yield s
    s.close()


@pytest.fixture
def publishers() -> Iterator[list[MqttPublisher]]:
    made: list[MqttPublisher] = []
    yield made
    for pub in made:
        pub.stop()


def start_agent_side(broker: MosquittoBroker, store: Store, made: list[MqttPublisher],
                     streams: list[str], board: StateBoard, metrics: Metrics,
                     enabled: bool = True) -> HomeAssistantDiscovery:
    config = MqttConfig(enabled=True, host=broker.host, port=broker.port, keepalive_s=5,
                        reconnect_min_s=1, reconnect_max_s=1,
                        homeassistant=HomeAssistantConfig(enabled=enabled))
    pub = MqttPublisher(config, store, DEVICE, metrics, logger=logging.getLogger("test.ha"))
    ha = HomeAssistantDiscovery(config.homeassistant, pub, DEVICE, "edge", streams, metrics)
    ha.attach(board)
    made.append(pub)
    pub.start()
    return ha


def stop_last(made: list[MqttPublisher]) -> None:
    made.pop().stop()


def retained_configs(broker: MosquittoBroker, subscribers: Callable[..., Subscriber]
                     ) -> dict[str, dict[str, Any]]:
    """What a subscriber that connects now gets retained under this node (empty = none)."""
    sub = subscribers(broker, ["homeassistant/+/gw1/+/config"])
    last = {"n": -1, "since": time.monotonic()}

    def settled() -> bool:  # retained messages come right after the SUBACK
        n, now = len(sub.messages()), time.monotonic()
        if n != last["n"]:
            last.update(n=n, since=now)
            return False
        return now - last["since"] >= 0.3

    wait_until(settled, 10, "the retained messages")
    seen: dict[str, dict[str, Any]] = {}
    for m in sub.messages():
        if m.retain and m.payload:  # a live (not retained) publish is not what HA would see
            seen[m.topic] = json.loads(m.payload)
    sub.close()
    return seen


def published(metrics: Metrics, action: str) -> float:
    value = metrics.registry.get_sample_value("edge_agent_ha_discovery_total",
                                              {"action": action})
    return value or 0.0


def test_discovery_configs_are_retained_and_hold_only_documented_keys(
    mosquitto: MosquittoBroker, store: Store, publishers: list[MqttPublisher],
    subscribers: Callable[..., Subscriber],
) -> None:
    metrics = Metrics(CollectorRegistry())
    start_agent_side(mosquitto, store, publishers, ["pump1", "line.2"], StateBoard(), metrics)
    wait_until(lambda: published(metrics, "published") >= 4, 15, "4 config messages")
    wait_until(lambda: len(retained_configs(mosquitto, subscribers)) == 4, 10,
               "4 retained configs")
    configs = retained_configs(mosquitto, subscribers)
    unique_ids = set()
    for topic, payload in configs.items():
        component = CONFIG_TOPIC.match(topic)
        assert component, topic
        kind = component.group(1)
        assert set(payload) <= KEYS[kind], set(payload) - KEYS[kind]
        assert set(payload["device"]) <= DEVICE_KEYS
        assert set(payload["origin"]) <= ORIGIN_KEYS
        assert payload["device"]["identifiers"] == [DEVICE]
        assert payload["device"]["sw_version"] and payload["origin"]["name"]
        assert payload["availability_topic"] == AVAILABILITY
        assert (payload["payload_available"], payload["payload_not_available"]) == (
            "online", "offline")
        stream = "pump1" if "pump1" in topic else "line.2"
        assert payload["state_topic"] == f"edge/{DEVICE}/{stream}/state"
        assert payload["default_entity_id"] == f"{kind}.{payload['unique_id'].lower()}"
        assert re.fullmatch(r"[a-z0-9_]+", payload["default_entity_id"].split(".", 1)[1])
        unique_ids.add(payload["unique_id"])
        if kind == "binary_sensor":
            assert payload["device_class"] == "problem"
        else:
            assert payload["state_class"] == "measurement"
    assert len(unique_ids) == 4


def test_value_templates_read_the_state_payload() -> None:
    jinja2 = pytest.importorskip("jinja2")
    ha = HomeAssistantDiscovery(MqttConfig(enabled=True).homeassistant, None,  # type: ignore[arg-type]
                                DEVICE, "edge", ["pump1"], Metrics(CollectorRegistry()))
    env = jinja2.Environment()

    def render(kind: Any, state: StreamState) -> str:
        template = ha.config_payload(kind, "pump1")["value_template"]
        return str(env.from_string(str(template)).render(
            value_json=json.loads(json.dumps(state.to_payload()))))

    anomalous = StreamState("pump1", "sensor", "anomalous", 2.5, 1.0, "ae", 3, "gw1:pump1:1", 1.0)
    calibrating = StreamState("pump1", "sensor", "calibrating", None, None, "ae", 3, None, 1.0)
    assert render("binary_sensor", anomalous) == "ON"
    assert render("binary_sensor", calibrating) == "OFF"
    assert render("sensor", anomalous) == "2.5"
    assert render("sensor", calibrating) == "None"  # Home Assistant's "unknown"


def test_a_removed_stream_loses_its_entities_at_once_and_after_a_restart(
    mosquitto: MosquittoBroker, store: Store, publishers: list[MqttPublisher],
    subscribers: Callable[..., Subscriber],
) -> None:
    board = StateBoard()
    metrics = Metrics(CollectorRegistry())
    start_agent_side(mosquitto, store, publishers, ["pump1", "pump2", "pump3"], board, metrics)
    wait_until(lambda: len(retained_configs(mosquitto, subscribers)) == 6, 15, "6 configs")

    board.update(StreamState("pump3", "sensor", "normal", 0.1, 1.0, "ae", 3, None, 1.0))
    board.remove("pump3")  # removed at run time
    wait_until(lambda: not any("pump3" in t for t in retained_configs(mosquitto, subscribers)),
               10, "pump3's configs removed")
    stop_last(publishers)

    # a restart with pump2 gone from the config
    start_agent_side(mosquitto, store, publishers, ["pump1"], StateBoard(), metrics)
    wait_until(lambda: set(retained_configs(mosquitto, subscribers)) == {
        "homeassistant/binary_sensor/gw1/pump1_anomaly/config",
        "homeassistant/sensor/gw1/pump1_score/config"}, 15, "only pump1's configs")
    stop_last(publishers)

    # discovery turned off: the agent removes its entities
    start_agent_side(mosquitto, store, publishers, ["pump1"], StateBoard(), metrics,
                     enabled=False)
    wait_until(lambda: retained_configs(mosquitto, subscribers) == {}, 15, "no configs")
    assert published(metrics, "removed") >= 6


def test_home_assistant_birth_republishes_the_discovery(
    mosquitto: MosquittoBroker, store: Store, publishers: list[MqttPublisher],
    subscribers: Callable[..., Subscriber],
) -> None:
    metrics = Metrics(CollectorRegistry())
    sub = subscribers(mosquitto, ["homeassistant/sensor/gw1/pump1_score/config"])
    start_agent_side(mosquitto, store, publishers, ["pump1"], StateBoard(), metrics)
    wait_until(lambda: len(sub.messages()) == 1, 15, "the first config message")
    ha = paho.Client(CallbackAPIVersion.VERSION2, client_id="ha-birth")
    ha.connect(mosquitto.host, mosquitto.port)
    ha.loop_start()
    try:
        ha.publish("homeassistant/status", "offline", qos=1).wait_for_publish(5)
        ha.publish("homeassistant/status", "online", qos=1).wait_for_publish(5)
        wait_until(lambda: len(sub.messages()) == 2, 10, "the config again after the birth")
    finally:
        ha.disconnect()
        ha.loop_stop()
    assert published(metrics, "birth") == 1
