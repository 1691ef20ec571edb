"""A recording MQTT subscriber for the integration tests (a real paho client, QoS 1)."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from tests.conftest import MosquittoBroker


@dataclass(frozen=True)
class Msg:
    topic: str
    payload: bytes
    qos: int
    retain: bool


class Subscriber:
    """A paho client recording every message on ``topics`` at QoS 1.

    Subclasses set ``device``; ``alerts()``/``availability()`` read that device's topics.
    """

    device = "gw1"

    def __init__(
        self,
        broker: MosquittoBroker,
        topics: list[str],
        *,
        client_id: str | None = None,
        persistent: bool = False,
    ) -> None:
        self._lock = threading.Lock()
        self._messages: list[Msg] = []
        self.subscribed = threading.Event()
        self.topics = topics
        self.alerts_topic = f"edge/{self.device}/alerts"
        self.availability_topic = f"edge/{self.device}/availability"
        self.client = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id or f"sub-{uuid.uuid4().hex[:8]}",
            protocol=paho.MQTTv311,
            clean_session=not persistent,
        )
        self.client.reconnect_delay_set(1, 1)
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = lambda *a: self.subscribed.set()
        self.client.on_message = self._on_message
        self.client.connect(broker.host, broker.port, keepalive=10)
        self.client.loop_start()
        assert self.subscribed.wait(5), "subscriber did not get its SUBACK"

    def _on_connect(self, client: paho.Client, *args: Any) -> None:
        client.subscribe([(t, 1) for t in self.topics])

    def _on_message(self, client: paho.Client, userdata: Any, msg: paho.MQTTMessage) -> None:
        with self._lock:
            self._messages.append(Msg(msg.topic, bytes(msg.payload), msg.qos, bool(msg.retain)))

    def messages(self, topic: str | None = None) -> list[Msg]:
        with self._lock:
            return [m for m in self._messages if topic is None or m.topic == topic]

    def alerts(self) -> list[dict[str, Any]]:
        return [json.loads(m.payload.decode("utf-8")) for m in self.messages(self.alerts_topic)]

    def alert_ids(self) -> list[str]:
        return [a["alert_id"] for a in self.alerts()]

    def availability(self) -> list[str]:
        return [m.payload.decode() for m in self.messages(self.availability_topic)]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def subscriber_factory(cls: type[Subscriber]) -> Iterator[Callable[..., Subscriber]]:
    """Body of a ``subscribers`` fixture: makes ``cls`` instances, closes them at teardown."""
    made: list[Subscriber] = []

    def make(broker: MosquittoBroker, topics: list[str], **kw: Any) -> Subscriber:
        sub = cls(broker, topics, **kw)
        made.append(sub)
        return sub

    yield make
    for sub in made:
        sub.close()
