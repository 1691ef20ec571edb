"""Alerts published while their commit runs: the publisher's half of "publish while committing".

The pipeline thread numbers an alert from the id ledger's reserved block, hands it to the MQTT
publisher as a volatile message (:mod:`agent.publish.volatile`, ``early=True``) and to the store
writer (:mod:`agent.store.writer`) at the same time. The two finish in either order;
:class:`EarlyBook` keeps, per alert id, how far its commit is:

* commit pending: the alert lives only in memory (volatile queue, writer queue);
* committed as outbox row ``r``: the row *shadows* the volatile message, i.e. the drain does not
  publish the row itself while the volatile message is in flight; once the PUBACK is in too, the
  row is marked published (:meth:`take_ready`, saved by the drain) and the alert is forgotten;
* refused by the store (disk full): a plain volatile alert (delivered from memory, lost if the
  process ends before the PUBACK; counted like the ones :mod:`agent.publish.keeper` hands over).

A PUBACK that arrives before the commit is remembered (:meth:`on_ack`) and applied when the
commit reports (:meth:`on_commit`): the publisher never forgets an alert whose PUBACK came first.

What holds for consumers (``alert_id`` never reused, see :mod:`agent.store.ids`):

* killed after the commit and before the PUBACK: the row is pending; the next agent sends it
  again with the same id (at least once, as before);
* killed after the PUBACK and before the commit: the broker has it (delivered once); the store
  does not, so it is not sent again, not uploaded to the fleet, and its episode mark is not
  stored (a ``raised`` event delivered this way is not continued or cleared by the next agent);
  its id stays reserved in the ledger, so no later alert takes it;
* killed before both: the alert is lost, as an alert raised an instant before a crash always was
  (it was never acknowledged nor stored: never accepted).

Thread-safe: the pipeline thread calls :meth:`begin`, the writer's thread :meth:`on_commit`, the
drain thread the rest.
"""

from __future__ import annotations

import threading

#: Commit states besides a row id (> 0).
PENDING = 0
REFUSED = -1


class EarlyBook:
    """Per alert id: commit pending, committed row, or refused (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state: dict[str, int] = {}
        self._acked: dict[str, float] = {}  # PUBACK (wall time) in, commit pending
        self._ready: list[tuple[str, int, float]] = []  # (alert_id, row, acked at) to mark
        self._doomed: dict[str, str] = {}  # given up before its commit: dead-letter reason
        self._dead: list[tuple[int, str]] = []  # (row, reason) to dead-letter
        #: Alerts the broker acknowledged that the store refused (delivered from memory).
        self.delivered_unstored = 0

    def begin(self, alert_id: str) -> None:
        """``alert_id`` was handed to the publisher and the writer (commit pending)."""
        with self._lock:
            self._state[alert_id] = PENDING

    def on_commit(self, alert_id: str, row: int) -> None:
        """The writer's result: outbox ``row`` (> 0), or <= 0 when the alert was not stored
        by this commit (refused; or stored already under its id: the row drains as usual)."""
        with self._lock:
            if alert_id not in self._state:
                return
            at = self._acked.pop(alert_id, None)
            reason = self._doomed.pop(alert_id, None)
            if reason is not None:  # given up while its commit ran
                del self._state[alert_id]
                if row > 0:
                    self._dead.append((row, reason))
                return
            if row <= 0:
                if row == 0 or at is not None:
                    del self._state[alert_id]
                    self.delivered_unstored += at is not None and row < 0
                else:
                    self._state[alert_id] = REFUSED
                return
            self._state[alert_id] = row
            if at is not None:
                self._ready.append((alert_id, row, at))

    def on_ack(self, alert_id: str, at: float) -> None:
        """The broker acknowledged ``alert_id`` at ``at`` (epoch s)."""
        with self._lock:
            state = self._state.get(alert_id)
            if state is None:
                return
            if state == PENDING:
                self._acked[alert_id] = at
            elif state == REFUSED:
                del self._state[alert_id]
                self.delivered_unstored += 1
            else:
                self._ready.append((alert_id, state, at))

    def forget(self, alert_id: str) -> None:
        """Stop tracking ``alert_id`` (not queued for MQTT): its row drains as any other."""
        with self._lock:
            self._state.pop(alert_id, None)
            self._acked.pop(alert_id, None)
            self._doomed.pop(alert_id, None)

    def give_up(self, alert_id: str, reason: str) -> bool:
        """The broker cannot take ``alert_id`` (too large, rejected): its row, committed now
        or later, is dead-lettered with ``reason`` (:meth:`take_dead`).

        Returns:
            False when the store refused it: the alert is lost (the caller counts it).
        """
        with self._lock:
            state = self._state.get(alert_id)
            if state is None:
                return True
            if state == REFUSED:
                del self._state[alert_id]
                return False
            if state == PENDING:
                self._doomed[alert_id] = reason
                return True
            del self._state[alert_id]
            self._dead.append((state, reason))
            return True

    def take_dead(self) -> list[tuple[int, str]]:
        """``(row, reason)`` of the committed alerts given up, to dead-letter."""
        with self._lock:
            dead, self._dead = self._dead, []
            return dead

    def take_ready(self) -> list[tuple[str, int, float]]:
        """``(alert_id, row, acked at)`` of the alerts both committed and acknowledged, to
        mark published; :meth:`saved` forgets them once that write succeeded."""
        with self._lock:
            ready, self._ready = self._ready, []
            return ready

    def has_ready(self) -> bool:
        """Rows wait to be marked published."""
        with self._lock:
            return bool(self._ready or self._dead)

    def put_back(self, ready: list[tuple[str, int, float]]) -> None:
        """Rows of :meth:`take_ready` whose write failed: taken again next time."""
        with self._lock:
            self._ready = ready + self._ready

    def saved(self, alert_ids: list[str]) -> None:
        """These alerts' rows are marked published: forget them."""
        with self._lock:
            for a in alert_ids:
                self._state.pop(a, None)

    def shadows(self, alert_id: str) -> bool:
        """True while the drain must not publish the outbox row of ``alert_id`` itself."""
        with self._lock:
            return alert_id in self._state

    def committed(self, alert_id: str) -> bool:
        """True when ``alert_id`` is in the outbox (not lost if the process ends now)."""
        with self._lock:
            return self._state.get(alert_id, PENDING) > 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._state)
