"""Config of the ``mqtt`` source: a broker, subscriptions and how payloads map to channels.

TOML shapes, by ``format``::

    [streams.source]                  # JSON objects: fields -> channels
    kind = "mqtt"
    host = "127.0.0.1"
    format = "json"
    topics = ["plant/pump1/telemetry"]
    timestamp_field = "ts"            # optional; epoch s, epoch ms (> 1e11) or ISO 8601
    expected_interval_s = 1.0         # optional, needs timestamp_field: count missed readings
    [streams.source.fields]           # channel = field (a dotted path into the object)
    Pressure = "p"
    Flow = "flow.value"

    [streams.source]                  # one number per topic
    kind = "mqtt"
    format = "number"
    [streams.source.channel_topics]
    Pressure = "plant/pump1/pressure"

    [streams.source]                  # Sparkplug B
    kind = "mqtt"
    format = "sparkplug_b"
    group_id = "plant1"
    edge_node_id = "line3"
    device_id = "pump1"               # optional: unset = the node's own metrics (NDATA)
    [streams.source.metrics]          # channel = metric name
    Pressure = "Inputs/Pressure"

QoS 1 with a persistent session by default (``clean_session = false`` and a fixed
``client_id``): readings the broker queued while the agent was stopped are read after it starts.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from agent.config.base import StrictModel
from agent.sources.base import SourcePlugin

KIND = "mqtt"
#: MQTT topic filter: no NUL, at most 1024 characters here (the protocol allows 65535 bytes).
TOPIC = Field(min_length=1, max_length=1024, pattern=r"^[^\x00]+$")


class MqttInConfig(StrictModel):
    """MQTT subscription source (paho-mqtt)."""

    kind: Literal["mqtt"] = Field("mqtt", description="Source kind.")
    host: str = Field("127.0.0.1", min_length=1, max_length=253, description="Broker host.")
    port: int = Field(1883, ge=1, le=65535, description="Broker TCP port.")
    client_id: str | None = Field(
        None, min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$",
        description="MQTT client id; unset = edge-agent-in-<device>-<stream>. A persistent "
        "session is found again by this id.")
    clean_session: bool = Field(False, description="false = a persistent session: the broker "
                                "queues QoS 1 messages while the agent is away.")
    qos: Literal[0, 1] = Field(1, description="Subscription QoS.")
    keepalive_s: int = Field(30, ge=5, le=3600, description="MQTT keepalive, seconds.")
    username: str | None = Field(None, min_length=1, max_length=256, description="User name.")
    password_file: str | None = Field(None, description="File holding the broker password.")
    ca_file: str | None = Field(None, description="CA bundle: connect with TLS when set.")
    format: Literal["json", "number", "sparkplug_b"] = Field(
        description="Payload format: JSON objects, one number per topic, or Sparkplug B.")
    topics: list[str] = Field(default_factory=list, max_length=64,
                              description="format = json: the topic filters to subscribe to.")
    fields: dict[str, str] = Field(
        default_factory=dict, max_length=4096,
        description="format = json: channel -> field (dotted path into the JSON object).")
    timestamp_field: str | None = Field(
        None, min_length=1, max_length=256,
        description="format = json: field holding the reading time; unset = receive time.")
    expected_interval_s: float | None = Field(
        None, gt=0, le=86400.0,
        description="format = json with timestamp_field: the publisher's cadence, seconds. A "
        "jump of more than 1.5 intervals between the payload timestamps of two messages counts "
        "the readings in between as missed (edge_agent_polls_missed_total{reason=\"gap\"}).")
    channel_topics: dict[str, str] = Field(
        default_factory=dict, max_length=4096,
        description="format = number: channel -> the topic carrying its value.")
    group_id: str | None = Field(None, min_length=1, max_length=256, pattern=r"^[^/+#\x00]+$",
                                 description="format = sparkplug_b: Sparkplug group id.")
    edge_node_id: str | None = Field(None, min_length=1, max_length=256,
                                     pattern=r"^[^/+#\x00]+$",
                                     description="format = sparkplug_b: edge node id.")
    device_id: str | None = Field(None, min_length=1, max_length=256, pattern=r"^[^/+#\x00]+$",
                                  description="format = sparkplug_b: device id (unset = the "
                                  "node's own metrics).")
    metrics: dict[str, str] = Field(
        default_factory=dict, max_length=4096,
        description="format = sparkplug_b: channel -> metric name.")
    request_rebirth: bool = Field(True, description="format = sparkplug_b: send an NCMD "
                                  "rebirth when a metric cannot be mapped or seq jumps.")
    max_payload_bytes: int = Field(65536, ge=16, le=16 * 1024 * 1024,
                                   description="Larger payloads are rejected (oversized).")
    min: dict[str, float] = Field(default_factory=dict,
                                  description="Per channel: lowest valid value.")
    max: dict[str, float] = Field(default_factory=dict,
                                  description="Per channel: highest valid value.")
    reconnect_initial_s: float = Field(1.0, gt=0, le=3600.0,
                                       description="First reconnect delay, seconds.")
    reconnect_max_s: float = Field(30.0, gt=0, le=3600.0,
                                   description="Longest reconnect delay, seconds.")

    @property
    def channels(self) -> tuple[str, ...]:
        """The stream's channels, in the order of the format's map."""
        table = {"json": self.fields, "number": self.channel_topics,
                 "sparkplug_b": self.metrics}[self.format]
        return tuple(table)

    def channel_names(self) -> list[str]:
        """The channel names of the format's map, in order."""
        return list(self.channels)

    @model_validator(mode="after")
    def _consistent(self) -> MqttInConfig:
        need = {"json": ("topics", "fields"), "number": ("channel_topics",),
                "sparkplug_b": ("group_id", "edge_node_id", "metrics")}[self.format]
        missing = [k for k in need if not getattr(self, k)]
        if missing:
            raise ValueError(f"format {self.format!r} needs {', '.join(missing)}")
        if self.expected_interval_s is not None and (self.format != "json"
                                                     or self.timestamp_field is None):
            raise ValueError("expected_interval_s needs format 'json' with a timestamp_field "
                             "(the gaps are read from the payload timestamps)")
        others = {"topics", "fields", "timestamp_field", "channel_topics", "group_id",
                  "edge_node_id", "device_id", "metrics"} - set(need) - (
                      {"timestamp_field"} if self.format == "json" else set()) - (
                      {"device_id"} if self.format == "sparkplug_b" else set())
        stray = sorted(k for k in others if getattr(self, k))
        if stray:
            raise ValueError(f"format {self.format!r} does not use {', '.join(stray)}")
        unknown = sorted((set(self.min) | set(self.max)) - set(self.channels))
        if unknown:
            raise ValueError(f"min/max name channels the map does not have: {unknown}")
        if (self.username is None) != (self.password_file is None):
            raise ValueError("username and password_file go together")
        return self


PLUGIN = SourcePlugin(KIND, MqttInConfig, "agent.sources.mqtt_in:MqttInSource",
                      path_fields=("password_file", "ca_file"))
