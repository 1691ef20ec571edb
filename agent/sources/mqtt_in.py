"""MQTT-in source (paho-mqtt): readings from devices that already publish to a broker.

The source runs paho's network loop in the supervisor's source thread. A message becomes a
reading by sample and hold: it updates the channels it carries, and a reading with every
channel's latest value is emitted once each channel has had one (formats and payload errors:
:mod:`agent.sources.mqtt_in_payloads`, Sparkplug B: :mod:`agent.sources.sparkplug`).

* **Session.** QoS 1 with ``clean_session = false`` and a stable client id (MQTT 3.1.1 §3.1.2.4):
  the broker keeps the subscriptions and queues QoS 1 messages while the agent is away, so
  readings published during a restart are read after it.
* **Connection.** A refused or lost connection, or a broker that accepts TCP and sends no
  CONNACK within ``keepalive_s``, is reported once per outage
  (:class:`agent.sources.base.ReportsStatus`) and retried with
  :class:`agent.sources.backoff.Backoff`.
* **Sparkplug B.** NBIRTH/DBIRTH map aliases to names; NDATA/DDATA update the mapped metrics;
  a ``seq`` gap, a changed ``bdSeq``, an alias or a device nobody announced, and data before any
  birth are counted (``edge_agent_sparkplug_events_total{event}``); the last three also reject
  the metric (``unknown_alias``). With ``request_rebirth`` the source then publishes an NCMD
  rebirth request, at most once per :data:`REBIRTH_EVERY_S`. The NDEATH, or the DDEATH of the
  stream's own device, clears the held values. The stream subscribes to all of the node's
  messages, other devices' included: ``seq`` runs over every message of the node (§6.4.21).
"""

from __future__ import annotations

import contextlib
import logging
import random
import re
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from agent.errors import RecordError, SourceError
from agent.records import Reading
from agent.secret_files import read_secret, warn_clear_password
from agent.sources import mqtt_in_payloads as payloads
from agent.sources.backoff import Backoff
from agent.sources.base import DeviceHooks, Emit, Reject, StatusListener
from agent.sources.mqtt_in_config import MqttInConfig

if TYPE_CHECKING:
    from agent.metrics import Metrics

#: Fewest seconds between two rebirth requests to one node.
REBIRTH_EVERY_S = 5.0
#: Longest wait in one pass of paho's loop, seconds.
LOOP_S = 0.1


