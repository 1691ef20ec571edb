"""MQTT in behind a stalled pipeline, against a real mosquitto: paho's loop keeps running (no
missed keepalive, no reconnect, no duplicates), QoS 1 messages are acknowledged only once
queued, and what is dropped beyond the hold limit is counted and logged once."""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from agent.metrics import Metrics
from agent.reading_queue import ReadingQueue
from agent.records import Reading
from agent.services.supervisor import SourceSupervisor
from agent.sources.mqtt_in import MqttInSource
from agent.sources.mqtt_in_config import MqttInConfig
from tests.conftest import MosquittoBroker
from tests.integration.test_mqtt_in import Publisher
from tests.integration.test_serial_pty import sample, wait_for

pytestmark = pytest.mark.integration

TOPIC = "plant/pump1/telemetry"
KEEPALIVE_S = 5


class Agentlike:
    """An MqttInSource under a real SourceSupervisor feeding a small ReadingQueue, as the agent
    wires it (emit = put_until_stopped, offer = offer); nothing takes from the queue until
    :meth:`drain`."""

    def __init__(self, port: int, queue_size: int, hold_limit: int = 1000,
                 client_id: str = "edge-in-bp") -> None:
        config = MqttInConfig.model_validate({
            "port": port, "format": "json", "topics": [TOPIC], "fields": {"k": "k"},
            "keepalive_s": KEEPALIVE_S, "client_id": client_id, "reconnect_initial_s": 0.1,
            "reconnect_max_s": 0.5}, strict=False)
        self.source = MqttInSource(config, "line", hold_limit=hold_limit)
        self.metrics = Metrics(CollectorRegistry())
        self.stop = threading.Event()
        self.queue = ReadingQueue(queue_size, self.stop)
        self.sup = SourceSupervisor(self.source, self.queue.put_until_stopped, self.metrics,
                                    self.stop, logging.getLogger("test.bp"),
                                    backoff_initial_s=0.05, backoff_max_s=0.2,
                                    offer=self.queue.offer)
        self.sup.start()
        self.got: list[float] = []

    def connected(self) -> bool:
        return self.source.connects >= 1 and self.sup.outage is None

    def drain(self, n: int, timeout: float = 20.0) -> bool:
        """Take readings until ``n`` were taken in all (or ``timeout``)."""
        deadline = time.monotonic() + timeout
        while len(self.got) < n and time.monotonic() < deadline:
            try:
                r: Reading = self.queue.get(timeout=0.1)
            except queue.Empty:
                continue
            self.got.append(float(r.values[0]))
        return len(self.got) >= n

    def close(self) -> None:
        self.stop.set()
        self.sup.join(10)
        assert not self.sup.is_alive()


@pytest.fixture
def pub(mosquitto: MosquittoBroker) -> Iterator[Publisher]:
    p = Publisher(mosquitto.port)
    yield p
    p.close()


def _publish(pub: Publisher, ks: range, qos: int = 1) -> None:
    for k in ks:
        pub.client.publish(TOPIC, json.dumps({"k": k}), qos=qos)
    last = pub.client.publish(TOPIC, json.dumps({"k": -1}), qos=qos)  # a marker, read last
    last.wait_for_publish(10)


def test_a_pipeline_stalled_longer_than_keepalive_costs_no_reconnect_and_no_reading(
        mosquitto: MosquittoBroker, pub: Publisher) -> None:
    # the callback used to wait on the full queue inside paho's loop: no PINGREQ, no PUBACK;
    # mosquitto dropped the client after 1.5 keepalives and, on the reconnect, delivered every
    # unacknowledged message again (duplicates), while the stream showed an outage
    agent = Agentlike(mosquitto.port, queue_size=5)
    try:
        assert wait_for(agent.connected, timeout=10)
        _publish(pub, range(100))
        time.sleep(2.5 * KEEPALIVE_S)  # the pipeline takes nothing meanwhile
        assert agent.source.connects == 1 and agent.sup.outage is None
        assert agent.queue.full() and len(agent.source.held) > 0
        assert agent.drain(101)
        time.sleep(0.5)
        agent.drain(102, timeout=0.5)  # nothing more may come (a duplicate would)
        assert agent.got == [float(k) for k in range(100)] + [-1.0]
        assert agent.source.connects == 1 and agent.sup.outage is None
        assert sample(agent.metrics, "edge_agent_records_rejected_total", stream="line",
                      reason="queue_full") == 0
    finally:
        agent.close()
    assert "exceeded timeout" not in mosquitto.log_tail(200)


def test_beyond_the_hold_limit_drops_are_counted_and_logged_once(
        mosquitto: MosquittoBroker, pub: Publisher, caplog: pytest.LogCaptureFixture) -> None:
    # QoS 0 has no inflight window to hold the broker back: past the hold limit the oldest
    # waiting reading goes, counted; the queue keeps the first 5, the hold the newest 10
    caplog.set_level(logging.WARNING, logger="test.bp")
    agent = Agentlike(mosquitto.port, queue_size=5, hold_limit=10)
    try:
        assert wait_for(agent.connected, timeout=10)
        _publish(pub, range(59), qos=0)  # 60 messages with the marker
        dropped = "edge_agent_records_rejected_total"
        assert wait_for(lambda: sample(agent.metrics, dropped, stream="line",
                                       reason="queue_full") == 45, timeout=10)
        assert agent.drain(15)
        assert agent.got == [0.0, 1.0, 2.0, 3.0, 4.0] + [float(k) for k in range(50, 59)] + [-1.0]
        assert agent.source.connects == 1
    finally:
        agent.close()
    lines = [r.getMessage() for r in caplog.records if "queue_full" in r.getMessage()]
    assert len([t for t in lines if "record rejected" in t]) == 1, lines
    assert any("44 more rejected records (queue_full)" in t for t in lines), lines


def test_readings_not_yet_queued_at_stop_come_again_at_the_next_start(
        mosquitto: MosquittoBroker, pub: Publisher) -> None:
    # QoS 1 with a persistent session: what waited unacknowledged at stop is delivered to the
    # next run; what was queued was acknowledged and is not delivered twice
    first = Agentlike(mosquitto.port, queue_size=5, client_id="edge-in-restart")
    try:
        assert wait_for(first.connected, timeout=10)
        _publish(pub, range(15))
        assert wait_for(lambda: first.queue.full() and len(first.source.held) == 11)
    finally:
        first.close()
    assert first.drain(5, timeout=1)
    second = Agentlike(mosquitto.port, queue_size=100, client_id="edge-in-restart")
    try:
        assert second.drain(11)
        assert first.got + second.got == [float(k) for k in range(15)] + [-1.0]
        second.drain(12, timeout=1.0)
        assert len(second.got) == 11
    finally:
        second.close()
