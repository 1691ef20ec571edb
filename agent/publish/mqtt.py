"""MQTT alert publisher: drains the store's outbox to a broker with QoS 1, plus availability/LWT.

Topics (``<prefix>`` is ``mqtt.topic_prefix``, default ``edge``; ``<device_id>`` is
``agent.device_id``):

``<prefix>/<device_id>/alerts``
    One message per alert, QoS 1, not retained. The payload is ``Alert.to_payload()`` (schema
    version 1) as compact JSON, UTF-8::

        {"schema": 1, "alert_id": "gw1:pump1:42", "device_id": "gw1", "stream": "pump1",
         "seq": 42, "model": {"name": "ae", "version": 3}, "score": 2.51, "threshold": 1.0,
         "window_start": "2024-05-01T12:00:00.000Z", "window_end": "2024-05-01T12:00:01.000Z",
         "raised_at": "2024-05-01T12:00:01.020Z",
         "top_channels": [{"channel": "temp", "contribution": 0.75}]}

    ``alert_id`` is ``<device_id>:<stream>:<seq>``, unique and never reused (``seq`` comes from
    the store and survives restarts).

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
    network loss past 1.5 x keepalive).

Delivery guarantee (what consumers may rely on):
    * at least once: an alert is marked published in the store only when the broker's PUBACK
      for its message id arrives; until then it stays in the outbox, across broker outages and
      agent restarts;
    * in order: first deliveries arrive in outbox order (order of raising). After a reconnect
      the drain restarts from the oldest unacknowledged alert, so up to ``max_inflight`` alerts
      may arrive twice: consumers deduplicate by ``alert_id``;
    * only QoS 1 is accepted: QoS 0 would lose alerts, QoS 2 costs a round trip for nothing
      that ``alert_id`` deduplication does not already give;
    * an alert the store refused (disk full) is handed over with :meth:`MqttPublisher.
      publish_volatile` and held in memory instead (:mod:`agent.publish.volatile`): same
      guarantees while the process lives, in order among the stored ones; lost (and counted in
      ``dropped_total{kind="alert", reason="store_error"}``) if the process stops before its
      PUBACK.

Threads: paho's network loop (``loop_start``) runs the callbacks; they only set flags, queue the
acknowledged message ids and wake the drain thread. The drain thread (``mqtt-outbox``) is the
only one that reads the outbox, publishes, and marks rows published (in batches); while the
store refuses that write (disk full) the acknowledgements wait in memory, the save is tried again
once a second and publishing goes on (the alerts the store refused depend on it). Nothing is
published while disconnected (paho would queue it a second time); paho itself re-sends the
messages it holds unacknowledged, which only adds duplicates.

Subscriptions (:meth:`MqttPublisher.subscribe`): topics the agent listens on (QoS 1), e.g. the
model updater's ``<prefix>/<device_id>/models/notify``; subscribed again on every connect (the
session is clean), each message's payload handed to the callback in paho's thread (callbacks
only set a flag).

Start-up policy: ``connect_async`` + ``loop_start``, so a broker that is down at boot neither
blocks nor crashes the agent; alerts accumulate in the outbox and paho retries with
``reconnect_delay_set(reconnect_min_s, reconnect_max_s)`` (exponential, whole seconds). A loss
and the recovery are logged once each, not per retry; a failed connection is logged with its
cause (certificate verify, host name mismatch, a broker that requires a client certificate,
connection refused), once per outage and cause (:mod:`agent.publish.mqtt_tls`).

TLS (``tls = true``): the broker's chain and host name are verified; ``cert_file``/``key_file``
give the client certificate (mTLS); a password over plain TCP to a host that is not this machine
is warned about once (docs/security.md).
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any, Literal

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode
from paho.mqtt.reasoncodes import ReasonCode
from pydantic import Field, model_validator

from agent.config.base import StrictModel
from agent.errors import ConfigError, StoreError
from agent.metrics import Metrics
from agent.publish.mqtt_tls import (
    DiagnosedClient,
    failure_of,
    tls_context,
    warn_plain_password,
)
from agent.publish.volatile import VolatileAlert, VolatileQueue, merge
from agent.secret_files import read_secret
from agent.store.sqlite import OutboxRow, Store

KIND = "mqtt"

#: How many alert ids ``track`` remembers for the latency histogram (oldest forgotten first).
TRACK_LIMIT = 10_000

_WILDCARDS = ("+", "#", "\x00")


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
    reconnect_min_s: float = Field(
        1.0, gt=0.0, description="First reconnect delay in seconds (rounded up to whole seconds)."
    )
    reconnect_max_s: float = Field(
        30.0, gt=0.0, description="Largest reconnect delay in seconds (rounded up)."
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


class MqttPublisher:
    """Publishes the store's outbox to an MQTT broker; see the module docstring for the contract.

    Args:
        config: The ``[mqtt]`` section.
        store: The store whose outbox is drained.
        device_id: The gateway's id (a topic level: no ``/``, ``+``, ``#``).
        metrics: Receives ``mqtt_connected``, ``mqtt_published_total``,
            ``mqtt_disconnects_total``, ``outbox_depth``, ``outbox_oldest_age_seconds`` and
            ``read_to_alert_seconds{stream}``.
        client_factory: Builds the paho client from keyword arguments (``callback_api_version``,
            ``client_id``, ``protocol``, ``clean_session``); tests may wrap the real one.
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
        self.availability_topic = f"{base}/availability"
        self.client_id = config.client_id or f"edge-agent-{device_id}"
        password = read_password(config.password_file) if config.password_file else None

        client = client_factory(
            callback_api_version=CallbackAPIVersion.VERSION2,
            client_id=self.client_id,
            protocol=paho.MQTTv311,
            clean_session=True,
        )
        if config.username is not None:
            client.username_pw_set(config.username, password)
        if config.tls:
            client.tls_set_context(tls_context(config))
        client.will_set(self.availability_topic, "offline", qos=1, retain=True)
        client.reconnect_delay_set(
            max(1, math.ceil(config.reconnect_min_s)), max(1, math.ceil(config.reconnect_max_s))
        )
        client.max_inflight_messages_set(config.max_inflight)
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_disconnect = self._on_disconnect
        client.on_publish = self._on_publish
        client.on_message = self._on_message
        self._subscriptions: dict[str, Callable[[bytes], None]] = {}
        self._client = client

        # Shared between paho's thread and the drain thread; guarded by _state_lock.
        self._state_lock = threading.Lock()
        self._connected = False
        self._generation = 0  # incremented on every successful connect
        self._outage_since: float | None = None  # monotonic; set while a loss is logged
        self._outage_cause: str | None = None  # the last cause logged during that outage
        # PUBACKs: (mid, accepted, wall time, monotonic time); appended by paho's thread.
        self._acks: collections.deque[tuple[int, bool, float, float]] = collections.deque()
        self._tracked: collections.OrderedDict[str, float] = collections.OrderedDict()
        self._track_lock = threading.Lock()
        # Owned by the drain thread (and by stop() once that thread has ended).
        self._mids: dict[int, OutboxRow | VolatileAlert] = {}
        self._unsaved: list[tuple[OutboxRow, float, float]] = []
        #: Alerts the store refused, held in memory until acknowledged.
        self.volatile = VolatileQueue()
        self._store_failing = False
        self._last_stats = -math.inf

        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._progress = threading.Condition()
        self._thread: threading.Thread | None = None
        self._started = False
        #: ``monotonic()`` at the end of the drain loop's last pass (it passes at least every
        #: second): a health check sees a drain thread stuck in the store or in paho.
        self.last_loop_mono: float | None = None

    # -- public API -----------------------------------------------------------------------------

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
        self._client.connect_async(self.config.host, self.config.port, self.config.keepalive_s)
        self._client.loop_start()
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
        """Wake the drain after an alert was stored; optionally :meth:`track` it first."""
        if alert_id is not None and received_mono is not None:
            self.track(alert_id, received_mono)
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
        if not self.volatile.put(after, alert_id, stream, payload):
            return False
        self._wake.set()
        return True

    def flush(self, timeout_s: float) -> bool:
        """Wait until the outbox is empty (every alert acknowledged) or ``timeout_s`` passes.

        Returns:
            True when the outbox is empty; False on timeout (the rest stays in the store).

        Raises:
            StoreError: The outbox cannot be read.
        """
        deadline = self._monotonic() + timeout_s
        while True:
            depth, _ = self._store.outbox_stats()
            if depth == 0 and not len(self.volatile):
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
            info = self._client.publish(self.availability_topic, "offline", qos=1, retain=True)
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
        lost = self.volatile.clear()
        if lost:
            self._metrics.dropped_total.labels(kind="alert", reason="store_error").inc(lost)
            self._log.error(
                "%d alert(s) the store had refused were not acknowledged by the broker before "
                "the stop: lost", lost,
            )

    def subscribe(self, topic: str, callback: Callable[[bytes], None]) -> None:
        """Listen on ``topic`` (QoS 1, no wildcards), now and after every reconnect.

        ``callback(payload)`` runs in paho's network thread: it must only set a flag.
        """
        with self._state_lock:
            self._subscriptions[topic] = callback
            connected = self._connected
        if connected:
            self._client.subscribe(topic, qos=1)

    def _on_message(self, client: paho.Client, userdata: object, msg: paho.MQTTMessage) -> None:
        with self._state_lock:
            callback = self._subscriptions.get(msg.topic)
        if callback is not None:
            callback(bytes(msg.payload))

    # -- paho callbacks (paho's network thread) -------------------------------------------------

    def _on_connect(
        self,
        client: paho.Client,
        userdata: object,
        flags: paho.ConnectFlags,
        reason_code: ReasonCode,
        properties: object,
    ) -> None:
        if reason_code.is_failure:
            if self._note_failure(f"refused: {reason_code}"):
                self._log.warning(
                    "MQTT broker %s:%d refused the connection (%s); alerts stay in the outbox, "
                    "retrying in the background",
                    self.config.host, self.config.port, reason_code,
                )
            return
        client.publish(self.availability_topic, "online", qos=1, retain=True)
        with self._state_lock:
            topics = list(self._subscriptions)
        for topic in topics:
            client.subscribe(topic, qos=1)
        with self._state_lock:
            self._connected = True
            self._generation += 1
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
                self.config.host, self.config.port, self._monotonic() - since,
            )
        self._wake.set()

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

    def _on_connect_fail(self, client: paho.Client, userdata: object) -> None:
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
        with self._state_lock:
            was_connected, self._connected = self._connected, False
            lost = was_connected and not self._stopping.is_set()
            if lost and self._outage_since is None:
                self._outage_since = self._monotonic()
        self._metrics.mqtt_connected.set(0)
        cause = None if was_connected else getattr(client, "socket_error", None)
        if cause and not self._stopping.is_set() and self._note_failure(
                failure_of(client) or cause):
            # Closed before any CONNACK: e.g. the broker rejected the client certificate
            # after a TLS 1.3 handshake (paho logs it; nothing else calls back).
            self._log.warning(
                "MQTT broker %s:%d closed the connection before accepting it: %s; alerts stay "
                "in the outbox, retrying in the background",
                self.config.host, self.config.port, failure_of(client),
            )
        if lost:
            self._metrics.mqtt_disconnects_total.inc()
            self._log.warning(
                "lost the MQTT broker %s:%d (%s); alerts stay in the outbox, reconnecting in "
                "the background",
                self.config.host, self.config.port, reason_code,
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
        self._acks.append((mid, not reason_code.is_failure, self._clock(), self._monotonic()))
        self._wake.set()

    # -- drain thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        generation = -1
        cursor = (0, 0)  # last row id and volatile n handed to paho in this connection
        window: set[int] = set()  # mids of this connection not yet acknowledged
        save_from = -math.inf  # monotonic; after a failed save, the next try waits a second
        while not self._stopping.is_set():
            self._wake.wait(1.0)
            self._wake.clear()
            try:
                self._take_acks(window)
                if self._unsaved and self._monotonic() >= save_from:
                    # A store that refuses writes (disk full) must not stop the delivery, least
                    # of all of the alerts it refused (volatile): the acknowledgements stay in
                    # memory and are saved by a later pass; publishing goes on below.
                    try:
                        self._save_unsaved()
                    except StoreError as exc:
                        self._store_trouble(exc, pause=False)
                        save_from = self._monotonic() + 1.0
                with self._state_lock:
                    connected, current = self._connected, self._generation
                if current != generation:
                    # New connection: restart from the oldest unacknowledged alert.
                    generation, cursor = current, (0, 0)
                    window.clear()
                if connected and not self._stopping.is_set():
                    cursor = self._fill(window, cursor, generation)
                self._update_stats()
            except StoreError as exc:
                self._store_trouble(exc)
            except Exception:  # the drain must survive anything; the row stays in the outbox
                self._log.exception("MQTT outbox drain failed; retrying")
                self._stopping.wait(1.0)
            self.last_loop_mono = self._monotonic()
            with self._progress:
                self._progress.notify_all()

    def _fill(
        self, window: set[int], cursor: tuple[int, int], generation: int
    ) -> tuple[int, int]:
        """Publish pending rows (and volatile alerts) after ``cursor`` until ``max_inflight``
        are unacknowledged; returns the new cursor ``(row id, volatile n)``."""
        # Rows the broker acknowledged whose save the store refused (disk full) are still
        # pending in the outbox: after a reconnect they are skipped, not sent again (each
        # reconnect would otherwise re-send every one, not only the ``max_inflight`` in flight).
        acked = {row.id for row, _, _ in self._unsaved}
        while len(window) < self.config.max_inflight:
            room = self.config.max_inflight - len(window)
            rows = self._store.pending_alerts(room, after_id=cursor[0])
            batch = merge(rows, self.volatile.after(cursor[1]), len(rows) < room, room)
            if not batch:
                break
            for item in batch:
                if not isinstance(item, VolatileAlert) and item.id in acked:
                    cursor = (item.id, cursor[1])
                    continue
                with self._state_lock:
                    if not self._connected or self._generation != generation:
                        return cursor
                info = self._client.publish(
                    self.alerts_topic, item.payload.encode("utf-8"), qos=1, retain=False
                )
                if info.rc not in (MQTTErrorCode.MQTT_ERR_SUCCESS, MQTTErrorCode.MQTT_ERR_NO_CONN):
                    self._log.warning("paho refused to publish %s: %s", item.alert_id, info.rc)
                    return cursor
                # paho holds the message even on NO_CONN and re-sends it after reconnecting.
                self._mids[info.mid] = item
                window.add(info.mid)
                cursor = ((cursor[0], item.n) if isinstance(item, VolatileAlert)
                          else (item.id, cursor[1]))
                if info.rc == MQTTErrorCode.MQTT_ERR_NO_CONN:
                    return cursor
        return cursor

    def _save_acks(self, window: set[int]) -> None:
        """Turn queued PUBACKs into ``published_at`` rows (one transaction per batch)."""
        self._take_acks(window)
        self._save_unsaved()

    def _take_acks(self, window: set[int]) -> None:
        """Apply queued PUBACKs in memory: free their ``window`` slots, forget acknowledged
        volatile alerts, queue stored rows in ``_unsaved`` for :meth:`_save_unsaved`."""
        while self._acks:
            mid, accepted, at, at_mono = self._acks.popleft()
            window.discard(mid)
            row = self._mids.pop(mid, None)
            if row is None:
                continue  # availability message, or a duplicate of a row already acknowledged
            if not accepted:
                self._log.warning("broker rejected alert %s; it stays in the outbox", row.alert_id)
                continue
            if isinstance(row, VolatileAlert):
                if self.volatile.ack(row.n):
                    self._metrics.mqtt_published_total.inc()
                    self._observe_latency(row.alert_id, row.stream, at_mono)
                continue
            self._unsaved.append((row, at, at_mono))

    def _save_unsaved(self) -> None:
        """Write the acknowledged rows of ``_unsaved`` as published (one transaction).

        Raises:
            StoreError: The write failed; the rows stay in ``_unsaved``.
        """
        if not self._unsaved:
            return
        batch, self._unsaved = self._unsaved, []
        try:
            changed = self._store.mark_published([r.id for r, _, _ in batch], batch[-1][1])
        except StoreError:
            self._unsaved = batch + self._unsaved
            raise
        if self._store_failing:
            self._store_failing = False
            self._log.info("store writable again; outbox acknowledgements saved")
        self._metrics.mqtt_published_total.inc(changed)
        with self._track_lock:
            received = [self._tracked.pop(r.alert_id, None) for r, _, _ in batch]
        for (row, _, at_mono), mono in zip(batch, received, strict=True):
            if mono is not None:
                self._metrics.read_to_alert_seconds.labels(stream=row.stream).observe(
                    max(0.0, at_mono - mono)
                )

    def _observe_latency(self, alert_id: str, stream: str, at_mono: float) -> None:
        with self._track_lock:
            mono = self._tracked.pop(alert_id, None)
        if mono is not None:
            self._metrics.read_to_alert_seconds.labels(stream=stream).observe(
                max(0.0, at_mono - mono))

    def _update_stats(self, *, force: bool = False) -> None:
        now = self._monotonic()
        if not force and now - self._last_stats < 0.5:
            return
        self._last_stats = now
        depth, oldest = self._store.outbox_stats()
        self._metrics.outbox_depth.set(depth)
        age = 0.0 if oldest is None else max(0.0, self._clock() - oldest)
        self._metrics.outbox_oldest_age_seconds.set(age)

    def _store_trouble(self, exc: StoreError, *, pause: bool = True) -> None:
        if not self._store_failing:
            self._store_failing = True
            self._log.error("MQTT outbox: %s; retrying every second", exc)
        if pause:
            self._stopping.wait(1.0)
