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
  CONNACK, or the size learned from an alert, :class:`agent.publish.limits.SizeLimit`) is never
  sent: marked ``oversize`` in the store, counted in
  ``edge_agent_snapshots_unpublished_total{reason="oversize"}``, logged at most once a minute;
* a broker that refuses retained messages: MQTT 5 says so in its CONNACK (Retain Available 0)
  and the snapshots go out not retained (``snapshots_published_total{retained="false"}``); a
  3.1.1 broker cannot say and disconnects (mosquitto ``retain_available false``), so when the
  connection is lost within :data:`RETAIN_PROBE_S` of a retained snapshot twice, retained
  publishing is turned off until the agent restarts (one WARNING) and the snapshot is sent again
  not retained;
* a snapshot whose connection was lost at :data:`MAX_ATTEMPTS` attempts is marked ``failed``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from agent.errors import StoreError
from agent.logs import RateLimiter
from agent.metrics import Metrics
from agent.publish.limits import SizeLimit
from agent.publish.mqtt import MqttPublisher
from agent.store.snapshots import Snapshot
from agent.store.sqlite import Store

log = logging.getLogger("agent.mqtt")

#: A connection lost this soon (s) after a retained snapshot counts as the broker refusing it.
RETAIN_PROBE_S = 5.0
#: Connection losses after a retained snapshot before retained publishing is turned off.
RETAIN_STRIKES = 2
#: Attempts per snapshot before it is marked ``failed``.
MAX_ATTEMPTS = 3
#: Bytes kept for a PUBLISH's MQTT 5 properties when checking its size (content type, alert id).
PROPERTIES_RESERVE = 256


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
        #: ``(generation, monotonic time, row id)`` of the last retained snapshot sent.
        self._probe: tuple[int, float, int] | None = None
        self._strikes = 0
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
        if not self._pub.connected:
            return 0
        sent = 0
        for snap in self._store.snapshots_to_publish():
            if self._stop.is_set() or not self._pub.connected:
                break
            sent += self._publish(snap)
        return sent

    def _check_probe(self) -> None:
        """A connection lost soon after a retained snapshot: a strike (module docstring)."""
        probe = self._probe
        if probe is None:
            return
        gen, at, row_id = probe
        lost = self._pub.generation != gen or not self._pub.connected
        if not lost:
            if self._monotonic() - at > RETAIN_PROBE_S:
                self._probe = None
                self._attempts.pop(row_id, None)
            return
        self._probe = None
        self._strikes += 1
        if self._strikes >= RETAIN_STRIKES and not self.no_retain:
            self.no_retain = True
            log.warning("MQTT broker dropped the connection right after a retained snapshot "
                        "%d times: it seems to refuse retained messages; snapshots go out not "
                        "retained until the agent restarts", self._strikes)
        self._store.mark_snapshot_published(row_id, None, None)  # sent again

    def _publish(self, snap: Snapshot) -> int:
        jpeg_topic, png_topic = self.topics(snap.stream)
        parts = [(jpeg_topic, snap.jpeg, "image/jpeg")]
        if snap.heatmap is not None:
            parts.append((png_topic, snap.heatmap, "image/png"))
        for topic, data, _ in parts:
            why = self._size_problem(topic, data)
            if why is not None:
                self._store.mark_snapshot_published(snap.row_id, "oversize", None)
                self._metrics.snapshots_unpublished_total.labels(reason="oversize").inc()
                if self._limiter.hit("oversize") is not None:
                    log.warning("snapshot of alert %s kept in the store, not published: %s on "
                                "%s", snap.alert_id, why, topic)
                return 0
        attempts = self._attempts.get(snap.row_id, 0) + 1
        self._attempts[snap.row_id] = attempts
        if attempts > MAX_ATTEMPTS:
            self._store.mark_snapshot_published(snap.row_id, "failed", None)
            self._metrics.snapshots_unpublished_total.labels(reason="failed").inc()
            self._attempts.pop(snap.row_id, None)
            return 0
        retain = self._pub.retain_available and not self.no_retain
        gen = self._pub.generation
        for topic, data, ctype in parts:
            props = None
            if self._pub.v5:
                props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
                props.ContentType = ctype
                props.UserProperty = [("alert_id", snap.alert_id)]
            info = self._pub.publish_best_effort(topic, data, retain=retain, properties=props)
            if info is None:
                return 0  # not connected: tried again on the next connection
        self._store.mark_snapshot_published(snap.row_id, "published", self._clock())
        self._metrics.snapshots_published_total.labels(retained=str(retain).lower()).inc()
        if retain and not self._pub.v5:
            self._probe = (gen, self._monotonic(), snap.row_id)
        else:
            self._attempts.pop(snap.row_id, None)
        self.published += 1
        return 1

    def _size_problem(self, topic: str, data: bytes) -> str | None:
        limit = SizeLimit(topic, self._pub.config.max_message_bytes)
        limit.v5 = self._pub.v5
        limit.broker_max_packet = self._pub.limit.broker_max_packet
        limit.learned_max_packet = self._pub.limit.learned_max_packet
        return limit.problem(data, PROPERTIES_RESERVE if self._pub.v5 else 0)
