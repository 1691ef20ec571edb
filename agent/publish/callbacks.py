"""paho's callbacks of :class:`agent.publish.mqtt.MqttPublisher` (paho's network thread).

They only set flags, queue acknowledged message ids and wake the drain thread
(:mod:`agent.publish.drain`); connection changes are logged here, once per loss and once per
recovery (see :mod:`agent.publish.mqtt` for the contract).
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable

import paho.mqtt.client as paho
from paho.mqtt.reasoncodes import ReasonCode

from agent.logs import ALWAYS
from agent.metrics import Metrics
from agent.publish.limits import SizeLimit
from agent.publish.mqtt_config import MqttConfig
from agent.publish.mqtt_tls import failure_of

#: CONNACK reason code 0x9A (MQTT 5.0 section 3.2.2.2): the broker takes no retained messages
#: and refuses a connection whose will is retained.
RETAIN_NOT_SUPPORTED = 0x9A
#: 3.1.1 connections in a row closed before any CONNACK before the broker is taken to refuse
#: the retained will (mosquitto ``retain_available false`` says nothing else over 3.1.1).
NO_CONNACK_STRIKES = 3


class PahoCallbacks:
    """The network-thread half of the publisher (attributes set by its ``__init__``)."""

    config: MqttConfig
    availability_topic: str
    client_id: str
    limit: SizeLimit
    _metrics: Metrics
    _clock: Callable[[], float]
    _monotonic: Callable[[], float]
    _log: logging.Logger
    _state_lock: threading.Lock
    _connected: bool
    _generation: int
    _no_connack: int
    _outage_since: float | None
    _outage_cause: str | None
    _subscriptions: dict[str, Callable[[bytes], None]]
    _filters: dict[str, Callable[[str, bytes, bool], None]]
    _connect_listeners: list[Callable[[], object]]
    _acks: collections.deque[tuple[int, ReasonCode, float, float]]
    _wake: threading.Event
    _stopping: threading.Event
    _client: paho.Client
    _connected_mono: float
    retain: bool
    _retain_rebuild: bool
    _losses: collections.deque[float]

    def _on_message(self, client: paho.Client, userdata: object, msg: paho.MQTTMessage) -> None:
        if client is not self._client:
            return  # a client replaced by a new one (agent.publish.drain: _poisoned)
        with self._state_lock:
            callback = self._subscriptions.get(msg.topic)
            filters = [cb for f, cb in self._filters.items()
                       if paho.topic_matches_sub(f, msg.topic)]
        if callback is not None:
            callback(bytes(msg.payload))
        for listener in filters:
            try:
                listener(msg.topic, bytes(msg.payload), bool(msg.retain))
            except Exception:  # a consumer's bug must not end paho's network thread
                self._log.exception("MQTT subscription callback failed for %s", msg.topic[:200])

    def _note_failure(self, cause: str | None) -> bool:
        """Start (or go on with) an outage; True when it starts here or ``cause`` (None =
        unknown) is new to it: a failure is logged once per outage and cause, not per retry."""
        with self._state_lock:
            first = self._outage_since is None
            if first:
                self._outage_since = self._monotonic()
            new = cause is not None and cause != self._outage_cause
            if first or new:
                self._outage_cause = cause
        return first or new

    # -- paho callbacks (paho's network thread) -------------------------------------------------

    def _on_connect(
        self,
        client: paho.Client,
        userdata: object,
        flags: paho.ConnectFlags,
        reason_code: ReasonCode,
        properties: object,
    ) -> None:
        if client is not self._client:
            return
        if reason_code.is_failure:
            if reason_code.value == RETAIN_NOT_SUPPORTED and self.retain:
                self._retain_off("refused the connection: Retain not supported (its "
                                 "retain_available is off)")
                self._retain_rebuild = True  # the will is retained: a new client without it
                self._wake.set()
                return
            if self._note_failure(f"refused: {reason_code}"):
                self._log.warning(
                    "MQTT broker %s:%d refused the connection (%s); alerts stay in the outbox, "
                    "retrying in the background",
                    self.config.host, self.config.port, reason_code,
                )
            return
        broker_max = getattr(properties, "MaximumPacketSize", None)
        self.limit.broker_max_packet = broker_max if isinstance(broker_max, int) else None
        if getattr(properties, "RetainAvailable", 1) == 0 and self.retain:
            self._retain_off("announced Retain Available 0")
        self._no_connack = 0
        client.publish(self.availability_topic, "online", qos=1, retain=self.retain)
        with self._state_lock:
            topics = [*self._subscriptions, *self._filters]
            listeners = list(self._connect_listeners)
        for topic in topics:
            client.subscribe(topic, qos=1)
        with self._state_lock:
            self._connected = True
            self._generation += 1
            self._connected_mono = self._monotonic()
            since, self._outage_since = self._outage_since, None
            self._outage_cause = None
        self._metrics.mqtt_connected.set(1)
        if since is None:
            self._log.info(
                "connected to MQTT broker %s:%d as %s",
                self.config.host, self.config.port, self.client_id,
            )
        else:
            self._log.info(
                "MQTT broker %s:%d reachable again after %.1f s; draining the outbox",
                self.config.host, self.config.port, self._monotonic() - since, extra=ALWAYS,
            )
        for listener in listeners:
            try:
                listener()
            except Exception:  # a consumer's bug must not end paho's network thread
                self._log.exception("MQTT connect listener failed")
        self._wake.set()

    def _retain_off(self, why: str) -> None:
        """The broker takes no retained messages: availability, will and stream state go out
        without retain from now on (alerts never were retained)."""
        self.retain = False
        self._log.warning(
            "MQTT broker %s:%d %s: sending availability and stream state without retain (a "
            "late subscriber does not see them at once); alerts are unaffected",
            self.config.host, self.config.port, why, extra=ALWAYS)

    def _no_connack_again(self, client: paho.Client) -> bool:
        """Count a 3.1.1 connection closed before its CONNACK; True when that turned retain
        off (:data:`NO_CONNACK_STRIKES` in a row: a new client without the retained will)."""
        self._no_connack += 1
        if (self.config.protocol == "5" or not self.retain
                or self._no_connack < NO_CONNACK_STRIKES):
            return False
        self._retain_off(f"closed {self._no_connack} connections in a row before a CONNACK, as "
                         "a broker with retain_available false does over MQTT 3.1.1")
        self._retain_rebuild = True
        self._wake.set()
        return True

    def _on_connect_fail(self, client: paho.Client, userdata: object) -> None:
        if client is not self._client:
            return
        cause = failure_of(client)  # the TLS or socket error paho does not pass on
        if self._note_failure(cause):
            self._log.warning(
                "MQTT broker %s:%d unreachable%s; alerts stay in the outbox, retrying in the "
                "background every %g-%g s",
                self.config.host, self.config.port, f": {cause}" if cause else "",
                self.config.reconnect_min_s, self.config.reconnect_max_s,
            )

    def _on_disconnect(
        self,
        client: paho.Client,
        userdata: object,
        flags: paho.DisconnectFlags,
        reason_code: ReasonCode,
        properties: object,
    ) -> None:
        if client is not self._client:
            return
        with self._state_lock:
            was_connected, self._connected = self._connected, False
            lost = was_connected and not self._stopping.is_set()
            if lost:
                self._losses.append(self._monotonic() - self._connected_mono)
                if self._outage_since is None:
                    self._outage_since = self._monotonic()
        self._metrics.mqtt_connected.set(0)
        if not was_connected and not self._stopping.is_set():
            error = getattr(client, "socket_error", None)
            if error:
                # Closed before any CONNACK with a cause: e.g. the broker rejected the client
                # certificate after a TLS 1.3 handshake (paho logs it; nothing else calls back).
                cause = failure_of(client) or str(error)
                if self._note_failure(cause):
                    self._log.warning(
                        "MQTT broker %s:%d closed the connection before accepting it: %s; "
                        "alerts stay in the outbox, retrying in the background",
                        self.config.host, self.config.port, cause,
                    )
            elif self._no_connack_again(client):
                pass  # a new client without the retained will replaces this one
            elif self._note_failure("no CONNACK"):
                # The TCP connection was made but no CONNACK came (paho gives up after the
                # keepalive): logged once, like a refused connection.
                self._log.warning(
                    "MQTT broker %s:%d accepted the TCP connection but sent no CONNACK (%s); "
                    "alerts stay in the outbox, retrying in the background every %g-%g s",
                    self.config.host, self.config.port, reason_code,
                    self.config.reconnect_min_s, self.config.reconnect_max_s,
                )
        if lost:
            self._metrics.mqtt_disconnects_total.inc()
            self._log.warning(
                "lost the MQTT broker %s:%d (%s); alerts stay in the outbox, reconnecting in "
                "the background",
                self.config.host, self.config.port, reason_code, extra=ALWAYS,
            )
        self._wake.set()

    def _on_publish(
        self,
        client: paho.Client,
        userdata: object,
        mid: int,
        reason_code: ReasonCode,
        properties: object,
    ) -> None:
        # Runs with paho's outgoing-message lock held: no I/O, no locks a publisher may hold.
        if client is not self._client:
            return
        self._acks.append((mid, reason_code, self._clock(), self._monotonic()))
        self._wake.set()
