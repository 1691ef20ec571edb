"""Home Assistant MQTT discovery: each stream as an anomaly binary sensor and a score sensor.

Opt-in (``[mqtt.homeassistant] enabled = true``). Protocol: Home Assistant's MQTT discovery
(https://www.home-assistant.io/integrations/mqtt/#mqtt-discovery), one config message per
entity ("single component discovery"), full key names (no abbreviations):

``<discovery_prefix>/binary_sensor/<node_id>/<stream_id>_anomaly/config``
    ``device_class: problem``; ON while the stream's state is ``anomalous``.
``<discovery_prefix>/sensor/<node_id>/<stream_id>_score/config``
    ``state_class: measurement``; the last window's score (unknown before the first one).

``node_id`` is the device id and ``stream_id`` the stream name with ``.`` replaced by ``_``
(Home Assistant allows ``[a-zA-Z0-9_-]`` only). Both entities read the retained JSON state topic
``<topic_prefix>/<device_id>/<stream>/state`` (:meth:`agent.publish.stream_state.StreamState.
to_payload`) with a ``value_template`` and take the agent's availability topic
(``<topic_prefix>/<device_id>/availability``, ``online``/``offline``). ``unique_id`` is
``<node_id>_<stream_id>_<anomaly|score>``; ``default_entity_id`` (the key that replaced
``object_id``, which Home Assistant 2026.4 no longer reads) is that id under the entity's domain.
The ``device`` mapping groups them under one device per agent (identifiers: the device id).

Lifecycle, on the alerts connection (:class:`agent.publish.mqtt.MqttPublisher`, whose last will
is the availability topic the entities use):

* on every connect, and when Home Assistant's birth message (``online`` on ``birth_topic``)
  arrives, every stream's two config messages are published, retained, QoS 1;
* the agent subscribes to its own config topics (``<prefix>/+/<node_id>/+/config``): a retained
  config that is not one of this config's entities (a stream removed from the config while the
  agent was stopped or reloaded) is removed with an empty retained message, which is how Home
  Assistant deletes a discovered entity;
* a stream removed at run time (:meth:`agent.publish.stream_state.StateBoard.remove`) has its
  two configs removed at once;
* with ``enabled = false`` (while ``[mqtt]`` is enabled) the agent only removes any config of
  its own it finds retained, so turning discovery off removes the entities.

A broker whose CONNACK says it keeps no retained messages (MQTT 5 Retain Available = 0) gets no
discovery (one ERROR line): a retained publish would make it drop the alerts connection.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from agent import __version__
from agent.errors import ConfigError
from agent.metrics import Metrics
from agent.publish.mqtt_config import HomeAssistantConfig
from agent.publish.stream_state import StateBoard, StreamState

if TYPE_CHECKING:
    from agent.publish.mqtt import MqttPublisher

KIND = "homeassistant"

#: The ``origin`` of every discovery message (Home Assistant logs it with the entity).
ORIGIN_NAME = "edge-anomaly-agent"

Component = Literal["binary_sensor", "sensor"]


def entity_id_part(name: str) -> str:
    """A device or stream name as a Home Assistant id part (``[a-zA-Z0-9_-]``).

    >>> entity_id_part("line1.pump-2")
    'line1_pump-2'
    """
    return name.replace(".", "_")


class HomeAssistantDiscovery:
    """Publishes and removes the discovery config messages (see the module docstring).

    Args:
        config: The ``[mqtt.homeassistant]`` section.
        publisher: The alerts connection; its hooks are registered by :meth:`attach`.
        device_id: The agent's device id.
        topic_prefix: ``mqtt.topic_prefix`` (the state and availability topics).
        streams: The configured stream names, in config order.
        metrics: Receives ``ha_discovery_total{action}``.
        logger: Where removals and trouble are logged.

    Raises:
        ConfigError: Two stream names map to the same Home Assistant id (``a.b`` and ``a_b``).
    """

    def __init__(self, config: HomeAssistantConfig, publisher: MqttPublisher, device_id: str,
                 topic_prefix: str, streams: Sequence[str], metrics: Metrics, *,
                 logger: logging.Logger | None = None) -> None:
        self.config = config
        self._publisher = publisher
        self._device_id = device_id
        self._prefix = topic_prefix
        self._metrics = metrics
        self._log = logger or logging.getLogger(__name__)
        self.node_id = entity_id_part(device_id)
        seen: dict[str, str] = {}
        for name in streams:
            part = entity_id_part(name)
            if part in seen:
                msg = (f"mqtt.homeassistant: streams {seen[part]!r} and {name!r} both become "
                       f"Home Assistant id {part!r}; rename one")
                raise ConfigError(msg, problems=[msg])
            seen[part] = name
        self._lock = threading.Lock()
        self._streams: list[str] = list(streams)
        self.birth_topic = config.birth_topic or f"{config.discovery_prefix}/status"
        self._retain_warned = False

    # -- the messages ---------------------------------------------------------------------------

    def config_topic(self, component: Component, stream: str) -> str:
        """The discovery topic of ``stream``'s binary sensor or sensor."""
        suffix = "anomaly" if component == "binary_sensor" else "score"
        return (f"{self.config.discovery_prefix}/{component}/{self.node_id}/"
                f"{entity_id_part(stream)}_{suffix}/config")

    def state_topic(self, stream: str) -> str:
        """The retained JSON state topic of ``stream`` (``StreamState.to_payload()``)."""
        return f"{self._prefix}/{self._device_id}/{stream}/state"

    def config_payload(self, component: Component, stream: str) -> dict[str, object]:
        """The discovery payload of ``stream``'s binary sensor or sensor (documented keys)."""
        suffix = "anomaly" if component == "binary_sensor" else "score"
        object_id = f"{self.node_id}_{entity_id_part(stream)}_{suffix}"
        payload: dict[str, object] = {
            "name": f"{stream} {suffix}",
            "unique_id": object_id,
            "default_entity_id": f"{component}.{object_id.lower()}",
            "state_topic": self.state_topic(stream),
            "availability_topic": f"{self._prefix}/{self._device_id}/availability",
            "payload_available": "online",
            "payload_not_available": "offline",
            "json_attributes_topic": self.state_topic(stream),
            "device": {
                "identifiers": [self._device_id],
                "name": self._device_id,
                "manufacturer": "edge-anomaly-agent",
                "model": "edge-agent gateway",
                "sw_version": __version__,
            },
            "origin": {"name": ORIGIN_NAME, "sw_version": __version__},
        }
        if component == "binary_sensor":
            payload.update({
                "device_class": "problem",
                "value_template": "{{ 'ON' if value_json.status == 'anomalous' else 'OFF' }}",
                "payload_on": "ON",
                "payload_off": "OFF",
            })
        else:
            # JSON null renders as None, which Home Assistant takes as "unknown"
            payload.update({
                "state_class": "measurement",
                "value_template": "{{ value_json.score }}",
                "icon": "mdi:chart-bell-curve",
            })
        return payload

    def expected_topics(self) -> set[str]:
        """Every config topic of the streams in force."""
        with self._lock:
            streams = list(self._streams)
        return {self.config_topic(c, s) for s in streams for c in ("binary_sensor", "sensor")}

    # -- wiring ---------------------------------------------------------------------------------

    def attach(self, board: StateBoard) -> None:
        """Register on the publisher (before it starts) and on ``board`` (removals)."""
        p = self.config.discovery_prefix
        for component in ("binary_sensor", "sensor"):
            self._publisher.subscribe_filter(f"{p}/{component}/{self.node_id}/+/config",
                                             self._on_retained_config)
        self._publisher.add_connect_listener(self.publish_all)
        if self.config.enabled:
            self._publisher.subscribe_filter(self.birth_topic, self._on_birth)
            board.subscribe(self._on_state)

    def publish_all(self) -> int:
        """Publish every stream's config messages (retained); returns how many paho took."""
        if not self.config.enabled:
            return 0
        if not self._publisher.retain_available:
            if not self._retain_warned:
                self._retain_warned = True
                self._log.error("Home Assistant discovery: the MQTT broker keeps no retained "
                                "messages (Retain Available = 0); no discovery published")
            return 0
        with self._lock:
            streams = list(self._streams)
        sent = 0
        for stream in streams:
            for component in ("binary_sensor", "sensor"):
                body = json.dumps(self.config_payload(component, stream), separators=(",", ":"))
                if self._publisher.publish_extra(self.config_topic(component, stream), body,
                                                 retain=True):
                    sent += 1
        self._metrics.ha_discovery_total.labels(action="published").inc(sent)
        return sent

    def _remove_topic(self, topic: str) -> None:
        if self._publisher.publish_extra(topic, b"", retain=True):
            self._metrics.ha_discovery_total.labels(action="removed").inc()

    def _on_state(self, stream: str, state: StreamState | None) -> None:
        """Board listener: a removed stream loses its entities (producer's thread)."""
        if state is not None:
            return
        with self._lock:
            if stream not in self._streams:
                return
            self._streams.remove(stream)
        self._log.info("Home Assistant discovery: stream %s removed; removing its entities",
                       stream)
        for component in ("binary_sensor", "sensor"):
            self._remove_topic(self.config_topic(component, stream))

    def _on_retained_config(self, topic: str, payload: bytes, retained: bool) -> None:
        """A config message under this node: remove it when it is a stored (retained) one of
        an entity this config does not have (paho's thread)."""
        if not retained or not payload:
            return  # our own publish echoed back, or an entity already removed
        if self.config.enabled and topic in self.expected_topics():
            return
        self._log.info("Home Assistant discovery: removing %s (not in this config)", topic)
        self._remove_topic(topic)

    def _on_birth(self, topic: str, payload: bytes, retained: bool) -> None:
        """Home Assistant's birth message: publish the discovery again (paho's thread)."""
        if payload.strip() == b"online":
            self._metrics.ha_discovery_total.labels(action="birth").inc()
            self.publish_all()
