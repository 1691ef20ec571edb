"""MQTT-in source (paho-mqtt): readings from devices that already publish to a broker.

The source runs paho's network loop in the supervisor's source thread. A message becomes a
reading by sample and hold: it updates the channels it carries, and a reading with every
channel's latest value is emitted once each channel has had one (formats and payload errors:
:mod:`agent.sources.mqtt_in_payloads`, Sparkplug B: :mod:`agent.sources.mqtt_in_sparkplug`).

* **Session.** QoS 1 with ``clean_session = false`` and a stable client id (MQTT 3.1.1 §3.1.2.4):
  the broker keeps the subscriptions and queues QoS 1 messages while the agent is away, so
  readings published during a restart are read after it.
* **Connection.** A refused or lost connection, or a broker that accepts TCP and sends no
  CONNACK within ``keepalive_s``, is reported once per outage
  (:class:`agent.sources.base.ReportsStatus`) and retried with
  :class:`agent.sources.backoff.Backoff`.
* **Back-pressure.** paho's callback never waits for the pipeline: under a supervisor the
  readings are handed over with a non-blocking offer (:class:`agent.sources.base.TakesOffer`),
  QoS 1 messages are acknowledged only once their reading is queued, and readings the queue has
  no room for wait in :class:`agent.sources.mqtt_in_hold.HeldMessages` (at most
  :data:`HOLD_LIMIT`; that module tells what happens beyond it and on a reconnect) while paho's
  loop, keepalive included, keeps running. The broker holds back the rest (its inflight window)
  and queues it for the session.
* **Per message** the work is one JSON decode and a few dict lookups: field paths are split,
  range bounds and metric children looked up once per stream, not per message.
"""

from __future__ import annotations

import contextlib
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
from agent.sources.base import DeviceHooks, Emit, Offer, Reject, StatusListener
from agent.sources.mqtt_in_config import MqttInConfig
from agent.sources.mqtt_in_hold import Held, HeldMessages

if TYPE_CHECKING:
    from agent.metrics import Metrics
    from agent.sources.mqtt_in_sparkplug import SparkplugInput

#: Longest wait in one pass of paho's loop, seconds; while readings wait for room in the agent's
#: queue, also the longest wait for that room before paho's loop runs again.
LOOP_S = 0.1
#: Most messages waiting for room in the agent's queue (:mod:`agent.sources.mqtt_in_hold`).
HOLD_LIMIT = 1000
#: Most messages read in one burst before their readings are handed over.
BURST = 64


