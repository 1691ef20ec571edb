"""Retained latest-snapshot topics per camera stream (``[snapshots] publish``).

Topics (``<prefix>/<device_id>`` as for alerts, :mod:`agent.publish.mqtt`):

``<prefix>/<device_id>/<stream>/snapshot``
    The JPEG bytes of the stream's latest alert snapshot, retained, QoS 0 (like Frigate's
    ``frigate/<camera>/<label>/snapshot``).
``<prefix>/<device_id>/<stream>/heatmap``
    The heatmap overlay PNG of the same alert, retained, QoS 0 (absent when the model gave no
    patch map).

MQTT 5 messages carry ``Content-Type`` (``image/jpeg``, ``image/png``) and the user property
``alert_id``; the alert payload's ``snapshot`` object names the topics, so a consumer that
received alert ``X`` reads the retained image and checks its ``alert_id`` (a later alert of the
stream replaces it).

Best effort, never in the way of alerts: QoS 0 on the alerts' connection (no outbox slot, no
PUBACK, never re-sent by paho after a reconnect); one thread (``mqtt-snapshots``) publishes the
newest unpublished snapshot of each stream when connected (older unpublished ones are marked
``superseded``: the retained topic only wants the latest), and the store keeps every snapshot
whatever happens here. Limits:

* a JPEG or PNG over ``mqtt.max_message_bytes`` or the broker's Maximum Packet Size (MQTT 5
  CONNACK, or the size learned from an alert or a snapshot,
  :class:`agent.publish.limits.SizeLimit`) is never sent: marked ``oversize`` in the store,
  counted in ``edge_agent_snapshots_unpublished_total{reason="oversize"}``, logged at most once a
  minute;
* over MQTT 3.1.1 a broker says nothing and drops the connection, both for a packet over its
  ``max_packet_size`` and for a retained message it refuses (mosquitto ``retain_available
  false``). So a 3.1.1 snapshot that is larger than any that went through, or retained before a
  retained one went through, is a probe: nothing else is published until the connection has
  lasted :data:`RETAIN_PROBE_S` after it. A probe that loses the connection is sent again not
  retained. Lost again not retained, it is too large: the size is learned (one byte less, until
  the agent restarts) and the snapshot marked ``oversize``. Taken not retained after a retained
  loss, the broker refuses retained messages: after :data:`RETAIN_STRIKES` such snapshots
  retained publishing is turned off until the agent restarts (one WARNING). MQTT 5 needs no
  probe: its CONNACK says both (Maximum Packet Size, Retain Available 0: the snapshots go out not
  retained, ``snapshots_published_total{retained="false"}``);
* a broker that drops a too large QoS 0 message without a word (mosquitto's
  ``message_size_limit``) cannot be noticed: set ``mqtt.max_message_bytes`` to its limit;
* a snapshot whose connection was lost at :data:`MAX_ATTEMPTS` attempts is marked ``failed``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from agent.errors import StoreError
from agent.logs import RateLimiter
from agent.metrics import Metrics
from agent.publish.limits import SizeLimit, publish_packet_bytes
from agent.publish.mqtt import MqttPublisher
from agent.store.snapshots import Snapshot
from agent.store.sqlite import Store

log = logging.getLogger("agent.mqtt")

#: A connection lost this soon (s) after a 3.1.1 snapshot counts as the broker refusing it.
RETAIN_PROBE_S = 5.0
#: Snapshots the broker took only not retained before retained publishing is turned off.
RETAIN_STRIKES = 2
#: Connections lost at one snapshot, the last one not retained, that make it too large.
SIZE_STRIKES = 2
#: Attempts per snapshot before it is marked ``failed``.
MAX_ATTEMPTS = 3
#: Bytes kept for a PUBLISH's MQTT 5 properties when checking its size (content type, alert id).
PROPERTIES_RESERVE = 256


@dataclass(frozen=True, slots=True)
class _Probe:
    """A 3.1.1 snapshot whose connection must outlast :data:`RETAIN_PROBE_S`."""

    generation: int
    at: float
    row_id: int
    alert_id: str
    retained: bool
    packet: int  # bytes of its largest PUBLISH packet
    topic: str  # the topic of that packet


def snapshot_topics(prefix: str, device_id: str, stream: str) -> tuple[str, str]:
    """``(snapshot topic, heatmap topic)`` of ``stream``.

    >>> snapshot_topics("edge", "gw1", "cam")
    ('edge/gw1/cam/snapshot', 'edge/gw1/cam/heatmap')
    """
    base = f"{prefix}/{device_id}/{stream}"
    return f"{base}/snapshot", f"{base}/heatmap"


class SnapshotPublisher:
    """Publishes the stores' snapshots on their retained topics (module docstring).

    Args:
        publisher: The alert publisher whose connection is used.
        store: Holds the snapshots and their MQTT states.
        device_id: The gateway's id (a topic level).
        metrics: ``snapshots_published_total``, ``snapshots_unpublished_total``.
        clock: Wall clock (``published_at``). monotonic: Monotonic clock.
        poll_s: Seconds between two looks at the store without a :meth:`notify`.
    """

    def __init__(self, publisher: MqttPublisher, store: Store, device_id: str, metrics: Metrics,
                 *, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic, poll_s: float = 1.0) -> None:
        self._pub = publisher
        self._store = store
        self._prefix = publisher.config.topic_prefix
        self._device = device_id
        self._metrics = metrics
        self._clock = clock
        self._monotonic = monotonic
        self._poll_s = poll_s
        self._limiter = RateLimiter(60.0, monotonic)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mqtt-snapshots", daemon=True)
        self._attempts: dict[int, int] = {}
        #: The 3.1.1 snapshot being probed (module docstring).
        self._probe: _Probe | None = None
        self._strikes = 0
        #: Connections lost right after each snapshot (row id), over 3.1.1.
        self._losses: dict[int, int] = {}
        #: Snapshots (row ids) to send again not retained: lost once retained.
        self._unretained: set[int] = set()
        #: Largest packet (bytes) a 3.1.1 broker took without dropping the connection.
        self._ok_packet = 0
        #: A retained snapshot went through over 3.1.1: retained messages are taken.
        self._retain_ok = False
        #: Largest packet the broker takes, learned from a snapshot it dropped the connection
        #: for (module docstring), None when not learned.
        self.learned_max_packet: int | None = None
        #: Retained publishing turned off (a 3.1.1 broker refused retained messages).
        self.no_retain = False
        self.published = 0

    def topics(self, stream: str) -> tuple[str, str]:
        """``(snapshot topic, heatmap topic)`` of ``stream``."""
        return snapshot_topics(self._prefix, self._device, stream)

    def notify(self) -> None:
        """A snapshot was stored: look at the store now (any thread)."""
        self._wake.set()

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        """End the thread (snapshots not sent stay in the store)."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._poll_s)
            self._wake.clear()
            try:
                self.run_once()
            except StoreError as exc:
                if self._limiter.hit("store") is not None:
                    log.warning("snapshots not published: %s", exc)
            except Exception:  # a bug must not end the thread
                log.exception("snapshot publisher failed")

    def run_once(self) -> int:
        """Publish what is due (see the module docstring); returns snapshots written.

        Raises:
            StoreError: the store failed (the thread logs it and tries again).
        """
        self._check_probe()
        if self._probe is not None or not self._pub.connected:
            return 0  # a probe's outcome is awaited before anything else goes out
        sent = 0
        for snap in self._store.snapshots_to_publish():
            if self._stop.is_set() or not self._pub.connected:
                break
            sent += self._publish(snap)
        return sent

    def _check_probe(self) -> None:
        """The outcome of the probe in flight, once known (module docstring)."""
        probe = self._probe
        if probe is None:
            return
        lost = self._pub.generation != probe.generation or not self._pub.connected
        if not lost:
            if self._monotonic() - probe.at > RETAIN_PROBE_S:
                self._probe = None
                self._survived(probe)
            return
        self._probe = None
        row_id = probe.row_id
        losses = self._losses.get(row_id, 0) + 1
        self._losses[row_id] = losses
        if probe.retained:
            self._unretained.add(row_id)  # retained or size? the next attempt tells
        elif losses >= SIZE_STRIKES:
            self._too_large(probe, losses)
            return
        self._store.mark_snapshot_published(row_id, None, None)  # sent again

    def _survived(self, probe: _Probe) -> None:
        """The connection outlived the probe: its size and retain flag are taken."""
        row_id = probe.row_id
        self._attempts.pop(row_id, None)
        self._losses.pop(row_id, None)
        self._ok_packet = max(self._ok_packet, probe.packet)
        if probe.retained:
            self._retain_ok = True
        elif row_id in self._unretained:  # lost retained, taken not retained
            self._unretained.discard(row_id)
            self._strikes += 1
            if self._strikes >= RETAIN_STRIKES and not self.no_retain:
                self.no_retain = True
                log.warning("MQTT broker dropped the connection at a retained snapshot and took "
                            "it not retained, %d times: it seems to refuse retained messages; "
                            "snapshots go out not retained until the agent restarts",
                            self._strikes)

    def _too_large(self, probe: _Probe, losses: int) -> None:
        """The broker dropped the connection at ``probe`` ``losses`` times, the last time not
        retained: too large for it (module docstring)."""
        limit = max(1, probe.packet - 1)
        if self.learned_max_packet is None or limit < self.learned_max_packet:
            self.learned_max_packet = limit
        self._attempts.pop(probe.row_id, None)
        self._losses.pop(probe.row_id, None)
        self._unretained.discard(probe.row_id)
        self._oversize(probe.row_id, probe.alert_id, probe.topic,
                       f"the broker dropped the connection at it {losses} times (packet of "
                       f"{probe.packet} bytes; limit learned: {limit})")

    def _publish(self, snap: Snapshot) -> int:
        jpeg_topic, png_topic = self.topics(snap.stream)
        parts = [(jpeg_topic, snap.jpeg, "image/jpeg")]
        if snap.heatmap is not None:
            parts.append((png_topic, snap.heatmap, "image/png"))
        for topic, data, _ in parts:
            why = self._size_problem(topic, data)
            if why is not None:
                self._oversize(snap.row_id, snap.alert_id, topic, why)
                return 0
        attempts = self._attempts.get(snap.row_id, 0) + 1
        self._attempts[snap.row_id] = attempts
        if attempts > MAX_ATTEMPTS:
            self._store.mark_snapshot_published(snap.row_id, "failed", None)
            self._metrics.snapshots_unpublished_total.labels(reason="failed").inc()
            self._attempts.pop(snap.row_id, None)
            return 0
        retain = (self._pub.retain_available and not self.no_retain
                  and snap.row_id not in self._unretained)
        gen = self._pub.generation
        packet, big_topic = max((publish_packet_bytes(t, d, v5=self._pub.v5), t)
                                for t, d, _ in parts)
        handed = False
        for topic, data, ctype in parts:
            props = None
            if self._pub.v5:
                props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
                props.ContentType = ctype
                props.UserProperty = [("alert_id", snap.alert_id)]
            info = self._pub.publish_best_effort(topic, data, retain=retain, properties=props)
            if info is None:  # not connected: tried again on the next connection
                if handed and not self._pub.v5:
                    # the connection was lost after a part went out (a 3.1.1 broker drops it
                    # at a packet it refuses): the loss is that part's, a probe's outcome
                    self._probe = _Probe(gen, self._monotonic(), snap.row_id, snap.alert_id,
                                         retain, packet, big_topic)
                return 0
            handed = True
        self._store.mark_snapshot_published(snap.row_id, "published", self._clock())
        self._metrics.snapshots_published_total.labels(retained=str(retain).lower()).inc()
        if not self._pub.v5 and (packet > self._ok_packet or (retain and not self._retain_ok)
                                 or snap.row_id in self._unretained):
            self._probe = _Probe(gen, self._monotonic(), snap.row_id, snap.alert_id, retain,
                                 packet, big_topic)
        else:
            self._attempts.pop(snap.row_id, None)
        self.published += 1
        return 1

    def _oversize(self, row_id: int, alert_id: str, topic: str, why: str) -> None:
        self._store.mark_snapshot_published(row_id, "oversize", None)
        self._metrics.snapshots_unpublished_total.labels(reason="oversize").inc()
        if self._limiter.hit("oversize") is not None:
            log.warning("snapshot of alert %s kept in the store, not published: %s on %s",
                        alert_id, why, topic)

    def _size_problem(self, topic: str, data: bytes) -> str | None:
        limit = SizeLimit(topic, self._pub.config.max_message_bytes)
        limit.v5 = self._pub.v5
        limit.broker_max_packet = self._pub.limit.broker_max_packet
        learned = [n for n in (self._pub.limit.learned_max_packet, self.learned_max_packet)
                   if n is not None]
        limit.learned_max_packet = min(learned) if learned else None
        return limit.problem(data, PROPERTIES_RESERVE if self._pub.v5 else 0)
