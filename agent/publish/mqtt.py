"""MQTT alert publisher: drains the store's outbox to a broker with QoS 1, plus availability/LWT.

Topics (``<prefix>`` is ``mqtt.topic_prefix``, default ``edge``; ``<device_id>`` is
``agent.device_id``):

``<prefix>/<device_id>/<stream>/events``
    Every episode event of the stream (``raised``, ``updated``, ``cleared``; docs/mqtt.md,
    "Alert lifecycle"), QoS 1, not retained, from the outbox like the alerts below.

``<prefix>/<device_id>/<stream>/state``
    The stream's present state, retained, QoS 1, not through the outbox
    (:mod:`agent.publish.state`, :meth:`MqttPublisher.publish_latest`).

``<prefix>/<device_id>/alerts`` (deprecated)
    One message per ``raised`` event, QoS 1, not retained; the same payload also goes to the
    stream's events topic and the row leaves the outbox when both are acknowledged
    (:meth:`MqttPublisher.topics_for`). The payload is ``Alert.to_payload()`` (schema 2: the
    keys of schema 1 below, plus ``event`` and ``episode_id``) as compact JSON, UTF-8::

        {"schema": 2, "event": "raised", "episode_id": "gw1:pump1:42",
         "alert_id": "gw1:pump1:42", "device_id": "gw1", "stream": "pump1",
         "seq": 42, "model": {"name": "ae", "version": 3}, "score": 2.51, "threshold": 1.0,
         "window_start": "2024-05-01T12:00:00.000Z", "window_end": "2024-05-01T12:00:01.000Z",
         "raised_at": "2024-05-01T12:00:01.020Z",
         "top_channels": [{"channel": "temp", "contribution": 0.75}]}

    ``alert_id`` is ``<device_id>:<stream>:<seq>``, unique and never reused (``seq`` comes from
    the store and survives restarts, also a store that lost its last commits: the id ledger,
    :mod:`agent.store.ids`).

    ``source`` (optional, additive: still schema 1) names where the alerting frame of a
    **recorded** camera input came from: an image folder's file, relative to the folder, or a
    video file's name and the frame's 0-based index in it::

        "source": {"file": "defects/crack_01.png"}
        "source": {"file": "line1.avi", "frame": 1234}

    File-name bytes that are not UTF-8 are sent as U+FFFD. The key is absent on sensor alerts
    and on live cameras (device, URL), whose payloads are as before. A camera alert has
    ``window_start == window_end`` (the frame's time) and an empty ``top_channels``.

``<prefix>/<device_id>/availability``
    Retained, QoS 1: ``online`` after every connect; ``offline`` on a clean stop, and as the
    last will, which the broker publishes when the connection dies uncleanly (crash, power cut,
    network loss past 1.5 x keepalive). Not retained once the broker said it takes no
    retained messages (MQTT 5 CONNACK "Retain not supported" 0x9A, or Retain Available 0; over
    3.1.1, :data:`NO_CONNACK_STRIKES` connections in a row closed before a CONNACK): a new
    client without the retained will is started (one WARNING), so the alerts go out; or with
    ``mqtt.retain = false``.

Delivery guarantee (what consumers may rely on):
    * at least once: an alert is marked published in the store only when the broker's PUBACK
      for its message id arrives; until then it stays in the outbox, across broker outages and
      agent restarts;
    * in order: first deliveries arrive in outbox order (order of raising). An alert in
      flight when a connection ends is re-sent once on the next one (by paho, DUP flag set;
      the drain does not send it again), so up to ``max_inflight`` alerts arrive twice per
      lost connection: consumers deduplicate by ``alert_id``;
    * progress: with alerts in flight, the connection up and no PUBACK for
      ``progress_timeout_s`` (3 keepalives), the connection is dropped and rebuilt (one
      WARNING line, ``mqtt_stalls_total``);
    * size: an alert over ``max_message_bytes`` or the broker's Maximum Packet Size (MQTT 5
      CONNACK) goes out in its reduced form (:mod:`agent.publish.limits`) or, too large even
      then, is dead-lettered in the store with the reason (still uploaded to the fleet); a
      PUBACK refusing the message itself (MQTT 5: Payload format invalid, Packet too large)
      dead-letters the alert too; any other failure code (Not authorized, Quota exceeded...)
      leaves it in the outbox for the next connection (logged once per code, counted in
      ``mqtt_rejected_total{reason}``). A limit the broker does not announce (3.1.1) shows as
      the same alert first in flight at 3 short connections in a row: its size is learned as
      the limit and a new paho client started without it (:class:`agent.publish.limits.
      PoisonWatch`). None of these blocks the alerts behind it;
    * only QoS 1 is accepted: QoS 0 would lose alerts, QoS 2 costs a round trip for nothing
      that ``alert_id`` deduplication does not already give;
    * an alert the store refused (disk full) is handed over with :meth:`MqttPublisher.
      publish_volatile` and held in memory instead (:mod:`agent.publish.volatile`): same
      guarantees while the process lives, in order among the stored ones; lost (and counted in
      ``dropped_total{kind="alert", reason="store_error"}``) if the process stops before its
      PUBACK;
    * publish while committing (:meth:`MqttPublisher.publish_early`): a new alert goes out from
      memory while the store writer commits it; its outbox row is marked published once both
      are done (:mod:`agent.publish.early`, which says what holds after a crash between the two).

Threads: paho's network loop (``loop_start``) runs the callbacks; they only set flags, queue the
acknowledged message ids and wake the drain thread. The drain thread (``mqtt-outbox``) is the
only one that reads the outbox and marks rows published (in batches), and it publishes
everything except an early alert that is the very next message due, which the thread raising it
hands to paho itself (:meth:`OutboxDrain._send_direct`, under the same send lock and with the
same bookkeeping, so order and the in-flight bound hold as before); while the
store refuses that write (disk full) the acknowledgements wait in memory, the save is tried again
once a second and publishing goes on (the alerts the store refused depend on it). Nothing is
published while disconnected (paho would queue it a second time); paho itself re-sends the
messages it holds unacknowledged after a reconnect, and the drain skips those.

Protocol: MQTT 5 by default (clean start, session expiry 0, the broker's Maximum Packet Size
and PUBACK reason codes); ``protocol = "3.1.1"`` keeps the old protocol (clean session).

Other publishers on this connection (:meth:`MqttPublisher.publish_extra`,
:meth:`MqttPublisher.add_connect_listener`, :meth:`MqttPublisher.subscribe_filter`): Home
Assistant discovery (:mod:`agent.publish.homeassistant`) publishes its retained config messages
on the alerts connection, so that they share its availability topic and last will; their
PUBACKs are ignored by the drain (only alert message ids are tracked).

Subscriptions (:meth:`MqttPublisher.subscribe`): topics the agent listens on (QoS 1), e.g. the
model updater's ``<prefix>/<device_id>/models/notify``; subscribed again on every connect (the
session is clean), each message's payload handed to the callback in paho's thread (callbacks
only set a flag).

Start-up policy: ``connect_async`` + ``loop_start``, so a broker that is down at boot neither
blocks nor crashes the agent; alerts accumulate in the outbox and paho retries with
``reconnect_delay_set(reconnect_min_s, reconnect_max_s)`` (exponential, whole seconds). A loss
and the recovery are logged once each, not per retry; so is a broker that accepts TCP but sends
no CONNACK within the keepalive; a failed connection is logged with its cause (certificate
verify, host name mismatch, a broker that requires a client certificate, connection refused),
once per outage and cause (:mod:`agent.publish.mqtt_tls`). User documentation:
``docs/mqtt.md``.

TLS (``tls = true``): the broker's chain and host name are verified; ``cert_file``/``key_file``
give the client certificate (mTLS); a password over plain TCP to a host that is not this machine
is warned about once (docs/security.md).
"""

