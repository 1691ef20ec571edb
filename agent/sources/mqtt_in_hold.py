"""Messages of the ``mqtt`` source waiting for room in the agent's reading queue.

paho runs its network loop in the source thread: reading packets, the keepalive
(PINGREQ/PINGRESP) and the acknowledgements (PUBACK) all happen there, between callbacks. A
callback that waited for a full pipeline would stall them; after 1.5 keepalive periods without a
packet the broker drops the connection, and with a persistent session it then delivers every
unacknowledged message again (duplicates). So the source never waits inside paho's callback,
and acknowledges QoS 1 messages itself (paho's ``manual_ack``):

* a message is acknowledged once its reading is in the agent's queue, or once it turned out to
  carry no reading (rejected, or part of a sample-and-hold row still missing channels);
* while a reading waits, the messages after it wait behind it, so the acknowledgements go out
  in the order the messages came (MQTT 3.1.1 §4.6);
* a broker sends at most its inflight window of unacknowledged QoS 1 messages to a client
  (mosquitto ``max_inflight_messages``, 20 by default) and queues the rest for the session
  (``max_queued_messages``): a slow pipeline holds back the broker, not the keepalive;
* at most ``limit`` messages wait here. A QoS 0 delivery, or a broker whose inflight window is
  unlimited, can bring more: then the oldest waiting message is let go, acknowledged, and its
  reading (if it had one) is dropped and returned to the caller to count (``queue_full``);
* when the connection is lost, the waiting messages the broker delivers again (QoS 1 with a
  persistent session, MQTT 3.1.1 §4.4) are forgotten: they come back after the reconnect. The
  others are kept and handed over later, without an acknowledgement (their packet ids belonged
  to the old connection).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from agent.records import Reading
from agent.sources.base import Offer

#: ``ack(mid, qos)``: acknowledge a message (paho's ``Client.ack``).
Ack = Callable[[int, int], object]


@dataclass(slots=True)
class Held:
    """One waiting message.

    Attributes:
        reading: Its reading; None = nothing to hand over, only the acknowledgement waits.
        mid, qos: Its packet id and QoS as delivered.
        session: The connection it came on (the source's connect count).
    """

    reading: Reading | None
    mid: int
    qos: int
    session: int


class HeldMessages:
    """The waiting messages of one source, oldest first (see the module docstring).

    Args:
        limit: Most messages kept waiting (>= 1).

    Raises:
        ValueError: ``limit`` below 1.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit}")
        self.limit = limit
        self._q: deque[Held] = deque()

    def __len__(self) -> int:
        return len(self._q)

    def hold(self, item: Held, ack: Ack, session: int) -> Reading | None:
        """Queue ``item`` behind the others. When ``limit`` messages wait already, the oldest
        is let go first (acknowledged when it came on ``session``); returns its reading, which
        is then dropped (the caller counts it), or None."""
        dropped = None
        if len(self._q) >= self.limit:
            old = self._q.popleft()
            _ack(old, ack, session)
            dropped = old.reading
        self._q.append(item)
        return dropped

    def release(self, offer: Offer, ack: Ack, session: int, wait_s: float) -> int:
        """Hand the waiting readings over in order, acknowledging each message once its reading
        is taken; stops at the first reading the queue has no room for within ``wait_s``
        seconds. Returns how many messages are still waiting."""
        q = self._q
        taken: list[Held] = []
        while q:
            head = q[0]
            if head.reading is not None and not offer(head.reading, wait_s):
                break
            taken.append(q.popleft())
        for item in taken:  # after the offers: a send lets the pipeline thread run
            _ack(item, ack, session)
        return len(q)

    def connection_lost(self, redelivered: Callable[[Held], bool]) -> int:
        """Forget the waiting messages the broker delivers again after the reconnect
        (``redelivered(item)`` True); returns how many were forgotten."""
        kept = [h for h in self._q if not redelivered(h)]
        gone = len(self._q) - len(kept)
        self._q = deque(kept)
        return gone

    def clear(self) -> list[Reading]:
        """Empty the queue; returns the readings that were waiting."""
        readings = [h.reading for h in self._q if h.reading is not None]
        self._q.clear()
        return readings


def _ack(item: Held, ack: Ack, session: int) -> None:
    if item.qos > 0 and item.session == session:
        ack(item.mid, item.qos)
