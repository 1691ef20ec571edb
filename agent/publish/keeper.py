"""Raising an alert: store it in the outbox, or deliver it from memory when the store refuses.

:class:`AlertKeeper` is what the agent's pipeline thread calls for each alert. Normally the alert
goes into the store's outbox (:meth:`agent.store.sqlite.Store.add_new_alert`) and the publisher
drains it. When the store refuses the write (disk full, I/O error), the alert gets the next
sequence number of its stream continued in memory and goes to the publisher's in-memory queue
(:mod:`agent.publish.volatile`, which documents the id continuation and its crash window). Only an
alert that is neither stored nor handed to MQTT (MQTT disabled, queue full, the stored counter
unreadable) counts in ``dropped_total{kind="alert", reason="store_error"}``; one the publisher still
holds unacknowledged when it stops is counted there by the publisher.

Publish while committing (``writer`` given and MQTT enabled): a new alert is numbered from the
id ledger's reserved block (:meth:`agent.store.ids.IdLedger.take`, durable before the number is
used) and handed to the publisher (:meth:`MqttPublisher.publish_early`) and to the store writer
(:class:`agent.store.writer.AlertWriter`, group commits) at the same time; what holds after a
crash between the publish and the commit is in :mod:`agent.publish.early`. When the ledger cannot
be written, or alerts of a refused episode are still numbered in memory, the alert takes the
path above (stored first), after the commits of the alerts raised before it (at most
:data:`ORDER_WAIT_S`), so the outbox and the stored episodes keep the raising order.

Logging: one ERROR line when an episode of refused alerts starts, one WARNING line with the
figures when the store takes alerts again.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

from agent.errors import StoreError
from agent.metrics import Metrics
from agent.publish.mqtt import MqttPublisher
from agent.records import Alert
from agent.store.episodes import EpisodeMark
from agent.store.sqlite import Store
from agent.store.writer import AlertWriter

log = logging.getLogger("agent")

#: Longest wait, seconds, for the store writer's queued commits before an alert is stored
#: directly (the id ledger cannot reserve a number, or refused alerts are numbered in memory),
#: or queued for MQTT behind one that was not (the in-memory queue was full).
ORDER_WAIT_S = 5.0


class AlertKeeper:
    """Stores alerts, falling back to in-memory MQTT delivery (see the module docstring).

    Args:
        store: The agent's store.
        publisher: The MQTT publisher, None when MQTT is disabled.
        metrics: Receives ``dropped_total{kind="alert", reason="store_error"}``.
        clock: Wall clock, epoch seconds: the first refused alert of a stream numbers on from
            ``max(stored last + 1, clock() in ms)`` (:mod:`agent.publish.volatile`).
        writer: The store writer for publish while committing (None: every alert is stored
            before it is published); its ``on_commit`` must be ``publisher.committed``.
    """

    def __init__(self, store: Store, publisher: MqttPublisher | None, metrics: Metrics,
                 clock: Callable[[], float] = time.time, *,
                 writer: AlertWriter | None = None) -> None:
        self._store = store
        self._writer = writer
        self._clock = clock
        self._publisher = publisher
        self._metrics = metrics
        #: Per stream: the last sequence number used in memory and not yet persisted.
        self._floor: dict[str, int] = {}
        self._episode = 0  # alerts refused in the current episode
        self._unqueued = False  # the last early alert was not queued for MQTT (drains stored)
        self._not_stored = 0
        #: Alerts neither stored nor handed to MQTT (this agent; see also the publisher's).
        self.lost = 0

    @property
    def not_stored(self) -> int:
        """Alerts the store refused (this agent)."""
        return self._not_stored + (0 if self._writer is None else self._writer.refused)

    @property
    def delivered_from_memory(self) -> int:
        """Refused alerts the broker acknowledged."""
        pub = self._publisher
        return 0 if pub is None else pub.volatile.delivered + pub.early.delivered_unstored

    @property
    def lost_total(self) -> int:
        """Refused alerts that were really lost: never handed to MQTT, or unacknowledged at stop."""
        return self.lost + (0 if self._publisher is None else self._publisher.volatile.lost)

    def add(self, stream: str, make: Callable[[int], Alert],
            episode: EpisodeMark | None = None, seq: int | None = None,
            received_mono: float | None = None) -> tuple[Alert | None, bool]:
        """Store ``make(seq)`` with the stream's next sequence number, or deliver it from memory.

        Args:
            stream: Stream name.
            make: Builds the alert from its sequence number.
            episode: What the event does to the stream's open episode (stored with it).
            seq: A sequence number already decided (an event of a recorded input: derived from
                the input, :mod:`agent.pipeline.event_ids`) instead of the stream's next one;
                an event already stored under it is not stored again (``(None, False)``).
            received_mono: When the newest reading behind the alert was received (monotonic
                s), for the publisher's latency histogram.

        Returns:
            ``(alert, stored)``; ``alert`` is None only when no unique id could be made (the
            store can be neither written nor read): that alert is lost and counted; or when
            an event with the decided ``seq`` is stored already (a recorded input read again).

        Raises:
            ValueError: The payload holds a non-finite number.
        """
        if seq is not None:
            return self._add_fixed(stream, make(seq), episode)
        if self._writer is not None and not self._floor:
            early = self._add_early(stream, make, episode, received_mono)
            if early is not None:
                return early, True
        if self._writer is not None and self._writer.pending():
            # alerts raised before this one still wait for their commit: store this one after
            # them, so the outbox (what a restarted agent sends) and the episodes keep the
            # raising order (a ``cleared`` stored before its ``raised`` would leave it open)
            self._writer.flush(ORDER_WAIT_S)
        try:
            floor = self._floor.get(stream, 0)
            alert = (self._store.add_new_alert(stream, make, floor) if episode is None
                     else self._store.add_new_alert(stream, make, floor, episode=episode))
        except StoreError as exc:
            return self._refused(stream, make, exc), False
        self._floor.pop(stream, None)
        if self._episode:
            log.warning(
                "the store takes alerts again after refusing %d; %d refused alert(s) so far "
                "delivered over MQTT from memory, %d lost",
                self._episode, self.delivered_from_memory, self.lost_total,
            )
            self._episode = 0
        return alert, True

    def _add_early(self, stream: str, make: Callable[[int], Alert],
                   episode: EpisodeMark | None, received_mono: float | None) -> Alert | None:
        """Publish and commit at the same time (module docstring); None when the id ledger
        cannot reserve a number (nothing done: the caller stores the alert first)."""
        pub, writer = self._publisher, self._writer
        if pub is None or writer is None or not pub.config.enabled or not writer.running:
            return None
        try:
            seq = self._store.ids.take(stream, lambda: self._store.last_alert_seq(stream))
        except (OSError, StoreError):
            return None
        alert = make(seq)
        payload = json.dumps(
            alert.to_payload(), ensure_ascii=False, separators=(",", ":"), allow_nan=False
        )
        if received_mono is not None:
            pub.track(alert.alert_id, received_mono)
        if self._unqueued and writer.pending():
            # the alert before was not queued for MQTT (queue full): it goes out from the
            # outbox once committed; this one is queued behind the rows committed so far, so
            # that commit must be in first (raising order)
            writer.flush(ORDER_WAIT_S)
        published = pub.publish_early(alert.alert_id, stream, payload)
        self._unqueued = not published
        try:
            writer.put(alert, payload, episode)
        except StoreError as exc:  # the writer is stopped (shutdown)
            self._not_stored += 1
            if published:
                pub.committed([(alert.alert_id, -1)])  # a volatile alert from now on
            else:
                self._lose(f"stream {stream}: alert {alert.alert_id} not stored ({exc}) and "
                           "not handed to MQTT: lost")
        return alert

    def _add_fixed(self, stream: str, alert: Alert,
                   episode: EpisodeMark | None) -> tuple[Alert | None, bool]:
        """Store an event whose id is decided (idempotent on its id), or deliver it from
        memory when the store refuses it."""
        try:
            inserted = self._store.add_alert(alert, episode)
        except StoreError as exc:
            self._not_stored += 1
            payload = json.dumps(alert.to_payload(), ensure_ascii=False,
                                 separators=(",", ":"), allow_nan=False)
            pub = self._publisher
            if pub is not None and pub.publish_volatile(alert.alert_id, stream, payload):
                return alert, False
            self._lose(f"stream {stream}: alert {alert.alert_id} not stored ({exc}): lost")
            return alert, False
        return (alert if inserted else None), inserted

    def persist_seq(self) -> None:
        """Persist the in-memory sequence continuations (after any write the store took)."""
        for stream, floor in list(self._floor.items()):
            try:
                self._store.raise_alert_seq(stream, floor)
            except StoreError:
                return
            if self._floor.get(stream) == floor:
                del self._floor[stream]

    def _refused(self, stream: str, make: Callable[[int], Alert], exc: StoreError) -> Alert | None:
        self._not_stored += 1
        self._episode += 1
        first = self._episode == 1
        last = self._floor.get(stream)
        if last is None:
            try:
                last = self._store.last_alert_seq(stream)
            except StoreError as read_exc:
                self._lose(f"stream {stream}: alert not stored ({exc}) and no unique id can be "
                           f"made ({read_exc}): lost")
                return None
            # Jump to the wall clock in ms: if the agent dies before the store takes a write,
            # the restarted agent numbers on from the stored counter, below these ids, instead
            # of reissuing them (a consumer deduplicating by alert_id would drop new alerts).
            last = max(last, int(self._clock() * 1000) - 1)
        alert = make(last + 1)
        self._floor[stream] = alert.seq
        payload = json.dumps(
            alert.to_payload(), ensure_ascii=False, separators=(",", ":"), allow_nan=False
        )
        pub = self._publisher
        if pub is not None and pub.publish_volatile(alert.alert_id, stream, payload):
            if first:
                log.error(
                    "stream %s: alert %s not stored (%s); delivering alerts over MQTT from "
                    "memory until the store takes them again (lost if the agent stops first)",
                    stream, alert.alert_id, exc,
                    extra={"stream": stream, "alert_id": alert.alert_id},
                )
            return alert
        why = "MQTT is disabled" if pub is None or not pub.config.enabled else (
            "the in-memory queue is full")
        self._lose(f"stream {stream}: alert {alert.alert_id} not stored ({exc}) and {why}: lost")
        return alert

    def _lose(self, message: str) -> None:
        self.lost += 1
        self._metrics.dropped_total.labels(kind="alert", reason="store_error").inc()
        log.error("%s", message)
