"""Config of the MQTT alert publisher (``[mqtt]``) and its consumers' tables
(``[mqtt.homeassistant]``, ``[mqtt.sparkplug]``), its password file and the paho client factory.

Split from :mod:`agent.publish.mqtt` (which re-exports every name here).
"""

from __future__ import annotations

from typing import Any, Literal

import paho.mqtt.client as paho
from pydantic import Field, field_validator, model_validator

from agent.config.base import StrictModel
from agent.publish.mqtt_tls import DiagnosedClient
from agent.secret_files import read_secret

_WILDCARDS = ("+", "#", "\x00")


class HomeAssistantConfig(StrictModel):
    """Home Assistant MQTT discovery (``[mqtt.homeassistant]``)."""

    enabled: bool = Field(
        False,
        description="Publish Home Assistant MQTT discovery messages: per stream an anomaly "
        "binary sensor and a score sensor. Needs mqtt.enabled. Turning it off removes the "
        "entities the agent had published.",
    )
    discovery_prefix: str = Field(
        "homeassistant",
        min_length=1,
        description="Home Assistant's discovery prefix (its MQTT integration setting).",
    )
    birth_topic: str | None = Field(
        None,
        description="Topic of Home Assistant's birth message; on 'online' the discovery "
        "messages are published again. Unset = '<discovery_prefix>/status' (Home Assistant's "
        "default).",
    )

    @field_validator("discovery_prefix", "birth_topic")
    @classmethod
    def _topic(cls, value: str | None) -> str | None:
        if value is not None and (any(c in value for c in _WILDCARDS) or "" in value.split("/")):
            raise ValueError(f"{value!r} must not contain '+', '#' or empty levels")
        return value


class SparkplugConfig(StrictModel):
    """Sparkplug B output (``[mqtt.sparkplug]``)."""

    enabled: bool = Field(
        False,
        description="Publish every stream as a Sparkplug B device of this edge node, on a "
        "second MQTT connection to the [mqtt] broker (its will is the NDEATH).",
    )
    group_id: str | None = Field(
        None, examples=["plant1"], description="Sparkplug group id; required when enabled."
    )
    edge_node_id: str | None = Field(
        None, description="Sparkplug edge node id; unset = agent.device_id."
    )
    client_id: str | None = Field(
        None, description="MQTT client id of the Sparkplug connection; unset = "
        "'<mqtt client id>-sparkplug'."
    )
    min_data_interval_s: float = Field(
        1.0, ge=0.0,
        description="Least seconds between two DDATA of one stream whose only change is the "
        "score (status, threshold and model changes go out at once); 0 = every score.",
    )

    @field_validator("group_id", "edge_node_id")
    @classmethod
    def _level(cls, value: str | None) -> str | None:
        if value is not None and (not value or any(c in value for c in (*_WILDCARDS, "/"))):
            raise ValueError(f"{value!r} must be one non-empty topic level without / + #")
        return value


