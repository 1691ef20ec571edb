"""MqttPublisher against a real mosquitto broker and a real paho subscriber.

Every wait polls with a deadline (``wait_until``); nothing sleeps to make a test pass.

Broker restarts: a subscriber that is not subscribed when the broker comes back would miss
alerts the publisher sends in that moment, and which of the two reconnects first is a race. The
tests that restart the broker therefore use ``mosquitto_persistent`` and a subscriber with a
fixed client id, ``clean_session=False`` and QoS 1: the broker saves that session on SIGTERM and
queues every alert for it while it is away, so the outcome does not depend on reconnect order.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
from prometheus_client import CollectorRegistry

from agent.metrics import Metrics
from agent.publish.mqtt import MqttConfig, MqttPublisher, default_client_factory
from agent.records import Alert, TopChannel
from agent.store.sqlite import Store
from tests.conftest import MosquittoBroker
from tests.integration.mqtt_subscriber import Msg, subscriber_factory
from tests.integration.mqtt_subscriber import Subscriber as MqttSubscriber

pytestmark = pytest.mark.integration

DEVICE = "gw1"
ALERTS = f"edge/{DEVICE}/alerts"
AVAILABILITY = f"edge/{DEVICE}/availability"


def wait_until(pred: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.02)


class Subscriber(MqttSubscriber):
    """The shared recording subscriber, reading this module's device topics."""

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
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def publishers() -> Iterator[list[MqttPublisher]]:
    made: list[MqttPublisher] = []
    yield made
    for pub in made:
        pub.stop()


def make_publisher(
    broker: MosquittoBroker,
    store: Store,
    registry: CollectorRegistry,
    made: list[MqttPublisher],
    **kw: Any,
) -> MqttPublisher:
    config = MqttConfig(
        enabled=True,
        host=broker.host,
        port=broker.port,
        reconnect_min_s=1.0,
        reconnect_max_s=1.0,
        keepalive_s=5,
    )
    pub = MqttPublisher(
        config, store, DEVICE, Metrics(registry), logger=logging.getLogger("test.mqtt"), **kw
    )
    made.append(pub)
    return pub


def raise_alert(store: Store, pub: MqttPublisher, stream: str = "pump1") -> Alert:
    seq = store.next_alert_seq(stream)
    alert = Alert(
        alert_id=f"{DEVICE}:{stream}:{seq}",
        device_id=DEVICE,
        stream=stream,
        seq=seq,
        model_name="ae",
        model_version=2,
        score=3.0 + seq / 1000,
        threshold=1.5,
        window_start=1_700_000_000.0 + seq,
        window_end=1_700_000_001.0 + seq,
        raised_at=1_700_000_001.25 + seq,
        top_channels=(TopChannel("température", 0.6), TopChannel("vib", 0.4)),
    )
    store.add_alert(alert)
    pub.notify(alert.alert_id, time.monotonic())
    return alert


def sample(registry: CollectorRegistry, name: str, labels: dict[str, str] | None = None) -> float:
    value = registry.get_sample_value(name, labels or {})
    return 0.0 if value is None else value


def first_occurrences(ids: list[str]) -> list[str]:
    seen: set[str] = set()
    out = []
    for i in ids:
        if i not in seen:
            seen.add(i)
            out.append(i)
    return out


def test_alerts_payload_topic_qos_and_availability(
    mosquitto: MosquittoBroker,
    store: Store,
    registry: CollectorRegistry,
    publishers: list[MqttPublisher],
    subscribers: Callable[..., Subscriber],
) -> None:
    """Alerts arrive as documented; 'online' is retained after connect, 'offline' after stop."""
    sub = subscribers(mosquitto, [f"edge/{DEVICE}/#"])
    pub = make_publisher(mosquitto, store, registry, publishers)
    pub.start()
    wait_until(lambda: sub.availability() == ["online"], 5, "'online'")

    sent = [raise_alert(store, pub) for _ in range(5)]
    assert pub.flush(5.0)
    wait_until(lambda: len(sub.alert_ids()) == 5, 5, "5 alerts")

    msgs = sub.messages(ALERTS)
    assert [json.loads(m.payload.decode("utf-8")) for m in msgs] == [a.to_payload() for a in sent]
    assert all(m.qos == 1 and not m.retain for m in msgs)
    assert all(r["published_at"] is not None for r in store.alerts())
    assert sample(registry, "edge_agent_mqtt_published_total") == 5
    assert sample(registry, "edge_agent_mqtt_connected") == 1
    assert sample(registry, "edge_agent_read_to_alert_seconds_count", {"stream": "pump1"}) == 5
    wait_until(
        lambda: sample(registry, "edge_agent_outbox_depth") == 0
        and sample(registry, "edge_agent_outbox_oldest_age_seconds") == 0,
        3,
        "outbox gauges at 0",
    )

    late = subscribers(mosquitto, [AVAILABILITY])
    wait_until(lambda: late.messages() != [], 5, "retained availability")
    assert late.messages() == [Msg(AVAILABILITY, b"online", 1, True)]

    pub.stop()
    wait_until(lambda: sub.availability() == ["online", "offline"], 5, "'offline' on stop")
    later = subscribers(mosquitto, [AVAILABILITY])
    wait_until(lambda: later.messages() != [], 5, "retained availability")
    assert later.messages() == [Msg(AVAILABILITY, b"offline", 1, True)]
    assert sample(registry, "edge_agent_mqtt_connected") == 0
    assert sample(registry, "edge_agent_mqtt_disconnects_total") == 0


