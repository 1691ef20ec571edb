"""Modbus RTU: one request at a time on the line, and a late answer retired before the next.

RTU frames carry no transaction id (Modbus over Serial Line V1.02, 2.5.1: address, function,
data, CRC), so a master cannot tell the answer to a request that timed out from the answer to
the next request with the same unit, function and length. A time window alone ("drain until
the line has been quiet for a while") does not settle it: the late answer may come right as
the window ends, which is what happened with pymodbus's own resends (two copies of a request
in flight, the drain measured from the first answer, the second answer arriving at its end).

The rule used here instead: **at most one request is ever outstanding on the line, and a
request that timed out stays outstanding until it is retired.** It is retired

1. by its own answer: a frame with a valid CRC from the same unit, with the same function
   (or its exception, function + 0x80) and the byte count the request asks for, is found
   among the bytes that arrive after the timeout (a device answers a request at most once;
   Modbus over Serial Line 2.4.1). Then the inter-frame silence (3.5 character times, at least
   1.75 ms; 2.5.1.1) is awaited and the line flushed; or
2. by the bound: ``late_answer_s`` has passed since the timeout and no such frame came. A
   device that answers even later than that breaks the only assumption RTU leaves a master;
   that bound is the one number to raise for a slow device, and the cost of a large one is
   paid only by requests that are never answered at all (a device off or a request lost).

Only then is anything sent again: a resend (the source's ``retries``, made here and not by
pymodbus, whose own resends put a second copy on the line while the first may still be
answered) or the next poll's request. Bytes that match no answer (noise, half a frame the
client already consumed) retire nothing; the wait then runs to the bound.

Rejected alternatives: matching content alone cannot tell a resend's answer from the next
poll's (same unit, function and length); an "arrived sooner than physically possible" test
needs arrival times on the wire, which USB adapters and pseudo-terminals do not give.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any


def char_time_s(baudrate: int, bytesize: int, parity: str, stopbits: float) -> float:
    """Seconds one character takes on the line: start, data, parity and stop bits.

    >>> round(char_time_s(19200, 8, "E", 1) * 1e6)
    573
    """
    return (1 + bytesize + (parity != "N") + stopbits) / baudrate


def inter_frame_s(baudrate: int, bytesize: int, parity: str, stopbits: float) -> float:
    """The silence that ends a frame: 3.5 character times, 1.75 ms above 19200 baud (2.5.1.1).

    >>> inter_frame_s(115200, 8, "N", 1)
    0.00175
    """
    if baudrate > 19200:
        return 0.00175
    return 3.5 * char_time_s(baudrate, bytesize, parity, stopbits)


def crc16(data: bytes) -> int:
    """Modbus CRC-16 (polynomial 0xA001 reflected, initial 0xFFFF); sent low byte first.

    >>> hex(crc16(bytes([0x01, 0x03, 0x00, 0x00, 0x00, 0x01])))
    '0xa84'
    """
    crc = 0xFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0xA001 if crc & 1 else crc >> 1
    return crc


def answer_bytes(function: int, count: int) -> int:
    """The data byte count of a read answer: 2 per register, 1 per 8 bits (spec 6.1-6.4)."""
    return (count + 7) // 8 if function in (1, 2) else 2 * count


def find_answer(buffer: bytes, unit: int, function: int, count: int) -> bool:
    """Whether ``buffer`` holds an answer to a read of ``count`` items by ``function`` on
    ``unit``: a normal answer with the right byte count or an exception, CRC valid.

    >>> frame = bytes([1, 3, 2, 0, 7])
    >>> c = crc16(frame)
    >>> find_answer(b"noise" + frame + bytes([c & 0xFF, c >> 8]), 1, 3, 1)
    True
    >>> find_answer(frame + bytes([c & 0xFF, c >> 8]), 1, 3, 2)  # asked for 2 registers
    False
    """
    size = answer_bytes(function, count)
    frames = ((bytes([unit, function, size]), 5 + size), (bytes([unit, function | 0x80]), 5))
    for head, length in frames:
        at = buffer.find(head)
        while at >= 0:
            frame = buffer[at: at + length]
            if len(frame) == length and crc16(frame[:-2]) == int.from_bytes(frame[-2:],
                                                                            "little"):
                return True
            at = buffer.find(head, at + 1)
    return False


def retire(
    port: Any,
    *,
    unit: int,
    function: int,
    count: int,
    late_answer_s: float,
    gap_s: float,
    monotonic: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Wait, after a timeout, until the request on the line is retired; flush the line.

    Args:
        port: The pyserial port (``in_waiting``, ``read``, ``reset_input_buffer``).
        unit, function, count: The request that timed out.
        late_answer_s: The bound: how long after the timeout an answer may still come.
        gap_s: The inter-frame silence (:func:`inter_frame_s`).

    Returns:
        True when the late answer came (retired by its answer), False at the bound.
    """
    deadline = monotonic() + late_answer_s
    seen = b""
    answered = False
    with contextlib.suppress(Exception):  # a broken port shows at the next request
        while monotonic() < deadline:
            waiting = port.in_waiting
            if waiting:
                seen += port.read(waiting)
                if find_answer(seen, unit, function, count):
                    answered = True
                    break
            else:
                sleep(0.002)
        quiet_since = give_up = monotonic()
        give_up += late_answer_s  # a line that never falls silent shows at the next request
        # the frame's end, and nothing after it
        while monotonic() - quiet_since < gap_s and monotonic() < give_up:
            if port.in_waiting:
                port.read(port.in_waiting)
                quiet_since = monotonic()
            else:
                sleep(gap_s / 2)
        port.reset_input_buffer()
    return answered