class MqttInSource(DeviceHooks):
    """Subscribes to a broker; reconnects by itself; one reading per accepted message.

    Args:
        config: The ``mqtt`` config (paths already absolute).
        stream: Stream name stamped on every reading.
        client_factory: Builds a paho client ``(client_id, clean_session) -> Client``.
        clock, monotonic: Wall clock (receive-time stamps), monotonic clock.
        rng: Random source for the reconnect jitter.

    Attributes:
        stream, channels: As every source.
        connects: Sessions established. events: Sparkplug B events by name.
        missed: Readings counted missed from gaps in the payload timestamps
            (``expected_interval_s``).
    """

    def __init__(
        self,
        config: MqttInConfig,
        stream: str,
        *,
        client_factory: Callable[[str, bool], Any] | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self.stream = stream
        self.channels: tuple[str, ...] = config.channels
        self.client_id = config.client_id or _default_client_id(stream)
        self._factory = client_factory or _paho_client
        self._clock = clock
        self._monotonic = monotonic
        self._backoff = Backoff(config.reconnect_initial_s,
                                max(config.reconnect_max_s, config.reconnect_initial_s), rng=rng)
        self._listener: StatusListener | None = None
        self._metrics: Metrics | None = None
        self._values = np.full(len(self.channels), np.nan)
        self._index = {name: i for i, name in enumerate(self.channels)}
        self._lo = np.array([config.min.get(c, -np.inf) for c in self.channels])
        self._hi = np.array([config.max.get(c, np.inf) for c in self.channels])
        self._topics = {t: i for i, t in enumerate(config.channel_topics.values())}
        self._connected = threading.Event()
        self._lost_why: str | None = None
        self._node: Any = None
        self._last_rebirth = -np.inf
        self._last_ts: float | None = None
        self.connects = 0
        self.missed = 0
        self.events: dict[str, int] = {}
        self._password = self._read_password(config, stream)

    @staticmethod
    def _read_password(config: MqttInConfig, stream: str) -> str | None:
        """The broker password, checked as ``[mqtt]``'s (:func:`agent.secret_files.read_secret`:
        a file others can write is a ConfigError, one they can read a warning) and warned about
        once when it would cross the network in clear (no ``ca_file``, a non-loopback host)."""
        if config.username is None or config.password_file is None:
            return None
        key = f"stream {stream!r} source.password_file"
        password = read_secret(config.password_file, key, "password")
        if config.ca_file is None:
            warn_clear_password(key, config.host, config.port, config.username,
                                "set source.ca_file (TLS, port 8883)")
        return password

    # -- the loop -------------------------------------------------------------------------------

    def run(self, emit: Emit, reject: Reject, stop: threading.Event) -> None:
        """Read until ``stop`` is set; never raises for a broker that is down."""
        cfg = self.config
        client = self._factory(self.client_id, cfg.clean_session)
        if cfg.username is not None and self._password is not None:
            client.username_pw_set(cfg.username, self._password)
        if cfg.ca_file is not None:
            client.tls_set(ca_certs=cfg.ca_file)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_message = lambda _c, _u, msg: self._on_message(client, msg, emit, reject)
        try:
            while not stop.is_set():
                if not self._session(client, stop):
                    stop.wait(self._backoff.next_delay())
        finally:
            with contextlib.suppress(Exception):
                client.disconnect()
                client.loop(0.05)

    def _session(self, client: Any, stop: threading.Event) -> bool:
        """One connection, until it is lost or ``stop``; False = it failed (back off)."""
        cfg = self.config
        where = f"{cfg.host}:{cfg.port}"
        self._connected.clear()
        self._lost_why = None
        try:
            client.connect(cfg.host, cfg.port, keepalive=cfg.keepalive_s)
        except (OSError, ValueError) as exc:
            self._report(SourceError(f"cannot connect to the MQTT broker: {exc}",
                                     stream=self.stream, broker=where))
            return False
        deadline = self._monotonic() + cfg.keepalive_s
        while not stop.is_set():
            rc = client.loop(LOOP_S)
            if self._lost_why is not None or rc != 0:
                why = self._lost_why or f"network loop error {rc}"
                text = (f"MQTT connection lost: {why}" if self._connected.is_set() else
                        f"no CONNACK from the MQTT broker: {why}")
                self._report(SourceError(text, stream=self.stream, broker=where))
                with contextlib.suppress(Exception):
                    client.disconnect()
                return False
            if not self._connected.is_set() and self._monotonic() > deadline:
                self._report(SourceError(f"no CONNACK from the MQTT broker within "
                                         f"{cfg.keepalive_s} s", stream=self.stream,
                                         broker=where))
                with contextlib.suppress(Exception):
                    client.disconnect()
                return False
        return True

    def _on_connect(self, client: Any, _userdata: Any, _flags: Any, reason: Any,
                    _props: Any = None) -> None:
        if getattr(reason, "is_failure", False) or (isinstance(reason, int) and reason):
            self._lost_why = f"broker refused the connection: {reason}"
            return
        for topic in self._subscriptions():
            client.subscribe(topic, qos=self.config.qos)
        self.connects += 1
        self._connected.set()
        self._backoff.reset()
        self._report(None)

    def _on_disconnect(self, _client: Any, _userdata: Any, *args: Any) -> None:
        reason = args[1] if len(args) >= 2 else (args[0] if args else "")
        self._lost_why = f"disconnected ({reason})"

    def _subscriptions(self) -> list[str]:
        cfg = self.config
        if cfg.format == "json":
            return list(cfg.topics)
        if cfg.format == "number":
            return list(cfg.channel_topics.values())
        base = f"spBv1.0/{cfg.group_id}"
        node = cfg.edge_node_id
        # every device's messages too: seq counts all of the node's messages (§6.4.21), so a
        # stream that missed the other devices' would see gaps that are none
        return ([f"{base}/{k}/{node}" for k in ("NBIRTH", "NDEATH", "NDATA")]
                + [f"{base}/{k}/{node}/+" for k in ("DBIRTH", "DDEATH", "DDATA")])

    # -- messages -------------------------------------------------------------------------------

    def _on_message(self, client: Any, msg: Any, emit: Emit, reject: Reject) -> None:
        received_mono = self._monotonic()
        try:
            payloads.check_size(msg.payload, self.config.max_payload_bytes, msg.topic)
            fmt = self.config.format
            if fmt == "json":
                updates, ts = payloads.decode_json(msg.payload, list(self.config.fields.values()),
                                                   self.config.timestamp_field, msg.topic)
            elif fmt == "number":
                i = self._topics.get(msg.topic)
                if i is None:
                    return
                updates, ts = {i: payloads.decode_number(msg.payload, msg.topic)}, None
            else:
                updates, ts = self._sparkplug(client, msg, reject)
            self._observe_cadence(ts)
            self._check_range(updates)
        except RecordError as exc:
            reject(exc)
            return
        if not updates:
            return
        for i, v in updates.items():
            self._values[i] = v
        if np.isnan(self._values).any():
            return
        emit(Reading(self.stream, ts if ts is not None else self._clock(), self._values.copy(),
                     received_mono=received_mono))

    def _observe_cadence(self, ts: float | None) -> None:
        """With ``expected_interval_s``: count the readings a jump in the payload timestamps
        says were never received (published while the broker was down, or dropped before it).
        Late or repeated messages (QoS 1 may deliver twice) move nothing back."""
        cadence = self.config.expected_interval_s
        if cadence is None or ts is None:
            return
        last = self._last_ts
        self._last_ts = ts if last is None else max(last, ts)
        if last is None or ts - last <= 1.5 * cadence:
            return
        missed = round((ts - last) / cadence) - 1
        self.missed += missed
        if self._metrics is not None:
            self._metrics.polls_missed_total.labels(stream=self.stream, reason="gap").inc(missed)

    def _check_range(self, updates: dict[int, float]) -> None:
        for i, v in updates.items():
            if not self._lo[i] <= v <= self._hi[i]:
                raise RecordError(f"{self.channels[i]}: {v} outside "
                                  f"[{self._lo[i]}, {self._hi[i]}]", reason="out_of_range")

    def _sparkplug(self, client: Any, msg: Any, reject: Reject
                   ) -> tuple[dict[int, float], float | None]:
        from agent.sources import sparkplug as sp  # noqa: PLC0415 - protobuf only when used

        if self._node is None:
            self._node = sp.NodeState()
        try:
            topic = sp.parse_topic(msg.topic)
            payload = sp.decode(msg.payload)
        except sp.SparkplugError as exc:
            raise RecordError(str(exc), reason=exc.reason) from None
        node, kind, device = self._node, topic.kind, topic.device
        if kind == "NDEATH":
            node.last_seq = None
            self._values[:] = np.nan
            return {}, None
        if payload.HasField("seq") and kind != "NBIRTH":
            gap = node.observe_seq(int(payload.seq))
            if gap:
                self._event("seq_gap", gap)
                self._rebirth(client)
        if kind == "DDEATH":  # carries a seq; clears only this stream's device
            if (device or None) == self.config.device_id:
                self._values[:] = np.nan
            return {}, None
        if kind == "NBIRTH":
            node.last_seq = int(payload.seq) % 256 if payload.HasField("seq") else None
            if node.birth(None, payload) is not None:
                self._event("bdseq_change")
        elif kind == "DBIRTH":
            node.birth(topic.device, payload)
        if (device or None) != self.config.device_id:
            return {}, None
        if kind in ("NDATA", "DDATA") and device not in node.aliases:
            self._event("data_before_birth")
            self._rebirth(client)
        updates: dict[int, float] = {}
        newest: float | None = None
        for m in payload.metrics:
            name = node.name_of(device, m)
            if name is None:
                self._event("unknown_alias")
                reject(RecordError(f"metric alias {int(m.alias)} of {msg.topic[:200]!r} was "
                                   "never born", reason="unknown_alias"))
                self._rebirth(client)
                continue
            i = self._index.get(self._metric_channel(name))
            value = sp.metric_value(m)
            if i is None:
                continue
            if value is None:
                if not m.is_null:  # a null metric is "no value now", not a wrong one
                    reject(RecordError(f"metric {name!r} of {msg.topic[:200]!r} is not a number",
                                       reason="wrong_type"))
                continue
            updates[i] = payloads.number(value, f"metric {name!r}")
            if m.HasField("timestamp"):
                t = payloads.check_epoch(int(m.timestamp) / 1000.0, int(m.timestamp))
                newest = t if newest is None else max(newest, t)
        if newest is None and payload.HasField("timestamp"):
            newest = payloads.check_epoch(int(payload.timestamp) / 1000.0,
                                          int(payload.timestamp))
        return updates, newest

    def _metric_channel(self, metric: str) -> str:
        for channel, name in self.config.metrics.items():
            if name == metric:
                return channel
        return ""

    def _rebirth(self, client: Any) -> None:
        from agent.sources import sparkplug as sp  # noqa: PLC0415

        now = self._monotonic()
        if not self.config.request_rebirth or now - self._last_rebirth < REBIRTH_EVERY_S:
            return
        self._last_rebirth = now
        cfg = self.config
        client.publish(f"spBv1.0/{cfg.group_id}/NCMD/{cfg.edge_node_id}",
                       sp.rebirth_payload(int(self._clock() * 1000)), qos=0)
        self._event("rebirth_requested")

    def _event(self, name: str, count: int = 1) -> None:
        self.events[name] = self.events.get(name, 0) + count
        if self._metrics is not None:
            self._metrics.sparkplug_events_total.labels(stream=self.stream, event=name).inc(count)


def _default_client_id(stream: str) -> str:
    host = re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname())[:40]
    return f"edge-agent-in-{host}-{stream}"[:128]


def _paho_client(client_id: str, clean_session: bool) -> Any:
    import paho.mqtt.client as mqtt  # noqa: PLC0415
    from paho.mqtt.enums import CallbackAPIVersion  # noqa: PLC0415

    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id,
                         clean_session=clean_session, protocol=mqtt.MQTTv311)
    client.enable_logger(logging.getLogger("agent.sources.mqtt_in.paho"))
    logging.getLogger("agent.sources.mqtt_in.paho").setLevel(logging.CRITICAL)
    return client
