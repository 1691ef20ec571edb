"""The RTU retirement rule (agent/sources/modbus_rtu.py) on a scripted port and a fake clock."""

from __future__ import annotations

import doctest

from agent.sources import modbus_rtu
from agent.sources.modbus_rtu import crc16, retire


def frame(*body: int) -> bytes:
    c = crc16(bytes(body))
    return bytes([*body, c & 0xFF, c >> 8])


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class Port:
    """Bytes that arrive at given times (on ``clock``)."""

    def __init__(self, clock: Clock, arrivals: list[tuple[float, bytes]]) -> None:
        self.clock, self.arrivals, self.buffer, self.flushed = clock, arrivals, b"", 0

    def _arrive(self) -> None:
        while self.arrivals and self.arrivals[0][0] <= self.clock.now:
            self.buffer += self.arrivals.pop(0)[1]

    @property
    def in_waiting(self) -> int:
        self._arrive()
        return len(self.buffer)

    def read(self, n: int) -> bytes:
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def reset_input_buffer(self) -> None:
        self.flushed += 1
        self.buffer = b""


def run(arrivals: list[tuple[float, bytes]], bound: float = 2.0) -> tuple[bool, Clock, Port]:
    clock = Clock()
    port = Port(clock, arrivals)
    answered = retire(port, unit=1, function=3, count=2, late_answer_s=bound, gap_s=0.002,
                      monotonic=clock, sleep=clock.sleep)
    return answered, clock, port


def test_doctests() -> None:
    assert doctest.testmod(modbus_rtu).failed == 0


def test_a_late_answer_retires_the_request_at_once() -> None:
    answered, clock, port = run([(0.7, frame(1, 3, 4, 0, 1, 0, 2))])
    assert answered
    assert 0.7 <= clock.now < 0.75  # its arrival and the inter-frame silence, not the bound
    assert port.flushed == 1


def test_an_exception_answer_retires_it_too() -> None:
    answered, clock, _ = run([(0.3, frame(1, 0x83, 6))])
    assert answered and clock.now < 0.35


def test_noise_or_another_request_s_answer_waits_for_the_bound() -> None:
    other = frame(1, 3, 2, 0, 1)  # one register, not the two asked for
    broken = frame(1, 3, 4, 0, 1, 0, 2)[:-1] + b"\x00"  # wrong CRC
    wrong_unit = frame(2, 3, 4, 0, 1, 0, 2)
    answered, clock, port = run([(0.1, b"\xff\x00"), (0.2, other), (0.3, broken),
                                 (0.4, wrong_unit)])
    assert not answered
    assert clock.now >= 2.0
    assert port.buffer == b""


def test_an_answer_split_across_reads_is_found() -> None:
    whole = frame(1, 3, 4, 0, 1, 0, 2)
    answered, clock, _ = run([(0.5, whole[:3]), (0.6, whole[3:])])
    assert answered and 0.6 <= clock.now < 0.65


def test_bytes_after_the_answer_are_drained_before_returning() -> None:
    answered, _, port = run([(0.5, frame(1, 3, 4, 0, 1, 0, 2)), (0.501, b"\x01\x03")])
    assert answered
    assert port.buffer == b"" and not port.arrivals