class MqttConfig(StrictModel):
    """Config of the MQTT alert publisher (``[mqtt]``)."""

    enabled: bool = Field(False, description="Publish alerts to an MQTT broker.")
    host: str = Field("127.0.0.1", min_length=1, description="Broker host name or address.")
    port: int = Field(1883, ge=1, le=65535, description="Broker TCP port (8883 is usual for TLS).")
    client_id: str | None = Field(
        None,
        examples=["edge-agent-line1"],
        description="MQTT client id; unset = 'edge-agent-<device_id>'.",
    )
    topic_prefix: str = Field(
        "edge",
        min_length=1,
        description="First topic level(s); alerts go to <topic_prefix>/<device_id>/alerts.",
    )
    qos: Literal[1] = Field(
        1, description="Publish QoS; only 1 (at least once) is accepted: QoS 0 would lose alerts."
    )
    keepalive_s: int = Field(30, ge=1, le=65535, description="MQTT keepalive in seconds.")
    username: str | None = Field(
        None, examples=["edge-line1"], description="User name; unset = anonymous."
    )
    password_file: str | None = Field(
        None,
        examples=["/etc/edge-agent/mqtt.password"],
        description="File holding the password (first line); the password is never inline. "
        "Unset = no password.",
    )
    tls: bool = Field(False, description="Connect with TLS.")
    ca_file: str | None = Field(
        None,
        examples=["/etc/edge-agent/ca.pem"],
        description="CA bundle for TLS; unset = the system's trust store. Needs tls = true.",
    )
    cert_file: str | None = Field(
        None,
        examples=["/etc/edge-agent/mqtt-client.pem"],
        description="Client certificate (PEM) for brokers that require one (mTLS); may hold the "
        "key too. Needs tls = true.",
    )
    key_file: str | None = Field(
        None,
        examples=["/etc/edge-agent/credentials/mqtt-client.key"],
        description="Private key (PEM) of cert_file, a secret (mode 0600); unset = in cert_file.",
    )
    key_password_file: str | None = Field(
        None,
        description="File whose first line decrypts an encrypted key; unset = the key is not "
        "encrypted.",
    )
    max_inflight: int = Field(
        20, ge=1, le=65535, description="Alerts published but not yet acknowledged, at most."
    )
    protocol: Literal["5", "3.1.1"] = Field(
        "5",
        description="MQTT protocol version. 5 learns the broker's Maximum Packet Size from its "
        "CONNACK and reads the reason code of every PUBACK; 3.1.1 for brokers that do not "
        "speak 5 (then only max_message_bytes guards the size).",
    )
    max_message_bytes: int | None = Field(
        None,
        ge=512,
        le=268_435_455,
        examples=[65536],
        description="Largest alert payload in bytes the broker takes (e.g. mosquitto's "
        "message_size_limit, which a 3.1.1 broker enforces by acknowledging and dropping). A "
        "larger alert goes out in its reduced form (no top_channels, no source, "
        "\"reduced\": true) or, if that is still too large, is dead-lettered in the store. "
        "Unset = only the broker's Maximum Packet Size (MQTT 5).",
    )
    progress_timeout_s: float | None = Field(
        None,
        gt=0.0,
        description="Alerts in flight, the connection up and no PUBACK for this long: the "
        "connection is dropped and rebuilt (logged, edge_agent_mqtt_stalls_total). Unset = "
        "3 x keepalive_s.",
    )
    reconnect_min_s: float = Field(
        1.0, gt=0.0, description="First reconnect delay in seconds (rounded up to whole seconds)."
    )
    reconnect_max_s: float = Field(
        30.0, gt=0.0, description="Largest reconnect delay in seconds (rounded up)."
    )
    retain: bool = Field(
        True, description="Use retained messages (availability, last will, stream state). "
        "false for a broker that takes none (mosquitto retain_available false) spoken to with "
        "MQTT 3.1.1; over MQTT 5 the agent finds out from the broker and turns retain off "
        "itself."
    )
    state: bool = Field(
        True, description="Publish each stream's present state, retained, on "
        "<topic_prefix>/<device_id>/<stream>/state (docs/mqtt.md, 'Retained state')."
    )
    state_interval_s: float = Field(
        10.0, ge=0.0, description="A stream's state whose only change is its score is "
        "published at most once per state_interval_s seconds; a change of status, threshold, "
        "model or episode goes out at once."
    )
    homeassistant: HomeAssistantConfig = Field(
        default_factory=HomeAssistantConfig,
        description="Home Assistant MQTT discovery (docs/mqtt-consumers.md).",
    )
    sparkplug: SparkplugConfig = Field(
        default_factory=SparkplugConfig,
        description="Sparkplug B output on a second connection (docs/mqtt-consumers.md).",
    )

    @model_validator(mode="after")
    def _consistent(self) -> MqttConfig:
        if self.reconnect_max_s < self.reconnect_min_s:
            raise ValueError(
                f"reconnect_max_s ({self.reconnect_max_s}) must not be smaller than "
                f"reconnect_min_s ({self.reconnect_min_s})"
            )
        levels = self.topic_prefix.split("/")
        if any(w in self.topic_prefix for w in _WILDCARDS) or "" in levels:
            raise ValueError(
                f"topic_prefix {self.topic_prefix!r} must not contain '+', '#' or empty levels"
            )
        for key in ("ca_file", "cert_file"):
            if getattr(self, key) is not None and not self.tls:
                raise ValueError(f"{key} is set but tls is false")
        for key in ("key_file", "key_password_file"):
            if getattr(self, key) is not None and self.cert_file is None:
                raise ValueError(f"{key} is set but cert_file is not")
        if self.password_file is not None and self.username is None:
            raise ValueError("password_file is set but username is not")
        if self.homeassistant.enabled and not self.enabled:
            raise ValueError("homeassistant.enabled needs enabled = true (discovery goes out on "
                             "the alerts connection)")
        if self.sparkplug.enabled and self.sparkplug.group_id is None:
            raise ValueError("sparkplug.enabled needs sparkplug.group_id")
        return self


def read_password(path: str) -> str:
    """The MQTT password: the first line of ``path`` (``edge-agent check-config`` reads it too).

    Raises:
        ConfigError: the file is unreadable, not UTF-8, its first line is empty, or it is
            writable by others (:func:`agent.secret_files.read_secret`).
    """
    return read_secret(path, "mqtt.password_file", "password")


def default_client_factory(**kwargs: Any) -> paho.Client:
    """Build the real paho client (the publisher passes every argument by keyword); it
    remembers why a connection failed (:class:`agent.publish.mqtt_tls.DiagnosedClient`)."""
    return DiagnosedClient(**kwargs)
