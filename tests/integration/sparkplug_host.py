"""A Sparkplug B host for the integration tests: records every ``spBv1.0/#`` message, decoded
with protobuf (:mod:`agent.sparkplug_b`), and sends NCMDs."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from agent.sparkplug_b import decode, metric_value, parse_topic
from tests.conftest import MosquittoBroker


@dataclass(frozen=True)
class SpMsg:
    topic: str
    verb: str
    device: str | None
    payload: Any  # the decoded protobuf Payload
    qos: int
    retain: bool

    def metric(self, name: str) -> Any:
        """The metric called ``name`` (births name every metric)."""
        found = [m for m in self.payload.metrics if m.name == name]
        assert len(found) == 1, f"{self.verb} has {len(found)} metric(s) {name!r}"
        return found[0]

    def value(self, name: str) -> Any:
        m = self.metric(name)
        if m.is_null:
            return None
        return m.string_value if m.WhichOneof("value") == "string_value" else metric_value(m)


def wait_until(pred: Callable[[], object], timeout_s: float, what: str,
               detail: Callable[[], str] = lambda: "") -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}\n{detail()}")
        time.sleep(0.02)


class SparkplugHost:
    """A paho client on ``spBv1.0/#`` (QoS 1) that decodes every payload it receives."""

    def __init__(self, broker: MosquittoBroker) -> None:
        self._lock = threading.Lock()
        self._messages: list[SpMsg] = []
        self.subscribed = threading.Event()
        self.client = paho.Client(CallbackAPIVersion.VERSION2,
                                  client_id=f"host-{uuid.uuid4().hex[:8]}",
                                  protocol=paho.MQTTv311, clean_session=True)
        self.client.on_connect = lambda c, *a: c.subscribe("spBv1.0/#", qos=1)
        self.client.on_subscribe = lambda *a: self.subscribed.set()
        self.client.on_message = self._on_message
        self.client.connect(broker.host, broker.port, keepalive=10)
        self.client.loop_start()
        assert self.subscribed.wait(5), "host did not get its SUBACK"

    def _on_message(self, client: paho.Client, userdata: Any, msg: paho.MQTTMessage) -> None:
        t = parse_topic(msg.topic)
        decoded = None if t.kind == "NCMD" else decode(bytes(msg.payload))
        with self._lock:
            self._messages.append(SpMsg(msg.topic, t.kind, t.device, decoded, msg.qos,
                                        bool(msg.retain)))

    def messages(self, verb: str | None = None, device: str | None = None) -> list[SpMsg]:
        with self._lock:
            return [m for m in self._messages
                    if (verb is None or m.verb == verb) and (device is None or m.device == device)]

    def verbs(self) -> list[str]:
        return [f"{m.verb}/{m.device}" if m.device else m.verb for m in self.messages()]

    def send(self, topic: str, payload: bytes) -> None:
        self.client.publish(topic, payload, qos=0).wait_for_publish(5)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()
