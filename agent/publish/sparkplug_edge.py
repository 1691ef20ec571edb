"""Sparkplug B output: the agent as a Sparkplug edge node, each stream one Sparkplug device.

Opt-in (``[mqtt.sparkplug] enabled = true``), on the broker of ``[mqtt]`` (host, port, TLS,
credentials, protocol) but over a **separate MQTT connection**: a Sparkplug edge node's last
will must be its NDEATH, and an MQTT connection has only one will, which on the alerts
connection is the ``offline`` availability message consumers of the alerts rely on. The second
connection also keeps Sparkplug's QoS 0 traffic and rebirth bursts out of the alerts' in-flight
window.

Protocol (Eclipse Sparkplug 3.0.0; payloads in :mod:`agent.publish.sparkplug_payloads`), topics
``spBv1.0/<group_id>/<verb>/<edge_node_id>[/<stream>]``:

* every MQTT CONNECT carries the NDEATH as its will (QoS 1, not retained) with a bdSeq one
  higher than the previous CONNECT's (0-255, wrapping; saved in ``<state_dir>/sparkplug.bdseq``
  before the CONNECT, so a restart does not repeat it); clean start, no session;
* on each connection: subscribe to ``NCMD``, then NBIRTH (``seq`` 0, that bdSeq,
  ``Node Control/Rebirth`` = false) and one DBIRTH per stream with all its metrics
  (``Anomaly/Score`` and ``Anomaly/Threshold`` Double, ``Anomaly/Active`` Boolean, ``Status``
  String, ``Model/Version`` Int64) and their aliases; every message QoS 0, not retained;
* a stream's state changes (:class:`agent.publish.stream_state.StateBoard`) go out as DDATA
  with the changed metrics by alias only; a change of status, threshold or model at once, a
  score-only change at most every ``min_data_interval_s`` per stream (the latest score then);
* a stream removed from the board gets a DDEATH; ``seq`` goes 0-255 and wraps, per message;
* an NCMD setting ``Node Control/Rebirth`` (by name or alias) to true: NBIRTH (same bdSeq: the
  session is the same) and every DBIRTH again; requests that arrive during one rebirth are one;
* a clean stop publishes the NDEATH itself, then disconnects (the broker then drops the will).

Not implemented: waiting for a primary host application's STATE before the births, DCMD
(devices take no commands), NDATA (the node has no metrics of its own but the two above).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from agent.logs import RateLimiter
from agent.metrics import Metrics
from agent.publish import sparkplug_payloads as sp
from agent.publish.mqtt_config import (
    MqttConfig,
    SparkplugConfig,
    default_client_factory,
    read_password,
)
from agent.publish.mqtt_tls import failure_of, tls_context
from agent.publish.stream_state import StateBoard, StreamState
from agent.sparkplug_b import NAMESPACE, SparkplugError

KIND = "sparkplug"
#: The file (in ``agent.state_dir``) holding the last bdSeq used.
BDSEQ_FILE = "sparkplug.bdseq"


class SparkplugEdgeNode:
    """The Sparkplug B edge node (see the module docstring for the protocol).

    Args:
        config: The ``[mqtt]`` section (connection settings and ``sparkplug``).
        device_id: ``agent.device_id`` (the default edge node id and client id part).
        streams: The configured stream names, in config order (device order and aliases).
        metrics: Receives ``sparkplug_connected``, ``sparkplug_messages_total{kind}`` and
            ``sparkplug_commands_total{result}``.
        state_dir: Where :data:`BDSEQ_FILE` is kept.
        client_factory: Builds the paho client from keyword arguments (as the publisher's).
        clock: Wall clock, epoch seconds UTC (payload timestamps).
        monotonic: Monotonic clock, seconds (the data interval).
        logger: Where connection changes and bad commands are logged.

    Raises:
        ConfigError: The ``[mqtt]`` password file cannot be read (as for the publisher).
    """

    def __init__(self, config: MqttConfig, device_id: str, streams: Sequence[str], metrics: Metrics,
                 state_dir: Path, *, client_factory: Callable[..., paho.Client] | None = None,
                 clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic,
                 logger: logging.Logger | None = None) -> None:
        sc: SparkplugConfig = config.sparkplug
        assert sc.group_id is not None  # MqttConfig requires it when enabled
        self.config = config
        self.group_id = sc.group_id
        self.edge_node_id = sc.edge_node_id or device_id
        base_id = config.client_id or f"edge-agent-{device_id}"
        self.client_id = sc.client_id or f"{base_id}-sparkplug"
        self._interval = sc.min_data_interval_s
        self._metrics = metrics
        self._clock = clock
        self._monotonic = monotonic
        self._log = logger or logging.getLogger(__name__)
        self._bdseq = sp.BdSeqFile(Path(state_dir) / BDSEQ_FILE, self._log)
        self._password = read_password(config.password_file) if config.password_file else None
        self._factory = client_factory or default_client_factory
        self._bad_commands = RateLimiter(60.0, monotonic)

        self._lock = threading.Lock()
        self._connected = False
        self._need_birth = False
        self._rebirth = False
        self._outage_logged = False
        self._index = {name: i for i, name in enumerate(streams)}  # alias blocks, never reused
        self._active: list[str] = list(streams)  # devices in the births, in order
        self._latest: dict[str, StreamState] = {}
        self._dirty: set[str] = set()
        self._deaths: set[str] = set()
        #: The bdSeq in the will of the CONNECT in flight / of the session that is up.
        self.bd_seq: int | None = None
        # Owned by the worker thread (under _lock while publishing).
        self._seq = 0
        self._born: dict[str, dict[str, sp.Value]] = {}
        self._next_score: dict[str, float] = {}

        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._client = self._make_client()

    # -- topics ---------------------------------------------------------------------------------

    def node_topic(self, verb: str) -> str:
        """``spBv1.0/<group>/<verb>/<node>``."""
        return f"{NAMESPACE}/{self.group_id}/{verb}/{self.edge_node_id}"

    def device_topic(self, verb: str, stream: str) -> str:
        """``spBv1.0/<group>/<verb>/<node>/<stream>``."""
        return f"{self.node_topic(verb)}/{stream}"

    @property
    def connected(self) -> bool:
        """True while the Sparkplug connection is up."""
        with self._lock:
            return self._connected

    # -- the paho client ------------------------------------------------------------------------

    def _make_client(self) -> paho.Client:
        c = self.config
        if c.protocol == "5":
            client = self._factory(callback_api_version=CallbackAPIVersion.VERSION2,
                                   client_id=self.client_id, protocol=paho.MQTTv5)
        else:
            client = self._factory(callback_api_version=CallbackAPIVersion.VERSION2,
                                   client_id=self.client_id, protocol=paho.MQTTv311,
                                   clean_session=True)
        if c.username is not None:
            client.username_pw_set(c.username, self._password)
        if c.tls:
            client.tls_set_context(tls_context(c))
        client.reconnect_delay_set(max(1, math.ceil(c.reconnect_min_s)),
                                   max(1, math.ceil(c.reconnect_max_s)))
        client.on_pre_connect = self._on_pre_connect
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        return client

    def _on_pre_connect(self, client: paho.Client, userdata: object) -> None:
        # Every CONNECT packet gets the next bdSeq in its will (the NDEATH).
        bd = self._bdseq.next()
        with self._lock:
            self.bd_seq = bd
        client.will_set(self.node_topic("NDEATH"), sp.node_death(bd, self._ms()), qos=1,
                        retain=False)

    def _on_connect(self, client: paho.Client, userdata: object, flags: paho.ConnectFlags,
                    reason_code: ReasonCode, properties: object) -> None:
        if reason_code.is_failure:
            self._note_failure(f"refused: {reason_code}")
            return
        client.subscribe(self.node_topic("NCMD"), qos=1)
        with self._lock:
            self._connected = True
            self._need_birth = True
            recovered, self._outage_logged = self._outage_logged, False
        self._metrics.sparkplug_connected.set(1)
        self._log.info("Sparkplug B: connected to %s:%d as edge node %s/%s (bdSeq %s)%s",
                       self.config.host, self.config.port, self.group_id, self.edge_node_id,
                       self.bd_seq, " again" if recovered else "")
        self._wake.set()

    def _on_connect_fail(self, client: paho.Client, userdata: object) -> None:
        self._note_failure(failure_of(client) or "unreachable")

    def _note_failure(self, cause: str) -> None:
        with self._lock:
            first, self._outage_logged = not self._outage_logged, True
        if first:
            self._log.warning("Sparkplug B: MQTT broker %s:%d: %s; retrying in the background",
                              self.config.host, self.config.port, cause)

    def _on_disconnect(self, client: paho.Client, userdata: object,
                       flags: paho.DisconnectFlags, reason_code: ReasonCode,
                       properties: object) -> None:
        with self._lock:
            was, self._connected = self._connected, False
            self._need_birth = True
        self._metrics.sparkplug_connected.set(0)
        if was and not self._stopping.is_set():
            self._note_failure(f"connection lost ({reason_code})")

    def _on_message(self, client: paho.Client, userdata: object, msg: paho.MQTTMessage) -> None:
        if msg.topic != self.node_topic("NCMD"):
            return
        try:
            wanted = sp.rebirth_requested(bytes(msg.payload))
        except SparkplugError as exc:
            self._metrics.sparkplug_commands_total.labels(result="rejected").inc()
            if self._bad_commands.hit(exc.reason) is not None:
                self._log.warning("Sparkplug B: NCMD rejected: %s", exc)
            return
        if not wanted:
            self._metrics.sparkplug_commands_total.labels(result="ignored").inc()
            return
        self._metrics.sparkplug_commands_total.labels(result="rebirth").inc()
        with self._lock:
            self._rebirth = True
        self._wake.set()

    # -- the board ------------------------------------------------------------------------------

    def attach(self, board: StateBoard) -> None:
        """Follow ``board`` (call before :meth:`start`)."""
        board.subscribe(self._on_state)

    def _on_state(self, stream: str, state: StreamState | None) -> None:
        # The producer's thread: record and wake the worker, nothing else.
        with self._lock:
            if state is None:
                self._latest.pop(stream, None)
                if stream in self._active:
                    self._active.remove(stream)
                    self._deaths.add(stream)
            else:
                self._latest[stream] = state
                if stream not in self._index:
                    self._index[stream] = len(self._index)
                if stream not in self._active:
                    self._active.append(stream)
                self._deaths.discard(stream)
                self._dirty.add(stream)
        self._wake.set()

    # -- the worker -----------------------------------------------------------------------------

    def start(self) -> None:
        """Connect in the background and start the worker thread; never blocks."""
        self._metrics.sparkplug_connected.set(0)
        if self.config.protocol == "5":
            props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            props.SessionExpiryInterval = 0
            self._client.connect_async(self.config.host, self.config.port,
                                       self.config.keepalive_s, clean_start=True,
                                       properties=props)
        else:
            self._client.connect_async(self.config.host, self.config.port,
                                       self.config.keepalive_s)
        self._client.loop_start()
        self._thread = threading.Thread(target=self._run, name="sparkplug", daemon=True)
        self._thread.start()

    def _ms(self) -> int:
        return int(self._clock() * 1000)

    def _send(self, topic: str, payload: bytes, kind: str) -> bool:
        """Publish QoS 0, not retained (``payload`` holds its seq from :meth:`_take_seq`);
        False when the connection went (a new one starts with births)."""
        info = self._client.publish(topic, payload, qos=0, retain=False)
        if info.rc != paho.MQTT_ERR_SUCCESS:
            return False
        self._metrics.sparkplug_messages_total.labels(kind=kind).inc()
        return True

    def _take_seq(self) -> int:
        seq = self._seq
        self._seq = (self._seq + 1) % 256
        return seq

    def _run(self) -> None:
        timeout = 1.0
        while not self._stopping.is_set():
            self._wake.wait(timeout)
            self._wake.clear()
            try:
                timeout = self._pass()
            except Exception:  # the worker must survive anything; the next pass retries
                self._log.exception("Sparkplug B worker failed; retrying")
                timeout = 1.0

    def _pass(self) -> float:
        """One pass: births when due, deaths, data; returns the seconds until the next one."""
        with self._lock:  # held while publishing: a reconnect cannot slip between
            if not self._connected or self._stopping.is_set():
                return 1.0
            if self._need_birth or self._rebirth:
                self._births()
                return 1.0
            now = self._monotonic()
            for stream in sorted(self._deaths):
                if self._born.pop(stream, None) is not None:
                    self._send(self.device_topic("DDEATH", stream),
                               sp.device_death(self._take_seq(), self._ms()), "DDEATH")
            self._deaths.clear()
            wait = 1.0
            for stream in sorted(self._dirty):
                if stream not in self._active:  # removed since: its DDEATH went above
                    self._dirty.discard(stream)
                    continue
                later = self._data(stream, now)
                if later is not None:
                    wait = min(wait, later)
            return max(wait, 0.01)

    def _births(self) -> None:
        """NBIRTH and every DBIRTH (``_lock`` held)."""
        assert self.bd_seq is not None
        self._need_birth = self._rebirth = False
        self._seq = 1  # the NBIRTH is seq 0
        self._born.clear()
        self._dirty.clear()
        if not self._send(self.node_topic("NBIRTH"), sp.node_birth(self.bd_seq, self._ms()),
                          "NBIRTH"):
            self._need_birth = True
            return
        for stream in self._active:
            values = sp.device_values(self._latest.get(stream))
            payload = sp.device_birth(self._index[stream], values, self._take_seq(), self._ms())
            if not self._send(self.device_topic("DBIRTH", stream), payload, "DBIRTH"):
                self._need_birth = True
                return
            self._born[stream] = values
            self._next_score[stream] = self._monotonic() + self._interval

    def _data(self, stream: str, now: float) -> float | None:
        """DDATA (or DBIRTH, for a device not born yet) for a dirty stream; returns the seconds
        to wait when a score-only change is held back (``_lock`` held)."""
        values = sp.device_values(self._latest.get(stream))
        born = self._born.get(stream)
        if born is None:
            payload = sp.device_birth(self._index[stream], values, self._take_seq(), self._ms())
            if self._send(self.device_topic("DBIRTH", stream), payload, "DBIRTH"):
                self._born[stream] = values
                self._next_score[stream] = now + self._interval
            self._dirty.discard(stream)
            return None
        changed = {k: v for k, v in values.items() if born.get(k) != v}
        if not changed:
            self._dirty.discard(stream)
            return None
        due = self._next_score.get(stream, 0.0)
        if set(changed) == {"Anomaly/Score"} and now < due:
            return due - now  # stays dirty: the latest score goes out when due
        payload = sp.device_data(self._index[stream], changed, self._take_seq(), self._ms())
        if self._send(self.device_topic("DDATA", stream), payload, "DDATA"):
            born.update(changed)
            self._next_score[stream] = now + self._interval
        self._dirty.discard(stream)
        return None

    def stop(self, timeout_s: float = 5.0) -> None:
        """Publish the NDEATH (same bdSeq as the NBIRTH), disconnect and end the threads."""
        if self._thread is None or self._stopping.is_set():
            return
        self._stopping.set()
        self._wake.set()
        self._thread.join(timeout_s)
        with self._lock:
            connected, bd = self._connected, self.bd_seq
        if connected and bd is not None:
            info = self._client.publish(self.node_topic("NDEATH"), sp.node_death(bd, self._ms()),
                                        qos=1, retain=False)
            try:
                info.wait_for_publish(timeout=min(timeout_s, 2.0))
                self._metrics.sparkplug_messages_total.labels(kind="NDEATH").inc()
            except (RuntimeError, ValueError) as exc:
                self._log.warning("Sparkplug B: NDEATH not sent before disconnecting: %s", exc)
        self._client.disconnect()
        self._client.loop_stop()
        with self._lock:
            self._connected = False
        self._metrics.sparkplug_connected.set(0)
