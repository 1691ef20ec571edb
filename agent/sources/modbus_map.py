"""The register map as read requests, and responses as channel values (pure code, no I/O).

:func:`plan_reads` coalesces the channels of one unit and table into the fewest read requests:
channels sorted by address join one request while the unused span between them is at most
``max_gap`` and the request stays within the per-request limit (125 registers, 2000 bits:
Modbus Application Protocol Specification V1.1b3, 6.1-6.4). :func:`decode` turns the registers
(or bits) of one request into the values of its channels:

* register bytes: each 16-bit register is big-endian on the wire (spec 4.2); ``byte_order =
  "little"`` swaps the two bytes of every register (byte-swapped devices);
* words: ``word_order = "big"`` (the default) means the first register holds the most significant
  word; ``"little"`` reverses the registers of the value;
* int16/uint16/int32/uint32 are two's complement / unsigned, float32/float64 IEEE 754;
* ``bits``: ``(register >> bit) & (2**bits - 1)``; ``bool`` on a register is a 1-bit field;
* ``value = raw * scale + offset``, then rejected when not finite (``non_finite``) or outside
  ``[min, max]`` (``out_of_range``).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from agent.errors import RecordError
from agent.sources.modbus_config import BIT_TABLES, ChannelMap

#: struct format (big-endian) of each register type's bytes.
_FORMATS = {"int16": ">h", "uint16": ">H", "int32": ">i", "uint32": ">I",
            "float32": ">f", "float64": ">d"}


@dataclass(frozen=True, slots=True)
class ReadBlock:
    """One read request.

    Attributes:
        unit: Modbus unit id.
        table: holding, input, coil or discrete_input.
        address: First address read.
        count: Registers (or bits) read, within the protocol limit.
        channels: Indices (into the register map) of the channels this request carries.
    """

    unit: int
    table: str
    address: int
    count: int
    channels: tuple[int, ...]


def plan_reads(
    channels: Sequence[ChannelMap], max_gap: int, max_registers: int, max_bits: int
) -> list[ReadBlock]:
    """Coalesce a register map into read requests.

    Args:
        channels: The map (a valid one: every value fits the address space).
        max_gap: Unused registers (bits) one request may span between two channels.
        max_registers: Largest register request (<= 125).
        max_bits: Largest coil / discrete input request (<= 2000).

    Returns:
        Requests ordered by unit, table and address; every channel is in exactly one.

    >>> from agent.sources.modbus_config import ChannelMap as C
    >>> m = [C(name="a", address=0), C(name="b", address=1, type="float32", word_order="big"),
    ...      C(name="c", address=20), C(name="d", table="coil", address=3, type="bool")]
    >>> [(b.table, b.address, b.count, b.channels) for b in plan_reads(m, 8, 125, 2000)]
    [('coil', 3, 1, (3,)), ('holding', 0, 3, (0, 1)), ('holding', 20, 1, (2,))]
    """
    areas: dict[tuple[int, str], list[int]] = {}
    for i, ch in enumerate(channels):
        areas.setdefault((ch.unit, ch.table), []).append(i)
    blocks: list[ReadBlock] = []
    for (unit, table), indices in sorted(areas.items()):
        limit = max_bits if table in BIT_TABLES else max_registers
        ordered = sorted(indices, key=lambda i: (channels[i].address, i))
        start = end = -1
        members: list[int] = []
        for i in ordered:
            ch = channels[i]
            joins = members and ch.address - end <= max_gap and max(end, ch.end) - start <= limit
            if not joins:
                if members:
                    blocks.append(ReadBlock(unit, table, start, end - start, tuple(members)))
                start, end, members = ch.address, ch.end, []
            end = max(end, ch.end)
            members.append(i)
        blocks.append(ReadBlock(unit, table, start, end - start, tuple(members)))
    return blocks


def raw_value(ch: ChannelMap, data: Sequence[int] | Sequence[bool], base: int) -> float:
    """The raw (unscaled) value of ``ch`` from a response starting at address ``base``.

    Args:
        ch: The channel.
        data: The response's registers (ints 0-65535) or bits.
        base: Address of ``data[0]``.

    >>> from agent.sources.modbus_config import ChannelMap as C
    >>> raw_value(C(name="f", address=0, type="float32"), [0x3FC0, 0x0000], 0)
    1.5
    >>> raw_value(C(name="f", address=0, type="float32", word_order="little"), [0, 0x3FC0], 0)
    1.5
    >>> raw_value(C(name="i", address=5, type="int16", byte_order="little"), [0xFFFE], 5)
    -257.0
    >>> raw_value(C(name="b", address=0, type="bits", bit=4, bits=3), [0b1010000], 0)
    5.0
    """
    offset = ch.address - base
    if ch.table in BIT_TABLES:
        return 1.0 if data[offset] else 0.0
    words = [int(w) for w in data[offset: offset + ch.count]]
    if ch.byte_order == "little":
        words = [((w & 0xFF) << 8) | (w >> 8) for w in words]
    if ch.type in ("bits", "bool"):
        width = 1 if ch.type == "bool" else ch.bits
        return float((words[0] >> ch.bit) & ((1 << width) - 1))
    if ch.word_order == "little":
        words.reverse()
    packed = b"".join(w.to_bytes(2, "big") for w in words)
    value: float = struct.unpack(_FORMATS[ch.type], packed)[0]
    return float(value)


def decode(ch: ChannelMap, data: Sequence[int] | Sequence[bool], base: int) -> float:
    """The scaled, checked value of ``ch`` (see :func:`raw_value` for the arguments).

    Raises:
        RecordError: ``non_finite`` (NaN or infinite float, or overflow by the scale),
            ``out_of_range`` (outside the channel's ``min``/``max``).
    """
    value = raw_value(ch, data, base) * ch.scale + ch.offset
    if not math.isfinite(value):
        raise RecordError(f"channel {ch.name!r}: non-finite value {value}", reason="non_finite")
    if (ch.min is not None and value < ch.min) or (ch.max is not None and value > ch.max):
        raise RecordError(
            f"channel {ch.name!r}: {value:g} outside "
            f"[{-math.inf if ch.min is None else ch.min:g}, "
            f"{math.inf if ch.max is None else ch.max:g}]", reason="out_of_range"
        )
    return value


def encode_float32(value: float, word_order: str = "big") -> list[int]:
    """Two registers holding ``value`` as IEEE 754 float32 (for simulators and tests).

    >>> encode_float32(1.5)
    [16320, 0]
    """
    packed = struct.pack(">f", value)
    words = [int.from_bytes(packed[0:2], "big"), int.from_bytes(packed[2:4], "big")]
    return words[::-1] if word_order == "little" else words
