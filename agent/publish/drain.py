"""The drain thread of :class:`agent.publish.mqtt.MqttPublisher` (``mqtt-outbox``).

The only thread that reads the outbox, marks rows published (in batches) and dead-letters what
the broker cannot take, and the one that publishes, except an early alert that is the very next
message due: the thread raising it publishes it itself (:meth:`OutboxDrain._send_direct`, under
the drain's send lock); see :mod:`agent.publish.mqtt` for the contract.
:class:`OutboxDrain` is the publisher's base class: it holds the drain-thread half, the
publisher the public API and paho's callbacks, which only queue PUBACKs and wake this thread.
"""

from __future__ import annotations

import collections
import logging
import math
import socket
import threading
from collections.abc import Callable

import paho.mqtt.client as paho
from paho.mqtt.enums import MQTTErrorCode
from paho.mqtt.reasoncodes import ReasonCode

from agent.errors import StoreError
from agent.logs import ALWAYS
from agent.metrics import Metrics
from agent.publish.early import EarlyBook
from agent.publish.limits import PoisonWatch, ProgressGuard, SizeLimit, publish_packet_bytes
from agent.publish.mqtt_config import MqttConfig
from agent.publish.volatile import VolatileAlert, VolatileQueue, merge
from agent.store.sqlite import OutboxRow, Store

#: PUBACK reason codes (MQTT 5.0 section 3.4.2.1) that reject the message itself: the alert
#: is dead-lettered (Payload format invalid 0x99; Packet too large 0x95, which brokers send
#: although the specification does not list it for PUBACK). Any other failure (Not authorized,
#: Topic Name invalid, Quota exceeded, Unspecified, ...) is about the broker's configuration or
#: state: the alert stays in the outbox and is sent again on the next connection, and at the
#: latest :data:`REFUSED_RETRY_S` after the refusal on the same connection.
DEAD_LETTER_REASONS = frozenset({0x95, 0x99})
#: Seconds after a retryable refusal before the refused alerts are sent again on a healthy link
#: (a broker ACL fixed while the agent stays connected).
REFUSED_RETRY_S = 30.0

#: Least seconds between two log lines about oversized or refused alerts of one kind.
LOG_EVERY_S = 60.0


def _key(item: OutboxRow | VolatileAlert) -> tuple[str, int]:
    return ("v", item.n) if isinstance(item, VolatileAlert) else ("r", item.id)


