"""MQTT in: messages waiting for room in the agent's queue (agent.sources.mqtt_in_hold)."""

from __future__ import annotations

import numpy as np
import pytest

from agent.records import Reading
from agent.sources.mqtt_in_hold import Held, HeldMessages


def _reading(k: int) -> Reading:
    return Reading("s", 1_700_000_000.0 + k, np.array([float(k)]))


class Queue:
    """An offer with ``room`` places; records what it took and in which order."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.taken: list[float] = []
        self.waits: list[float] = []
        self.events: list[str] = []

    def offer(self, reading: Reading, wait_s: float) -> bool:
        self.waits.append(wait_s)
        if len(self.taken) >= self.room:
            return False
        self.taken.append(float(reading.values[0]))
        self.events.append(f"queued {int(reading.values[0])}")
        return True

    def ack(self, mid: int, qos: int) -> None:
        self.events.append(f"ack {mid}/{qos}")


def test_acknowledged_in_arrival_order_only_once_queued_and_after_the_offers() -> None:
    held = HeldMessages(10)
    q = Queue(room=2)
    held.hold(Held(_reading(1), 11, 1, 1), q.ack, 1)
    held.hold(Held(None, 12, 1, 1), q.ack, 1)  # a rejected message: only its ack waits
    held.hold(Held(_reading(3), 13, 1, 1), q.ack, 1)
    held.hold(Held(_reading(4), 14, 1, 1), q.ack, 1)
    assert held.release(q.offer, q.ack, 1, 0.1) == 1  # no room for 4
    # the ack of 12 waited behind 1; 14 is neither queued nor acknowledged
    assert q.events == ["queued 1", "queued 3", "ack 11/1", "ack 12/1", "ack 13/1"]
    assert q.waits[-1] == 0.1
    q.room = 3
    assert held.release(q.offer, q.ack, 1, 0.1) == 0
    assert q.events[-2:] == ["queued 4", "ack 14/1"]


def test_beyond_the_limit_the_oldest_is_acknowledged_and_its_reading_returned() -> None:
    held = HeldMessages(2)
    q = Queue(room=0)
    assert held.hold(Held(_reading(1), 1, 1, 1), q.ack, 1) is None
    assert held.hold(Held(None, 2, 1, 1), q.ack, 1) is None
    dropped = held.hold(Held(_reading(3), 3, 1, 1), q.ack, 1)
    assert dropped is not None and dropped.values[0] == 1.0
    assert q.events == ["ack 1/1"]  # the head goes: the acks stay in order
    assert held.hold(Held(_reading(4), 4, 1, 1), q.ack, 1) is None  # 2 had no reading
    assert q.events == ["ack 1/1", "ack 2/1"] and len(held) == 2


def test_qos0_and_old_connections_are_never_acknowledged() -> None:
    held = HeldMessages(10)
    q = Queue(room=10)
    held.hold(Held(_reading(1), 5, 1, 1), q.ack, 2)  # came on connection 1, now on 2
    held.hold(Held(_reading(2), 0, 0, 2), q.ack, 2)
    held.hold(Held(_reading(3), 6, 1, 2), q.ack, 2)
    held.release(q.offer, q.ack, 2, 0.0)
    assert q.taken == [1.0, 2.0, 3.0] and q.events[-1:] == ["ack 6/1"]
    assert "ack 5/1" not in q.events


def test_what_the_broker_delivers_again_is_forgotten_on_a_reconnect() -> None:
    held = HeldMessages(10)
    q = Queue(room=10)
    held.hold(Held(_reading(1), 1, 1, 1), q.ack, 1)
    held.hold(Held(_reading(2), 0, 0, 1), q.ack, 1)
    assert held.connection_lost(lambda h: h.qos > 0) == 1
    assert [r.values[0] for r in held.clear()] == [2.0] and len(held) == 0


def test_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        HeldMessages(0)