def test_last_will_when_connection_dies_uncleanly(
    mosquitto: MosquittoBroker,
    store: Store,
    registry: CollectorRegistry,
    publishers: list[MqttPublisher],
    subscribers: Callable[..., Subscriber],
) -> None:
    """Cutting the agent's TCP connection (no DISCONNECT) makes the broker publish the will."""
    clients: list[paho.Client] = []

    def factory(**kw: Any) -> paho.Client:
        client = default_client_factory(**kw)
        clients.append(client)
        return client

    sub = subscribers(mosquitto, [AVAILABILITY])
    pub = make_publisher(mosquitto, store, registry, publishers, client_factory=factory)
    pub.start()
    wait_until(lambda: sub.availability() == ["online"], 5, "'online'")

    sock = clients[0].socket()
    assert isinstance(sock, socket.socket)
    sock.shutdown(socket.SHUT_RDWR)

    wait_until(lambda: sub.availability()[1:2] == ["offline"], 5, "the last will")
    # The publisher reconnects by itself and says so.
    wait_until(lambda: sub.availability()[2:3] == ["online"], 5, "'online' after reconnect")
    assert sample(registry, "edge_agent_mqtt_disconnects_total") == 1
    raise_alert(store, pub)
    assert pub.flush(5.0)


def test_broker_down_at_start_then_everything_delivered_in_order(
    mosquitto_persistent: MosquittoBroker,
    store: Store,
    registry: CollectorRegistry,
    publishers: list[MqttPublisher],
    subscribers: Callable[..., Subscriber],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The agent starts without a broker, buffers alerts, and delivers them all once it is up."""
    broker = mosquitto_persistent
    sub = subscribers(broker, [ALERTS], client_id="sub-down-at-start", persistent=True)
    broker.stop()  # the subscriber's session is saved; the broker is down when the agent starts
    caplog.set_level(logging.INFO, logger="test.mqtt")

    pub = make_publisher(broker, store, registry, publishers)
    began = time.monotonic()
    pub.start()
    assert time.monotonic() - began < 1.0, "start() must not block on the broker"
    sent = [raise_alert(store, pub) for _ in range(30)]
    assert not pub.flush(2.5)  # several reconnect attempts fail meanwhile
    assert store.outbox_stats()[0] == 30
    assert not pub.connected

    broker.start()
    assert pub.flush(8.0)
    expected = [a.alert_id for a in sent]
    wait_until(lambda: len(set(sub.alert_ids())) == 30, 8, "all 30 alerts")
    assert first_occurrences(sub.alert_ids()) == expected

    texts = [r.getMessage() for r in caplog.records if r.name == "test.mqtt"]
    assert sum("unreachable" in t for t in texts) == 1, texts
    assert sum("reachable again" in t for t in texts) == 1, texts


def test_broker_restart_while_alerts_are_raised(
    mosquitto_persistent: MosquittoBroker,
    store: Store,
    registry: CollectorRegistry,
    publishers: list[MqttPublisher],
    subscribers: Callable[..., Subscriber],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No alert is lost or reordered (after dedupe by alert_id) across a broker restart."""
    broker = mosquitto_persistent
    caplog.set_level(logging.INFO, logger="test.mqtt")
    sub = subscribers(broker, [ALERTS], client_id="sub-restart", persistent=True)
    pub = make_publisher(broker, store, registry, publishers)
    pub.start()
    wait_until(lambda: pub.connected, 5, "publisher connected")

    raised: list[str] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            while not stop.is_set():
                raised.append(raise_alert(store, pub).alert_id)
                stop.wait(0.005)
        except BaseException as exc:
            errors.append(exc)

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        wait_until(lambda: len(sub.alert_ids()) >= 30, 5, "first alerts delivered")
        broker.stop()
        wait_until(lambda: not pub.connected, 5, "publisher noticing the loss")
        backlog_from = len(raised)
        wait_until(lambda: len(raised) >= backlog_from + 40, 5, "alerts raised while down")
        assert store.outbox_stats()[0] >= 40
        broker.start()
        wait_until(lambda: pub.connected, 5, "publisher reconnected")
        resumed_at = len(raised)
        wait_until(lambda: len(raised) >= resumed_at + 30, 5, "alerts raised after restart")
    finally:
        stop.set()
        producer.join(5)
    assert not errors

    assert pub.flush(8.0)
    assert store.outbox_stats() == (0, None)
    wait_until(lambda: set(sub.alert_ids()) == set(raised), 8, "every alert delivered")
    ids = sub.alert_ids()
    assert first_occurrences(ids) == raised
    assert raised == [f"{DEVICE}:pump1:{i}" for i in range(1, len(raised) + 1)]
    assert sample(registry, "edge_agent_mqtt_disconnects_total") == 1
    assert sample(registry, "edge_agent_mqtt_published_total") == len(raised)
    texts = [r.getMessage() for r in caplog.records if r.name == "test.mqtt"]
    assert sum("lost the MQTT broker" in t for t in texts) == 1, texts
    assert sum("reachable again" in t for t in texts) == 1, texts
