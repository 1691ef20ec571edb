"""Sparkplug B payloads written and read byte by byte, for a test publisher that shares nothing
with the agent's own schema (:mod:`agent.sparkplug_b`).

The agent describes the payload with a protobuf descriptor of its own; a test that encoded
with the same descriptor would agree with it even if a field number were wrong on both sides.
Here every field is written as protobuf wire format by hand (Protocol Buffers encoding guide:
varint keys ``field << 3 | wire type``; 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32),
with the field numbers of the Sparkplug B specification's ``sparkplug_b.proto`` (Sparkplug 3.0
§6.4 and its appendix; proto2, package ``org.eclipse.tahu.protobuf``):

``Payload``: timestamp 1 (uint64), metrics 2 (Metric), seq 3 (uint64).
``Metric``: name 1 (string), alias 2 (uint64), timestamp 3 (uint64), datatype 4 (uint32),
is_null 7 (bool), int_value 10 (uint32), long_value 11 (uint64), float_value 12 (float),
double_value 13 (double), boolean_value 14 (bool), string_value 15 (string).
Datatypes (§6.4.16): Int32 3, Int64 4, UInt64 8, Float 9, Double 10, Boolean 11, String 12;
signed integers travel as the unsigned two's complement of their width.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

INT32, INT64, UINT64, FLOAT, DOUBLE, BOOLEAN, STRING = 3, 4, 8, 9, 10, 11, 12


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _key(field: int, wire: int) -> bytes:
    return varint(field << 3 | wire)


def _len(field: int, data: bytes) -> bytes:
    return _key(field, 2) + varint(len(data)) + data


@dataclass
class Metric:
    """One metric: ``name`` only in births, ``alias`` always (None = no alias)."""

    datatype: int
    value: Any
    name: str | None = None
    alias: int | None = None
    timestamp: int | None = None

    def encode(self) -> bytes:
        out = b""
        if self.name is not None:
            out += _len(1, self.name.encode())
        if self.alias is not None:
            out += _key(2, 0) + varint(self.alias)
        if self.timestamp is not None:
            out += _key(3, 0) + varint(self.timestamp)
        out += _key(4, 0) + varint(self.datatype)
        if self.datatype in (INT32,):
            out += _key(10, 0) + varint(int(self.value) & 0xFFFFFFFF)
        elif self.datatype in (INT64, UINT64):
            out += _key(11, 0) + varint(int(self.value) & 0xFFFFFFFFFFFFFFFF)
        elif self.datatype == FLOAT:
            out += _key(12, 5) + struct.pack("<f", self.value)
        elif self.datatype == DOUBLE:
            out += _key(13, 1) + struct.pack("<d", self.value)
        elif self.datatype == BOOLEAN:
            out += _key(14, 0) + varint(1 if self.value else 0)
        elif self.datatype == STRING:
            out += _len(15, str(self.value).encode())
        else:
            raise ValueError(f"datatype {self.datatype} not written by this test encoder")
        return out


def payload(timestamp: int, seq: int | None, metrics: list[Metric]) -> bytes:
    """A Payload: timestamp, metrics, seq (NBIRTH seq 0, then 1..255, wrapping)."""
    out = _key(1, 0) + varint(timestamp)
    for m in metrics:
        out += _len(2, m.encode())
    if seq is not None:
        out += _key(3, 0) + varint(seq)
    return out


def fields(data: bytes) -> list[tuple[int, Any]]:
    """The (field number, value) pairs of one message: ints for varints, bytes otherwise."""
    out: list[tuple[int, Any]] = []
    i = 0

    def read_varint() -> int:
        nonlocal i
        n = shift = 0
        while True:
            b = data[i]
            i += 1
            n |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return n

    while i < len(data):
        key = read_varint()
        field, wire = key >> 3, key & 7
        if wire == 0:
            out.append((field, read_varint()))
        elif wire == 1:
            out.append((field, data[i: i + 8]))
            i += 8
        elif wire == 5:
            out.append((field, data[i: i + 4]))
            i += 4
        elif wire == 2:
            n = read_varint()
            out.append((field, data[i: i + n]))
            i += n
        else:
            raise ValueError(f"wire type {wire}")
    return out


def metrics_of(data: bytes) -> list[dict[int, Any]]:
    """Each metric of a Payload as {field number: value}."""
    return [dict(fields(raw)) for f, raw in fields(data) if f == 2]