from __future__ import annotations

import collections
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from agent.errors import ConfigError, StoreError
from agent.metrics import Metrics
from agent.publish.callbacks import NO_CONNACK_STRIKES, PahoCallbacks
from agent.publish.drain import OutboxDrain
from agent.publish.early import EarlyBook
from agent.publish.limits import PoisonWatch, ProgressGuard, SizeLimit
from agent.publish.mqtt_config import (
    _WILDCARDS,
    MqttConfig,
    default_client_factory,
    read_password,
)
from agent.publish.mqtt_tls import tls_context, warn_plain_password
from agent.publish.volatile import VolatileAlert, VolatileQueue
from agent.store.sqlite import OutboxRow, Store

__all__ = ["KIND", "NO_CONNACK_STRIKES", "MqttConfig", "MqttPublisher", "default_client_factory",
           "read_password"]

KIND = "mqtt"

#: How many alert ids ``track`` remembers for the latency histogram (oldest forgotten first).
TRACK_LIMIT = 10_000
#: Longest wait, seconds, of the thread raising an alert for paho's network thread to write the
#: alert it handed to paho (:meth:`MqttPublisher.publish_early`).
FLUSH_WAIT_S = 0.005



class MqttPublisher(PahoCallbacks, OutboxDrain):
    """Publishes the store's outbox to an MQTT broker; see the module docstring for the contract.

    Args:
        config: The ``[mqtt]`` section.
        store: The store whose outbox is drained.
        device_id: The gateway's id (a topic level: no ``/``, ``+``, ``#``).
        metrics: Receives ``mqtt_connected``, ``mqtt_published_total``,
            ``mqtt_disconnects_total``, ``mqtt_stalls_total``, ``mqtt_rejected_total{reason}``,
            ``mqtt_oversize_total{action}``, ``outbox_depth``, ``outbox_oldest_age_seconds``
            and ``read_to_alert_seconds{stream}``.
        client_factory: Builds the paho client from keyword arguments (``callback_api_version``,
            ``client_id``, ``protocol``, and ``clean_session`` for 3.1.1); tests may wrap the
            real one. Called again when a broker that drops the connection at one alert makes
            the publisher start a new client.
        clock: Wall clock (epoch seconds UTC) for ``published_at`` and the outbox age.
        monotonic: Monotonic clock (seconds) for latencies and deadlines.
        logger: Where connection changes and failures are logged.

    Raises:
        ConfigError: ``device_id`` is not a valid topic level, the password file cannot be read
            or is empty, or the CA file cannot be loaded.
    """

    def __init__(
        self,
        config: MqttConfig,
        store: Store,
        device_id: str,
        metrics: Metrics,
        *,
        client_factory: Callable[..., paho.Client] = default_client_factory,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        logger: logging.Logger | None = None,
    ) -> None:
        if not device_id or "/" in device_id or any(w in device_id for w in _WILDCARDS):
            msg = f"agent.device_id {device_id!r} is not a valid MQTT topic level"
            raise ConfigError(msg, problems=[msg])
        self.config = config
        self._store = store
        self._metrics = metrics
        self._clock = clock
        self._monotonic = monotonic
        self._log = logger if logger is not None else logging.getLogger(__name__)
        base = f"{config.topic_prefix}/{device_id}"
        self.alerts_topic = f"{base}/alerts"
        self.base_topic = base
        self.availability_topic = f"{base}/availability"
        self.client_id = config.client_id or f"edge-agent-{device_id}"
        password = read_password(config.password_file) if config.password_file else None

        self._v5 = config.protocol == "5"
        #: Retained messages are used (False: ``mqtt.retain`` off, or an MQTT 5 broker said
        #: it takes none: CONNACK "Retain not supported" or Retain Available 0).
        self.retain = config.retain
        self._retain_rebuild = False  # set by paho's thread: start a client without it
        self._factory = client_factory
        self._password = password
        self._no_connack = 0  # connections closed before any CONNACK in a row
        self._client = self._make_client()
        self._subscriptions: dict[str, Callable[[bytes], None]] = {}
        self._filters: dict[str, Callable[[str, bytes, bool], None]] = {}
        self._connect_listeners: list[Callable[[], object]] = []

        # Shared between paho's thread and the drain thread; guarded by _state_lock.
        self._state_lock = threading.Lock()
        self._connected = False
        self._generation = 0  # incremented on every successful connect
        self._outage_since: float | None = None  # monotonic; set while a loss is logged
        self._outage_cause: str | None = None  # the last cause logged during that outage
        # PUBACKs: (mid, reason code, wall time, monotonic time); appended by paho's thread.
        self._acks: collections.deque[tuple[int, ReasonCode, float, float]] = collections.deque()
        #: The size limits each alert must fit (the broker's part is set on every CONNACK).
        self.limit = SizeLimit(self.alerts_topic, config.max_message_bytes)
        self.limit.v5 = self._v5
        self._rejections_logged: set[int] = set()
        self._log_limits: dict[str, tuple[float, int]] = {}
        self._poison = PoisonWatch()
        self._own_drops = 0  # connections the progress guard dropped, not yet seen lost
        #: Durations (s) of connections lost, queued by paho's thread for the drain.
        self._losses: collections.deque[float] = collections.deque()
        self._connected_mono = 0.0
        self._guard = ProgressGuard(
            config.progress_timeout_s if config.progress_timeout_s is not None
            else 3.0 * config.keepalive_s
        )
        self._tracked: collections.OrderedDict[str, float] = collections.OrderedDict()
        self._track_lock = threading.Lock()
        # Owned by the drain thread (and by stop() once that thread has ended).
        self._mids: dict[int, OutboxRow | VolatileAlert] = {}
        self._outstanding: dict[tuple[str, int], set[int]] = {}
        self._unsaved: list[tuple[OutboxRow, float, float]] = []
        #: Rows to dead-letter (too large, or rejected by the broker) with the reason.
        self._rejected: list[tuple[OutboxRow, str]] = []
        #: Alerts the store refused, held in memory until acknowledged.
        self.volatile = VolatileQueue()
        #: Alerts published while their commit runs (:meth:`publish_early`).
        self.early = EarlyBook()
        self._store_failing = False
        self._last_stats = -math.inf

        self._wake = threading.Event()
        #: Set by paho's network thread when it has written everything queued (the socket
        #: needs no more writing): :meth:`publish_early` waits for it.
        self._flushed = threading.Event()
        self._send_lock = threading.Lock()
        self._window = set()
        #: The last alert :meth:`publish_early` handed to paho itself (:meth:`notify` need
        #: not wake the drain for it).
        self._direct_last: str | None = None
        self._stopping = threading.Event()
        self._progress = threading.Condition()
        self._thread: threading.Thread | None = None
        self._started = False
        #: ``monotonic()`` at the end of the drain loop's last pass (it passes at least every
        #: second): a health check sees a drain thread stuck in the store or in paho.
        self.last_loop_mono: float | None = None

    # -- the paho client ------------------------------------------------------------------------

    def _make_client(self) -> paho.Client:
        """A paho client with this publisher's settings and callbacks (not connected).

        Raises:
            ConfigError: The CA file cannot be loaded.
        """
        if self._v5:  # a clean start on every connect (start()) and no session expiry
            client = self._factory(
                callback_api_version=CallbackAPIVersion.VERSION2,
                client_id=self.client_id,
                protocol=paho.MQTTv5,
            )
        else:
            client = self._factory(
                callback_api_version=CallbackAPIVersion.VERSION2,
                client_id=self.client_id,
                protocol=paho.MQTTv311,
                clean_session=True,
            )
        if self.config.username is not None:
            client.username_pw_set(self.config.username, self._password)
        if self.config.tls:
            client.tls_set_context(tls_context(self.config))
        client.will_set(self.availability_topic, "offline", qos=1, retain=self.retain)
        client.reconnect_delay_set(max(1, math.ceil(self.config.reconnect_min_s)),
                                   max(1, math.ceil(self.config.reconnect_max_s)))
        # two messages per raised event (alerts topic and events topic): paho must not hold
        # back the second one of an alert the drain counts as in flight
        client.max_inflight_messages_set(2 * self.config.max_inflight)
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_disconnect = self._on_disconnect
        client.on_publish = self._on_publish
        client.on_message = self._on_message
        # paho's own clients call it when their queue is written (a stand-in without it is
        # not waited for)
        self._flush_hook = isinstance(getattr(type(client), "on_socket_unregister_write", None),
                                      property)
        if self._flush_hook:
            client.on_socket_unregister_write = self._on_flushed
        return client

    def _on_flushed(self, client: paho.Client, userdata: object, sock: object) -> None:
        """paho's network thread wrote every packet queued (see :meth:`publish_early`)."""
        self._flushed.set()

    def _connect_client(self) -> None:
        """``connect_async`` + ``loop_start`` on the current client (MQTT 5: clean start, the
        session ends with the connection)."""
        if self._v5:
            props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            props.SessionExpiryInterval = 0
            self._client.connect_async(self.config.host, self.config.port,
                                       self.config.keepalive_s, clean_start=True,
                                       properties=props)
        else:
            self._client.connect_async(self.config.host, self.config.port,
                                       self.config.keepalive_s)
        self._client.loop_start()

    def _replace_client(self) -> None:
        """Drop the paho client (and every message it holds) for a new one, and connect it
        (drain thread; see :meth:`OutboxDrain._poisoned`)."""
        old = self._client
        old.loop_stop()
        self._client = self._make_client()  # the old client's callbacks are ignored from now
        old.disconnect()
        with self._state_lock:
            self._connected = False
        self._acks.clear()
        self._losses.clear()
        self._own_drops = 0
        self._connect_client()

    # -- public API -----------------------------------------------------------------------------

    def topics_for(self, item: OutboxRow | VolatileAlert) -> tuple[str, ...]:
        """The topics an outbox row goes to: every event to ``<base>/<stream>/events``; a
        ``raised`` event (and a schema-1 row stored before lifecycles) first to the
        deprecated ``<base>/alerts`` as well."""
        events = self.events_topic(item.stream)
        try:
            event = json.loads(item.payload).get("event", "raised")
        except (ValueError, AttributeError):
            event = "raised"
        return (self.alerts_topic, events) if event == "raised" else (events,)

    def events_topic(self, stream: str) -> str:
        """``<prefix>/<device>/<stream>/events``: every lifecycle event of ``stream``."""
        return f"{self.base_topic}/{stream}/events"

    def state_topic(self, stream: str) -> str:
        """``<prefix>/<device>/<stream>/state``: the stream's present state, retained."""
        return f"{self.base_topic}/{stream}/state"

    @property
    def generation(self) -> int:
        """Successful connects so far: incremented on every one (a state publisher sends
        everything again; a change means the connection was rebuilt)."""
        with self._state_lock:
            return self._generation

    def publish_latest(self, topic: str, payload: bytes) -> str:
        """Publish a "latest value" message (QoS 1, retained when the broker takes it), not
        through the outbox: nothing is kept for it when the connection is down.

        Returns:
            ``"published"`` (handed to paho retained), ``"retain_refused"`` (sent without
            retain: the broker takes no retained messages; an empty payload, a removal, is
            then not sent at all) or ``"skipped"`` (not connected, or paho refused it).
        """
        with self._state_lock:
            connected = self._connected
        if not connected:
            return "skipped"
        client, retain = self._client, self.retain
        if not retain and not payload:
            return "retain_refused"
        info = client.publish(topic, payload, qos=1, retain=retain)
        if info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
            return "skipped"
        return "published" if retain else "retain_refused"

    @property
    def retain_available(self) -> bool:
        """False once the broker said it takes no retained messages, or with ``mqtt.retain =
        false`` (:attr:`retain`): consumers that publish retained messages (Home Assistant
        discovery, snapshots) skip them or send them plain."""
        return self.retain

    @property
    def connected(self) -> bool:
        """True while connected to the broker (for health checks)."""
        with self._state_lock:
            return self._connected

    @property
    def running(self) -> bool:
        """True while the drain thread runs (False when disabled or stopped)."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Connect in the background and start draining; never blocks on the broker.

        A disabled config (``enabled = false``) starts nothing: alerts stay in the outbox.

        Raises:
            RuntimeError: Called twice.
        """
        if self._started:
            raise RuntimeError("MqttPublisher.start() called twice")
        self._started = True
        if not self.config.enabled:
            self._log.info("MQTT publishing is disabled; alerts stay in the outbox")
            return
        self._metrics.mqtt_connected.set(0)
        warn_plain_password(self.config, self._log)
        self._connect_client()
        self._thread = threading.Thread(target=self._run, name="mqtt-outbox", daemon=True)
        self._thread.start()

    def track(self, alert_id: str, received_mono: float) -> None:
        """Remember when the newest reading behind ``alert_id`` was received (monotonic seconds).

        On the alert's first PUBACK, ``read_to_alert_seconds`` observes the difference. Only
        alerts raised in this process can be tracked; the times never go to the database.
        """
        with self._track_lock:
            self._tracked[alert_id] = received_mono
            while len(self._tracked) > TRACK_LIMIT:
                self._tracked.popitem(last=False)

    def notify(self, alert_id: str | None = None, received_mono: float | None = None) -> None:
        """Wake the drain after an alert was stored; optionally :meth:`track` it first.

        An alert :meth:`publish_early` already handed to paho itself wakes nothing: its
        PUBACK and its commit wake the drain.
        """
        if alert_id is not None and received_mono is not None:
            self.track(alert_id, received_mono)
        if alert_id is None or alert_id != self._direct_last:
            self._wake.set()

    def publish_volatile(self, alert_id: str, stream: str, payload: str) -> bool:
        """Deliver an alert the store refused, from memory (see the module docstring).

        It goes out after every alert stored before it. Returns False when MQTT is disabled or
        the in-memory queue is full: the alert is then the caller's to count as lost.
        """
        if not self.config.enabled or self._stopping.is_set():
            return False
        try:
            after = self._store.last_alert_row()
        except StoreError:
            after = 0  # the outbox cannot be read either: nothing stored can go before it
        if self.volatile.put(after, alert_id, stream, payload) is None:
            return False
        self._wake.set()
        return True

    def publish_early(self, alert_id: str, stream: str, payload: str) -> bool:
        """Publish a new alert from memory while the store writer commits it (the caller
        hands it to :class:`agent.store.writer.AlertWriter` as well, and passes that writer's
        results to :meth:`committed`). No store I/O and no lock the store writer holds; when
        nothing goes before it and the drain is not in a pass, the alert is handed to paho on
        the caller's thread (no wait for the drain thread), else the drain sends it in order.

        Returns:
            False when MQTT is disabled, the publisher is stopping, the in-memory queue is
            full or the outbox's end is unknown (the store cannot be read): nothing was
            queued; the alert still drains from the outbox once committed.
        """
        if not self.config.enabled or self._stopping.is_set():
            return False
        try:
            after = self._store.last_row_hint()
        except StoreError:
            return False
        self.early.begin(alert_id)
        item = self.volatile.put(after, alert_id, stream, payload, early=True)
        if item is None:
            self.early.forget(alert_id)  # not queued: its row drains as any other
            return False
        # Handed to paho on this thread when nothing goes before it (no wait for the drain
        # thread to wake and take the GIL: the latency of read -> delivered); else the drain
        # sends it in order. Then this thread waits (at most FLUSH_WAIT_S) until paho's network
        # thread has written it: the GIL is free for that thread at once, instead of the
        # network write waiting for the raising thread to finish its work or be forced off the
        # GIL (the interpreter's switch interval, 5 ms).
        # Not waited for when paho's thread already wrote it: paho queues the packet, wakes its
        # thread and only then marks the socket as wanting a write, so a write done in between
        # never calls back and the wait would last the whole FLUSH_WAIT_S.
        self._flushed.clear()
        if self._send_direct(item):
            self._direct_last = alert_id
            if self._flush_hook and self._client.want_write():
                self._flushed.wait(FLUSH_WAIT_S)
        else:
            self._wake.set()
        return True

    def committed(self, results: Sequence[tuple[str, int]]) -> None:
        """The store writer's results for early alerts: ``(alert_id, row id)``, row id <= 0
        when not stored (:data:`agent.store.writer.Committed`); any thread, never blocks."""
        for alert_id, row in results:
            self.early.on_commit(alert_id, row)
        self._wake.set()

    def flush(self, timeout_s: float) -> bool:
        """Wait until the outbox is empty (every alert acknowledged) or ``timeout_s`` passes.

        An outbox that cannot be read (a store not open on a full disk) counts as empty: the
        wait is then for the alerts held in memory, the ones a stop would lose.

        Returns:
            True when the outbox is empty; False on timeout (the rest stays in the store).
        """
        deadline = self._monotonic() + timeout_s
        while True:
            try:
                depth, _ = self._store.outbox_stats()
            except StoreError:
                depth = 0
            if depth == 0 and not len(self.volatile) and not len(self.early):
                return True
            remaining = deadline - self._monotonic()
            if remaining <= 0:
                return False
            self._wake.set()
            with self._progress:
                self._progress.wait(min(remaining, 0.1))

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop draining, publish ``offline`` (retained) and disconnect cleanly (no last will).

        Alerts not yet acknowledged stay in the outbox for the next start. Idempotent.
        """
        if self._thread is None or self._stopping.is_set():
            return
        self._stopping.set()
        self._wake.set()
        self._thread.join(timeout_s)
        if self.connected:
            info = self._client.publish(self.availability_topic, "offline", qos=1,
                                        retain=self.retain)
            try:
                info.wait_for_publish(timeout=min(timeout_s, 2.0))
            except (RuntimeError, ValueError) as exc:
                self._log.warning("could not publish 'offline' before disconnecting: %s", exc)
        self._client.disconnect()
        self._client.loop_stop()
        with self._state_lock:
            self._connected = False
        self._metrics.mqtt_connected.set(0)
        if not self._thread.is_alive():
            try:  # PUBACKs that arrived after the drain thread ended
                self._save_acks(set())
                self._update_stats(force=True)
            except StoreError as exc:
                self._log.error("MQTT outbox: %s; acknowledged alerts will be re-sent", exc)
        dropped = self.volatile.drop_all()
        # an early alert committed and not acknowledged is in the outbox: sent at next start
        lost = sum(1 for v in dropped if not v.early or not self.early.committed(v.alert_id))
        self.volatile.lost += sum(1 for v in dropped if v.early
                                  and not self.early.committed(v.alert_id))
        if lost:
            self._metrics.dropped_total.labels(kind="alert", reason="store_error").inc(lost)
            self._log.error(
                "%d alert(s) the store had refused were not acknowledged by the broker before "
                "the stop: lost", lost,
            )

    @property
    def v5(self) -> bool:
        """True when the connection speaks MQTT 5."""
        return self._v5

    def publish_best_effort(self, topic: str, payload: bytes, *, retain: bool,
                            properties: Properties | None = None) -> paho.MQTTMessageInfo | None:
        """Publish one QoS 0 message on the current connection (no outbox, never re-sent:
        retained latest-value topics such as snapshots, :mod:`agent.publish.snapshots`).

        Returns:
            paho's message info, or None when not connected (nothing was queued).
        """
        if not self.connected or self._stopping.is_set():
            return None
        info = self._client.publish(topic, payload, qos=0, retain=retain, properties=properties)
        if info.rc != paho.MQTT_ERR_SUCCESS:
            return None
        return info

    def subscribe(self, topic: str, callback: Callable[[bytes], None]) -> None:
        """Listen on ``topic`` (QoS 1, no wildcards), now and after every reconnect.

        ``callback(payload)`` runs in paho's network thread: it must only set a flag.
        """
        with self._state_lock:
            self._subscriptions[topic] = callback
            connected = self._connected
        if connected:
            self._client.subscribe(topic, qos=1)

    def subscribe_filter(self, topic_filter: str, callback: Callable[[str, bytes, bool], None]
                         ) -> None:
        """Listen on ``topic_filter`` (QoS 1; ``+`` and ``#`` allowed), now and after every
        reconnect.

        ``callback(topic, payload, retained)`` runs in paho's network thread and must not
        block (a publish is fine: paho only queues it).
        """
        with self._state_lock:
            self._filters[topic_filter] = callback
            connected = self._connected
        if connected:
            self._client.subscribe(topic_filter, qos=1)

    def add_connect_listener(self, listener: Callable[[], object]) -> None:
        """Call ``listener()`` after every successful connect (paho's network thread), once
        ``online`` is queued and the subscriptions are renewed; it must not block."""
        with self._state_lock:
            self._connect_listeners.append(listener)

    def publish_extra(self, topic: str, payload: bytes | str, *, retain: bool, qos: int = 1
                      ) -> bool:
        """Publish a message that is not an alert on the current connection.

        Nothing is queued while disconnected (a connect listener publishes again instead).

        Returns:
            True when paho took the message; False when disconnected, stopping or refused.
        """
        if not self.connected or self._stopping.is_set():
            return False
        info = self._client.publish(topic, payload, qos=qos, retain=retain)
        return info.rc == paho.MQTT_ERR_SUCCESS
