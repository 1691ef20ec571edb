"""Alerts the store refused (disk full): held in memory until the broker acknowledges them.

When :meth:`agent.store.sqlite.Store.add_new_alert` fails, the agent still has the alert; rather
than lose it while the broker is reachable, it hands it to the MQTT publisher as a *volatile*
message: kept in a bounded in-memory queue (:data:`VOLATILE_LIMIT`), published with QoS 1 in raising
order, after every outbox row stored before it (``after_row``), re-sent after a reconnect until
its PUBACK arrives. It is never written to the store, so it is lost when the process ends first,
and it is not uploaded to the fleet.

Ids stay unique: the first refused alert of an episode takes ``max(stored last + 1, wall clock
in ms)`` as its sequence number, the next ones continue it in memory, and the next stored alert
(or any successful store write) persists that continuation (:meth:`Store.add_new_alert`
``seq_floor``, :meth:`Store.raise_alert_seq`), so stored numbering goes on above it. If the agent
dies while the store still refuses writes, the continuation is not persisted: the restarted agent
numbers on from the stored counter, which lies below the volatile alerts' numbers (unless it
issues more alerts than milliseconds passed since the episode began, or the clock was set back
by more than that), so no delivered id is issued again. Before this, the volatile alerts
continued the stored counter itself, and a crash during a disk-full episode reissued their ids
(68 new alerts took delivered ids in one such crash; a consumer deduplicating by ``alert_id``
would drop them).

The same queue carries the alerts published while their commit runs (``early``,
:mod:`agent.publish.early`): they are stored too, once the store writer's commit is in, and are
not counted here (:attr:`VolatileQueue.delivered`, :attr:`VolatileQueue.lost`) but by the
publisher.

Ordering (:func:`merge`) is pure code over the pending outbox rows and the queue.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from agent.store.sqlite import OutboxRow

#: Volatile alerts held at most; past it a new one is refused (the caller counts it lost).
VOLATILE_LIMIT = 10_000


@dataclass(frozen=True, slots=True)
class VolatileAlert:
    """One alert held in memory only.

    Attributes:
        n: Queue order (1, 2, ... in this process).
        after_row: Outbox row id of the last alert stored before it (0 for none): it is published
            after every pending row with ``id <= after_row``.
        alert_id: ``<device>:<stream>:<seq>``.
        stream: Stream name (metric label).
        payload: ``Alert.to_payload()`` as compact JSON text.
        early: Handed to the store writer too (:mod:`agent.publish.early`), not refused.
    """

    n: int
    after_row: int
    alert_id: str
    stream: str
    payload: str
    early: bool = False


class VolatileQueue:
    """The bounded queue of volatile alerts (thread-safe; the pipeline puts, the drain takes).

    Args:
        limit: Most alerts held.
    """

    def __init__(self, limit: int = VOLATILE_LIMIT) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        self._items: collections.OrderedDict[int, VolatileAlert] = collections.OrderedDict()
        self._n = 0
        #: Volatile alerts acknowledged by the broker so far.
        self.delivered = 0
        #: Volatile alerts forgotten unacknowledged (:meth:`clear`) so far.
        self.lost = 0

    def put(self, after_row: int, alert_id: str, stream: str, payload: str,
            early: bool = False) -> VolatileAlert | None:
        """Queue one alert; returns it, or None when the queue is full (nothing queued)."""
        with self._lock:
            if len(self._items) >= self._limit:
                return None
            self._n += 1
            item = self._items[self._n] = VolatileAlert(self._n, after_row, alert_id, stream,
                                                        payload, early)
            return item

    def after(self, n: int) -> list[VolatileAlert]:
        """Queued alerts with ``n`` above the given one, in queue order."""
        with self._lock:
            return [v for k, v in self._items.items() if k > n]

    def first_after(self, n: int) -> VolatileAlert | None:
        """The first queued alert with ``n`` above the given one (None: none queued)."""
        with self._lock:
            return next((v for k, v in self._items.items() if k > n), None)

    def ack(self, n: int) -> bool:
        """The broker acknowledged alert ``n``: forget it; True the first time."""
        with self._lock:
            item = self._items.pop(n, None)
            if item is None:
                return False
            self.delivered += not item.early
            return True

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def clear(self) -> int:
        """Forget every alert still queued (at stop); returns how many were lost (the early
        ones are the caller's to count: :meth:`drop_all`)."""
        return sum(1 for v in self.drop_all() if not v.early)

    def drop_all(self) -> list[VolatileAlert]:
        """Forget every alert still queued (at stop) and return them; the ones not ``early``
        count as lost."""
        with self._lock:
            items = list(self._items.values())
            self._items.clear()
            self.lost += sum(1 for v in items if not v.early)
            return items


def merge(
    rows: Sequence[OutboxRow], volatile: Sequence[VolatileAlert], rows_complete: bool, room: int
) -> list[OutboxRow | VolatileAlert]:
    """The next messages to publish, in raising order.

    A volatile alert goes before the first pending row stored after it (``id > after_row``).

    Args:
        rows: Pending outbox rows after the drain's cursor, by id.
        volatile: Queued volatile alerts after the drain's cursor, in queue order.
        rows_complete: ``rows`` holds every pending row after the cursor (else more may follow
            that must go before a volatile alert, so the merge stops where ``rows`` ends).
        room: Most messages returned.

    >>> row = lambda i: OutboxRow(i, f"a:{i}", "s", "{}", 0.0)
    >>> vol = lambda n, after: VolatileAlert(n, after, f"v:{n}", "s", "{}")
    >>> [m.alert_id for m in merge([row(1), row(3)], [vol(1, 2)], True, 10)]
    ['a:1', 'v:1', 'a:3']
    >>> [m.alert_id for m in merge([row(1)], [vol(1, 2)], False, 10)]
    ['a:1']
    >>> [m.alert_id for m in merge([], [vol(1, 0), vol(2, 0)], True, 1)]
    ['v:1']
    """
    out: list[OutboxRow | VolatileAlert] = []
    i = j = 0
    while len(out) < room:
        if j < len(volatile):
            if i < len(rows):
                take_volatile = rows[i].id > volatile[j].after_row
            elif rows_complete:
                take_volatile = True
            else:
                break
            if take_volatile:
                out.append(volatile[j])
                j += 1
                continue
        if i >= len(rows):
            break
        out.append(rows[i])
        i += 1
    return out