class OutboxDrain:
    """The drain-thread half of the publisher (attributes set by its ``__init__``)."""

    #: Monotonic time to send the alerts the broker refused again (None = none refused).
    _retry_refused_mono: float | None = None

    config: MqttConfig
    alerts_topic: str
    limit: SizeLimit
    volatile: VolatileQueue
    early: EarlyBook
    last_loop_mono: float | None
    _store: Store
    _metrics: Metrics
    _client: paho.Client
    _clock: Callable[[], float]
    _monotonic: Callable[[], float]
    _log: logging.Logger
    _state_lock: threading.Lock
    _connected: bool
    _generation: int
    _acks: collections.deque[tuple[int, ReasonCode, float, float]]
    _tracked: collections.OrderedDict[str, float]
    _track_lock: threading.Lock
    _mids: dict[int, OutboxRow | VolatileAlert]
    #: Per row (``("r", id)``) or volatile alert (``("v", n)``): the mids of its latest sending
    #: not acknowledged yet, one per topic (:meth:`topics_for`); it is published when the last
    #: one is acknowledged, refused when any one is refused.
    _outstanding: dict[tuple[str, int], set[int]]
    _unsaved: list[tuple[OutboxRow, float, float]]
    _rejected: list[tuple[OutboxRow, str]]
    _guard: ProgressGuard
    _poison: PoisonWatch
    _own_drops: int
    _losses: collections.deque[float]
    _v5: bool
    _rejections_logged: set[int]
    _log_limits: dict[str, tuple[float, int]]
    _store_failing: bool
    _retain_rebuild: bool
    #: paho's network thread ended or its socket is gone unnoticed: the run loop starts a
    #: new client (:meth:`_check_progress`).
    _client_dead: bool = False
    _last_stats: float
    _wake: threading.Event
    _stopping: threading.Event
    _progress: threading.Condition
    #: Held by the drain thread for a pass (:meth:`_pass`) and by :meth:`_send_direct`: it
    #: guards ``_window``, ``_cursor``, ``_drain_generation``, ``_mids``, ``_outstanding``.
    _send_lock: threading.Lock
    #: Mids handed to paho and not yet acknowledged. Kept across reconnects: paho holds those
    #: messages and re-sends them itself (same mid, DUP set) on the new connection.
    _window: set[int]
    #: Last row id and volatile n handed to paho in this connection.
    _cursor: tuple[int, int] = (0, 0)
    #: The connection (``_generation``) the cursor belongs to (-1: none yet).
    _drain_generation: int = -1

    def _run(self) -> None:
        save_from = -math.inf  # monotonic; after a failed save, the next try waits a second
        while not self._stopping.is_set():
            self._wake.wait(1.0)
            self._wake.clear()
            try:
                with self._send_lock:
                    self._pass()
                if self._saves_due() and self._monotonic() >= save_from:
                    # After publishing, without the send lock (the pipeline thread publishes
                    # meanwhile): the save may wait for the store writer's commit. A store
                    # that refuses writes (disk full) must not stop the delivery, least of all
                    # of the alerts it refused (volatile): the acknowledgements stay in memory
                    # and are saved by a later pass.
                    try:
                        self._save_unsaved()
                    except StoreError as exc:
                        self._store_trouble(exc, pause=False)
                        save_from = self._monotonic() + 1.0
                self._update_stats()
            except StoreError as exc:
                self._store_trouble(exc)
            except Exception:  # the drain must survive anything; the row stays in the outbox
                self._log.exception("MQTT outbox drain failed; retrying")
                self._stopping.wait(1.0)
            self.last_loop_mono = self._monotonic()
            with self._progress:
                self._progress.notify_all()

    def _pass(self) -> None:
        """One pass of the drain thread with the send lock held: PUBACKs, lost connections,
        a client to rebuild, then publishing what is due."""
        window = self._window
        if self._take_acks(window):
            self._guard.progress(self._monotonic())
        self._check_losses(window)
        # the broker refused the retained will (MQTT 5), or paho's thread has ended
        if self._retain_rebuild or self._client_dead:
            self._retain_rebuild = self._client_dead = False
            window.clear()
            self._mids.clear()
            self._outstanding.clear()
            self._replace_client()
        with self._state_lock:
            connected, current = self._connected, self._generation
        if current != self._drain_generation:
            # New connection: restart from the oldest unacknowledged alert, skipping the ones
            # paho re-sends itself.
            self._drain_generation, self._cursor = current, (0, 0)
            self._guard.progress(self._monotonic())
            self._retry_refused_mono = None
        elif (self._retry_refused_mono is not None
              and self._monotonic() >= self._retry_refused_mono):
            # Alerts the broker refused (not in flight, not acknowledged): from the oldest
            # again, on this connection.
            self._retry_refused_mono = None
            self._cursor = (0, 0)
        if connected and not self._stopping.is_set():
            self._cursor = self._fill(window, self._cursor, current)
            self._check_progress(self._in_flight(window))

    def _send_direct(self, item: VolatileAlert) -> bool:
        """Publish ``item`` (just queued) on the caller's thread when it is the very next
        message the drain would send: connected, the drain caught up with this connection,
        every outbox row stored before it (``after_row``) and every volatile alert queued
        before it already handed to paho, a free in-flight slot, and the drain not busy
        (the send lock is only tried, never waited for). The drain's bookkeeping is the same
        as for a message it sends itself; the PUBACK is applied by the drain.

        Returns:
            True when handed to paho; False when the drain must send it (nothing done).
        """
        if not self._send_lock.acquire(blocking=False):
            return False
        try:
            with self._state_lock:
                connected, current = self._connected, self._generation
            rows_done, vol_done = self._cursor
            if (not connected or current != self._drain_generation
                    or self._stopping.is_set() or self._retain_rebuild or self._client_dead
                    or self._retry_refused_mono is not None or self._losses
                    or rows_done < item.after_row
                    or self.volatile.first_after(vol_done) is not item
                    or self._in_flight(self._window) >= self.config.max_inflight):
                return False
            if self._send(item, self._window, current) == "stop":
                return False
            self._cursor = (rows_done, item.n)
            return True
        finally:
            self._send_lock.release()

    def _replace_client(self) -> None:
        raise NotImplementedError  # MqttPublisher's

    def topics_for(self, item: OutboxRow | VolatileAlert) -> tuple[str, ...]:
        raise NotImplementedError  # MqttPublisher's

    def _check_losses(self, window: set[int]) -> None:
        """Connections lost since the last pass (their durations, queued by paho's thread):
        the same alert first in flight at each of a few short connections in a row is one the
        broker drops the connection for (:class:`agent.publish.limits.PoisonWatch`)."""
        while self._losses:
            lasted = self._losses.popleft()
            if self._own_drops:  # dropped by the progress guard, not by the broker
                self._own_drops -= 1
                self._poison.lost(None, lasted)
                continue
            oldest = next(iter(self._mids.values()), None)
            key = (None if oldest is None else ("v", oldest.n)
                   if isinstance(oldest, VolatileAlert) else ("r", oldest.id))
            if oldest is not None and self._poison.lost(key, lasted):
                self._poisoned(oldest, window)
                return

    def _poisoned(self, item: OutboxRow | VolatileAlert, window: set[int]) -> None:
        """The broker keeps dropping the connection at ``item``: take its size as the
        broker's limit, and start a new paho client without the messages the old one held
        (paho would send ``item`` again at every reconnect). The drain then sends ``item``
        reduced or dead-letters it, and goes on with the rest."""
        size = publish_packet_bytes(self.alerts_topic, item.payload.encode("utf-8"), v5=self._v5)
        self.limit.learn(size)
        self._metrics.mqtt_stalls_total.inc()
        self._log.error(
            "MQTT broker %s:%d dropped the connection %d times in a row right after receiving "
            "alert %s (a %d-byte packet): taking %d bytes as its packet size limit until the "
            "agent restarts (set mqtt.max_message_bytes, or use MQTT 5 with max_packet_size); "
            "starting a new MQTT client", self.config.host, self.config.port,
            self._poison.strikes, item.alert_id, size, size - 1,
            extra={"alert_id": item.alert_id, "stream": item.stream},
        )
        window.clear()
        self._mids.clear()
        self._outstanding.clear()
        self._replace_client()

    def _check_progress(self, in_flight: int) -> None:
        """Drop a connection that is up but has acknowledged nothing for the guard's timeout
        (PUBACKs lost on a link that still answers PINGs); paho then reconnects."""
        with self._state_lock:
            connected = self._connected
        if not self._guard.observe(self._monotonic(), in_flight=in_flight, connected=connected):
            return
        self._metrics.mqtt_stalls_total.inc()
        self._log.warning(
            "MQTT broker %s:%d acknowledged none of %d alert(s) in flight for %.0f s although "
            "the connection is up; dropping the connection to rebuild it",
            self.config.host, self.config.port, in_flight, self._guard.timeout_s, extra=ALWAYS,
        )
        loop = getattr(self._client, "_thread", None)  # paho's network thread (loop_start)
        if isinstance(loop, threading.Thread) and not loop.is_alive():
            # It ended on an exception paho does not handle: nothing reads or reconnects.
            self._log.warning("the MQTT client's network thread has ended: starting a new MQTT "
                              "client", extra=ALWAYS)
            self._client_dead = True  # the run loop replaces it (with what it held)
            return
        sock = self._client.socket()
        if isinstance(sock, socket.socket):  # also an ssl.SSLSocket
            try:  # paho's network thread sees the connection end and reconnects
                sock.shutdown(socket.SHUT_RDWR)
            except OSError as exc:
                # Already gone, and paho did not notice: its network thread is not running
                # (it ends on an exception it does not handle). A new client starts one.
                self._log.warning("could not drop the MQTT connection (%s): starting a new "
                                  "MQTT client", exc, extra=ALWAYS)
                self._client_dead = True
            else:
                self._own_drops += 1

    def _fill(
        self, window: set[int], cursor: tuple[int, int], generation: int
    ) -> tuple[int, int]:
        """Publish pending rows (and volatile alerts) after ``cursor`` until ``max_inflight``
        are unacknowledged; returns the new cursor ``(row id, volatile n)``."""
        # Rows the broker acknowledged whose save the store refused (disk full) are still
        # pending in the outbox: after a reconnect they are skipped, not sent again (each
        # reconnect would otherwise re-send every one, not only the ``max_inflight`` in flight).
        # Messages paho still holds (in ``window``) are re-sent by paho, not by the drain.
        acked = {row.id for row, _, _ in self._unsaved}
        acked.update(row.id for row, _ in self._rejected)
        held_rows = {m.id for m in self._mids.values() if not isinstance(m, VolatileAlert)}
        held_vol = {m.n for m in self._mids.values() if isinstance(m, VolatileAlert)}
        # Alerts in memory that no unread row goes before: out before the outbox is read (the
        # read may wait for the store writer's commit).
        for vol in self.volatile.after(cursor[1]):
            if (vol.after_row > cursor[0]
                    or self._in_flight(window) >= self.config.max_inflight):
                break
            outcome = "held" if vol.n in held_vol else self._send(vol, window, generation)
            if outcome == "stop":
                return cursor
            cursor = (cursor[0], vol.n)
            if outcome == "no_conn":
                return cursor
        while self._in_flight(window) < self.config.max_inflight:
            room = self.config.max_inflight - self._in_flight(window)
            try:
                hint = self._store.last_row_hint()
                # no row committed after the cursor: nothing to read
                rows = ([] if hint <= cursor[0]
                        else self._store.pending_alerts(room, after_id=cursor[0]))
            except StoreError as exc:
                if not len(self.volatile):
                    raise
                # The outbox cannot be read (a store not open on a full disk): nothing
                # stored can go out anyway, the alerts held in memory still do.
                self._store_trouble(exc, pause=False)
                hint, rows = -1, []
            batch = merge(rows, self.volatile.after(cursor[1]), len(rows) < room, room)
            if not batch:
                # every row up to ``hint`` (committed before the read) is published
                cursor = (max(cursor[0], hint), cursor[1])
                break
            for item in batch:
                if isinstance(item, VolatileAlert):
                    if item.n in held_vol:
                        cursor = (cursor[0], item.n)
                        continue
                elif (item.id in acked or item.id in held_rows
                      or self.early.shadows(item.alert_id)):
                    cursor = (item.id, cursor[1])
                    continue
                outcome = self._send(item, window, generation)
                if outcome == "stop":
                    return cursor
                cursor = ((cursor[0], item.n) if isinstance(item, VolatileAlert)
                          else (item.id, cursor[1]))
                if outcome == "no_conn":
                    return cursor
        return cursor

    def _send(self, item: OutboxRow | VolatileAlert, window: set[int], generation: int) -> str:
        """Hand ``item`` to paho on every topic of it (or dead-letter it when too large).

        Returns:
            ``"sent"`` (or dead-lettered), ``"no_conn"`` (paho holds it until it reconnects;
            send nothing more) or ``"stop"`` (the connection changed, or paho refused it:
            not sent, the cursor stays before it).
        """
        with self._state_lock:
            if not self._connected or self._generation != generation:
                return "stop"
        verdict = self.limit.check(item.payload)
        if verdict.payload is None:
            self._oversized(item, verdict.reason or "too large")
            return "sent"
        if verdict.reduced:
            self._metrics.mqtt_oversize_total.labels(action="reduced").inc()
            self._limited(logging.WARNING, "reduced", "alert %s: %s; sent in its "
                          "reduced form", item.alert_id, verdict.reason)
        topics = self.topics_for(item)
        sent = self._outstanding[_key(item)] = set()
        no_conn = False
        for topic in topics:
            info = self._client.publish(topic, verdict.payload, qos=1, retain=False)
            if info.rc not in (MQTTErrorCode.MQTT_ERR_SUCCESS, MQTTErrorCode.MQTT_ERR_NO_CONN):
                self._log.warning("paho refused to publish %s: %s", item.alert_id, info.rc,
                                  extra={"alert_id": item.alert_id, "stream": item.stream})
                return "stop"
            # paho holds the message even on NO_CONN and re-sends it after reconnecting.
            self._mids[info.mid] = item
            sent.add(info.mid)
            window.add(info.mid)
            no_conn = no_conn or info.rc == MQTTErrorCode.MQTT_ERR_NO_CONN
        return "no_conn" if no_conn else "sent"

    def _in_flight(self, window: set[int]) -> int:
        """Alerts (rows, volatile alerts) with a message in flight: a ``raised`` event has
        two messages (:meth:`topics_for`) and counts once against ``max_inflight``."""
        return len({_key(self._mids[m]) for m in window if m in self._mids})

    def _oversized(self, item: OutboxRow | VolatileAlert, reason: str) -> None:
        """An alert that fits no limit even reduced: dead-lettered (a stored row) or lost
        (a volatile one); counted and logged, never sent, so it blocks nothing."""
        self._metrics.mqtt_oversize_total.labels(action="dead_letter").inc()
        self._give_up(item, "too_large", f"{reason}, even reduced", f"mqtt: {reason}")

    def _save_acks(self, window: set[int]) -> None:
        """Turn queued PUBACKs into ``published_at`` rows (one transaction per batch)."""
        self._take_acks(window)
        self._save_unsaved()

    def _take_acks(self, window: set[int]) -> int:
        """Apply queued PUBACKs in memory: free their ``window`` slots, forget acknowledged
        volatile alerts, queue stored rows in ``_unsaved`` for :meth:`_save_unsaved` (and
        rows the broker rejected in ``_rejected``); returns how many PUBACKs were taken."""
        taken = 0
        while self._acks:
            mid, reason, at, at_mono = self._acks.popleft()
            taken += 1
            window.discard(mid)
            row = self._mids.pop(mid, None)
            if row is None:
                continue  # availability message, or a duplicate of a row already acknowledged
            current = self._outstanding.get(_key(row))
            if current is None or mid not in current:
                continue  # a message of an earlier sending of this alert (refused, re-sent)
            if reason.is_failure:  # once per alert and sending, whichever message it was
                del self._outstanding[_key(row)]
                self._broker_rejected(row, reason)
                continue
            current.discard(mid)
            if current:  # a raised event: its other topic is not acknowledged yet
                continue
            del self._outstanding[_key(row)]
            if isinstance(row, VolatileAlert):
                if self.volatile.ack(row.n):
                    if row.early:  # its row is marked published once committed
                        self.early.on_ack(row.alert_id, at)
                    self._metrics.mqtt_published_total.inc()
                    self._observe_latency(row.alert_id, row.stream, at_mono)
                continue
            self._unsaved.append((row, at, at_mono))
        return taken

    def _broker_rejected(self, row: OutboxRow | VolatileAlert, reason: ReasonCode) -> None:
        """A PUBACK with a failure reason code (MQTT 5): dead-lettered with the reason when the
        message itself is refused (a volatile one is lost), else sent again on the next
        connection (see :data:`DEAD_LETTER_REASONS`)."""
        self._metrics.mqtt_rejected_total.labels(reason=str(reason)).inc()
        if reason.value not in DEAD_LETTER_REASONS:
            if self._retry_refused_mono is None:
                self._retry_refused_mono = self._monotonic() + REFUSED_RETRY_S
            if reason.value not in self._rejections_logged:  # once per reason code
                self._rejections_logged.add(reason.value)
                self._log.error(
                    "broker rejected alert %s (%s): it stays in the outbox and is sent again "
                    "in %.0f s and on the next connection; further rejections for this reason "
                    "are only counted (edge_agent_mqtt_rejected_total)", row.alert_id, reason,
                    REFUSED_RETRY_S, extra={"alert_id": row.alert_id, "stream": row.stream})
            return
        self._give_up(row, "rejected", f"the broker rejected it ({reason})",
                      f"mqtt: broker rejected it ({reason})")

    def _give_up(self, item: OutboxRow | VolatileAlert, kind: str, why: str,
                 dead_reason: str) -> None:
        """Stop sending ``item``: a stored row is dead-lettered with ``dead_reason`` (it is
        still uploaded to the fleet); a volatile one is lost and counted in
        ``dropped_total{kind="alert", reason=kind}``. Logged at a limited rate."""
        if isinstance(item, VolatileAlert) and item.early:
            self.volatile.ack(item.n)
            if self.early.give_up(item.alert_id, dead_reason):  # stored: dead-lettered
                self._limited(logging.ERROR, kind, "alert %s: %s; dead-lettered in the store "
                              "(still uploaded to the fleet)", item.alert_id, why)
                return
        if isinstance(item, VolatileAlert):
            self.volatile.ack(item.n)
            self._metrics.dropped_total.labels(kind="alert", reason=kind).inc()
            self._limited(logging.ERROR, kind, "alert %s: %s; not stored either: lost",
                          item.alert_id, why)
            return
        self._limited(logging.ERROR, kind, "alert %s: %s; dead-lettered in the store (still "
                      "uploaded to the fleet)", item.alert_id, why)
        self._rejected.append((item, dead_reason))

    def _limited(self, level: int, key: str, msg: str, *args: object) -> None:
        """Log at most one line per ``key`` every :data:`LOG_EVERY_S` seconds; the next one
        says how many were left out (each alert is in the metrics and the dead-letter table)."""
        now = self._monotonic()
        last, skipped = self._log_limits.get(key, (-math.inf, 0))
        if now - last < LOG_EVERY_S:
            self._log_limits[key] = (last, skipped + 1)
            return
        self._log_limits[key] = (now, 0)
        if skipped:
            msg += f" ({skipped} more like it in the last {now - last:.0f} s)"
        self._log.log(level, msg, *args)

    def _saves_due(self) -> bool:
        """Acknowledgements or dead letters wait to be written."""
        return bool(self._unsaved or self._rejected or self.early.has_ready())

    def _save_unsaved(self) -> None:
        """Write the acknowledged rows of ``_unsaved`` as published (one transaction), the
        rows of ``_rejected`` as dead letters and the committed early alerts acknowledged
        (:mod:`agent.publish.early`; counted when acknowledged) as published.

        Raises:
            StoreError: A write failed; the rows not written stay queued.
        """
        ready = self.early.take_ready()
        if ready:
            try:
                self._store.mark_published([r for _, r, _ in ready], max(at for _, _, at in ready))
            except StoreError:
                self.early.put_back(ready)
                raise
            self.early.saved([a for a, _, _ in ready])
        for row_id, why in self.early.take_dead():
            self._rejected.append((OutboxRow(row_id, "", "", "", 0.0), why))
        while self._rejected:
            row, why = self._rejected[0]
            self._store.mqtt_dead_letter(row.id, why, self._clock())
            self._rejected.pop(0)
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