class MqttInSource(DeviceHooks):
    """Subscribes to a broker; reconnects by itself; one reading per accepted message.

    Args:
        config: The ``mqtt`` config (paths already absolute).
        stream: Stream name stamped on every reading.
        client_factory: Builds a paho client ``(client_id, clean_session) -> Client``.
        clock, monotonic: Wall clock (receive-time stamps), monotonic clock.
        rng: Random source for the reconnect jitter.
        hold_limit: Most messages waiting for room in the agent's queue.

    Attributes:
        stream, channels: As every source.
        connects: Sessions established. events: Sparkplug B events by name.
        missed: Readings counted missed from gaps in the payload timestamps
            (``expected_interval_s``).
        held: Messages waiting for room in the agent's queue.
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
        hold_limit: int = HOLD_LIMIT,
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
        self._have = [False] * len(self.channels)
        self._missing = len(self.channels)
        self._bounds = {i: (config.min.get(c, -np.inf), config.max.get(c, np.inf))
                        for i, c in enumerate(self.channels) if c in config.min or c in config.max}
        self._topics = {t: i for i, t in enumerate(config.channel_topics.values())}
        self._paths = [payloads.field_path(f) for f in config.fields.values()]
        self._ts_path = (None if config.timestamp_field is None
                         else payloads.field_path(config.timestamp_field))
        self._connected = threading.Event()
        self._lost_why: str | None = None
        self._spb: SparkplugInput | None = None
        self._last_ts: float | None = None
        self._children: dict[tuple[str, str], Any] = {}
        self._offer: Offer | None = None
        self._manual_ack = False
        self.held = HeldMessages(hold_limit)
        self._received = 0
        self._burst = min(BURST, hold_limit)
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

    def set_offer(self, offer: Offer | None) -> None:
        """Hand readings over with ``offer`` (never blocking paho's loop; module docstring)."""
        self._offer = offer

    # -- the loop -------------------------------------------------------------------------------

    def run(self, emit: Emit, reject: Reject, stop: threading.Event) -> None:
        """Read until ``stop`` is set; never raises for a broker that is down."""
        cfg = self.config
        client = self._factory(self.client_id, cfg.clean_session)
        client.manual_ack_set(True)  # acknowledged once queued (module docstring)
        self._manual_ack = True
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
            self._stopped(reject)
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
            seen = self._received
            # waiting readings: the release below waits for room instead of paho's select
            rc = client.loop(0.0 if self.held and self._connected.is_set() else LOOP_S)
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
            if self._received != seen and len(self.held) < self._burst:
                continue  # more may be in the socket: read on, hand over the burst at once
            if self.held and self._offer is not None and self._connected.is_set():
                self.held.release(self._offer, client.ack, self.connects, LOOP_S)
        return True

    def _stopped(self, reject: Reject) -> None:
        """At stop: the waiting messages the broker delivers again at the next start (QoS 1,
        persistent session: never acknowledged) are left to it; any other waiting reading is
        counted rejected (``stopped``)."""
        persistent = not self.config.clean_session
        self.held.connection_lost(lambda h: persistent and h.qos > 0)
        for _ in self.held.clear():
            reject(RecordError("reading still waiting for room in the agent's queue when the "
                               "stream stopped", reason="stopped"))

    def _on_connect(self, client: Any, _userdata: Any, flags: Any, reason: Any,
                    _props: Any = None) -> None:
        if getattr(reason, "is_failure", False) or (isinstance(reason, int) and reason):
            self._lost_why = f"broker refused the connection: {reason}"
            return
        for topic in self._subscriptions():
            client.subscribe(topic, qos=self.config.qos)
        self.connects += 1
        if self.held and _session_present(flags):
            # the broker delivers its unacknowledged QoS 1 messages again (MQTT 3.1.1 §4.4)
            self.held.connection_lost(lambda h: h.qos > 0)
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
        self._received += 1
        reading = self._read(client, msg, reject)
        qos = getattr(msg, "qos", 0)
        if self._offer is None:  # no supervisor's offer: hand over directly
            if reading is not None:
                emit(reading)
            self._ack(client, msg, qos)
        elif reading is not None or qos > 0:  # handed over (or acknowledged) after the burst
            item = Held(reading, msg.mid, qos, self.connects)
            if self.held.hold(item, client.ack, self.connects) is not None:
                reject(RecordError(f"{len(self.held)} messages already wait for room in the "
                                   "agent's queue; the oldest reading was dropped",
                                   reason="queue_full"))

    def _ack(self, client: Any, msg: Any, qos: int) -> None:
        if self._manual_ack and qos > 0:
            client.ack(msg.mid, qos)

    def _read(self, client: Any, msg: Any, reject: Reject) -> Reading | None:
        """The reading ``msg`` completes, or None (rejected, or channels still missing)."""
        received_mono = self._monotonic()
        try:
            if len(msg.payload) > self.config.max_payload_bytes:
                payloads.check_size(msg.payload, self.config.max_payload_bytes, msg.topic)
            fmt = self.config.format
            if fmt == "json":
                updates, ts = payloads.decode_json(msg.payload, self._paths, self._ts_path,
                                                   msg.topic)
            elif fmt == "number":
                i = self._topics.get(msg.topic)
                if i is None:
                    return None
                updates, ts = {i: payloads.decode_number(msg.payload, msg.topic)}, None
            else:
                updates, ts, clear = self._sparkplug().read(client, msg, reject)
                if clear:
                    self._clear_values()
            if self.config.expected_interval_s is not None:
                self._observe_cadence(ts)
            if self._bounds:
                self._check_range(updates)
        except RecordError as exc:
            reject(exc)
            return None
        values, have = self._values, self._have
        for i, v in updates.items():
            values[i] = v
            if not have[i]:
                have[i] = True
                self._missing -= 1
        if not updates or self._missing:
            return None
        return Reading(self.stream, ts if ts is not None else self._clock(), values.copy(),
                       received_mono=received_mono)

    def _clear_values(self) -> None:
        self._values[:] = np.nan
        self._have = [False] * len(self.channels)
        self._missing = len(self.channels)

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
        self._count("polls_missed_total", "gap", missed)

    def _check_range(self, updates: dict[int, float]) -> None:
        for i, v in updates.items():
            bounds = self._bounds.get(i)
            if bounds is not None and not bounds[0] <= v <= bounds[1]:
                raise RecordError(f"{self.channels[i]}: {v} outside "
                                  f"[{bounds[0]}, {bounds[1]}]", reason="out_of_range")

    def _sparkplug(self) -> SparkplugInput:
        if self._spb is None:
            from agent.sources.mqtt_in_sparkplug import (  # noqa: PLC0415 - protobuf if used
                SparkplugInput,
            )

            self._spb = SparkplugInput(self.config, self._event, self._clock, self._monotonic)
        return self._spb

    def _event(self, name: str, count: int) -> None:
        self.events[name] = self.events.get(name, 0) + count
        self._count("sparkplug_events_total", name, count)

    def _count(self, metric: str, label: str, n: int) -> None:
        """Add ``n`` to this stream's ``metric`` child ``label`` (looked up once, then kept)."""
        if self._metrics is None:
            return
        child = self._children.get((metric, label))
        if child is None:
            family = getattr(self._metrics, metric)
            second = "reason" if metric == "polls_missed_total" else "event"
            child = family.labels(**{"stream": self.stream, second: label})
            self._children[(metric, label)] = child
        child.inc(n)


def _session_present(flags: Any) -> bool:
    """CONNACK's session-present flag (paho's ConnectFlags, or a dict of the old API)."""
    if isinstance(flags, dict):
        return bool(flags.get("session present"))
    return bool(getattr(flags, "session_present", False))


def _default_client_id(stream: str) -> str:
    host = re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname())[:40]
    return f"edge-agent-in-{host}-{stream}"[:128]


def _paho_client(client_id: str, clean_session: bool) -> Any:
    import paho.mqtt.client as mqtt  # noqa: PLC0415
    from paho.mqtt.enums import CallbackAPIVersion  # noqa: PLC0415

    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id,
                         clean_session=clean_session, protocol=mqtt.MQTTv311)
    return client
