"""Config of the ``modbus`` source: connection (TCP or RTU), poll interval and register map.

TOML shape::

    [streams.source]
    kind = "modbus"
    transport = "tcp"                 # or "rtu" (a serial line: serial_port, baudrate, parity ...)
    host = "192.168.10.20"
    port = 502
    poll_interval_s = 0.1
    [[streams.source.channels]]       # one per channel, in the stream's channel order
    name = "Pressure"
    unit = 1                          # Modbus unit (slave) id
    table = "holding"                 # holding, input, coil, discrete_input
    address = 0                       # 0-based protocol address
    type = "float32"                  # int16 uint16 int32 uint32 float32 float64 bool bits
    word_order = "big"                # multi-register types: which register holds the high word
    scale = 1.0                       # value = raw * scale + offset
    offset = 0.0
    min = 0.0                         # optional valid range: readings outside are rejected
    max = 10.0

The map is checked as a whole: two channels that overlap in the same unit and table must
describe the same register(s) the same way (bit fields of one register may share it), a
multi-register value at an odd address needs its ``word_order`` declared (an odd offset is the
usual sign of 1-based addresses copied from a manual), nothing may run past address 65535.
Every problem is reported at its key path (``streams[0].source.channels[2].address``).
Register and bit layouts: Modbus Application Protocol Specification V1.1b3, sections 4.3
(data model) and 6.1-6.4 (read functions, at most 125 registers / 2000 bits per request).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from agent.config.base import StrictModel
from agent.sources.base import SourcePlugin

KIND = "modbus"

Table = Literal["holding", "input", "coil", "discrete_input"]
ValueType = Literal["int16", "uint16", "int32", "uint32", "float32", "float64", "bool", "bits"]

#: Registers per value, by type (``bool`` and ``bits`` on a register table use one register).
REGISTERS: dict[str, int] = {
    "int16": 1, "uint16": 1, "int32": 2, "uint32": 2, "float32": 2, "float64": 4,
    "bool": 1, "bits": 1,
}

#: Protocol limits per read request (spec 6.1-6.4): registers, and coils/discrete inputs.
MAX_REGISTERS_PER_READ = 125
MAX_BITS_PER_READ = 2000

BIT_TABLES = ("coil", "discrete_input")


class ChannelMap(StrictModel):
    """Where one channel's value lives and how to decode it."""

    name: str = Field(min_length=1, max_length=128, description="Channel name.")
    unit: int = Field(1, ge=0, le=255, description="Modbus unit (slave) id, 0-255.")
    table: Table = Field(
        "holding", description="holding, input (16-bit registers), coil or discrete_input (bits)."
    )
    address: int = Field(ge=0, le=65535, description="0-based protocol address of the value.")
    type: ValueType = Field(
        "uint16",
        description="int16, uint16, int32, uint32, float32, float64 (IEEE 754), bool, or bits "
        "(a bit field of one register: bit, bits). coil and discrete_input are always bool "
        "(the default there).",
    )
    word_order: Literal["big", "little"] | None = Field(
        None,
        description="Multi-register types: 'big' = the first register holds the most "
        "significant word (the Modbus convention, used when unset at an even address), "
        "'little' = the first register holds the least significant word.",
    )
    byte_order: Literal["big", "little"] = Field(
        "big", description="Byte order inside each register: 'big' (the Modbus convention) or "
        "'little' (byte-swapped devices)."
    )
    bit: int = Field(
        0, ge=0, le=15, description="bits and bool on a register: lowest bit of the field, 0-15."
    )
    bits: int = Field(1, ge=1, le=16, description="bits: width of the field in bits, 1-16.")
    scale: float = Field(1.0, description="value = raw x scale + offset.")
    offset: float = Field(0.0, description="Added after scale.")
    min: float | None = Field(
        None, examples=[0.0], description="Smallest valid value (after scale and offset); "
        "smaller readings are rejected (out_of_range)."
    )
    max: float | None = Field(
        None, examples=[100.0], description="Largest valid value (after scale and offset)."
    )

    @model_validator(mode="before")
    @classmethod
    def _bits_are_bool(cls, data: object) -> object:
        """A coil or discrete input without a ``type`` is a bool (not the registers' uint16)."""
        if isinstance(data, dict) and data.get("table") in BIT_TABLES and "type" not in data:
            return {**data, "type": "bool"}
        return data

    @property
    def count(self) -> int:
        """Registers (or bits, on a bit table) the value occupies."""
        return 1 if self.table in BIT_TABLES else REGISTERS[self.type]

    @property
    def end(self) -> int:
        """One past the last address occupied."""
        return self.address + self.count

    def layout(self) -> tuple[object, ...]:
        """What makes two readings of one register the same decoding."""
        return (self.type, self.word_order or "big", self.byte_order)


def _problem(loc: tuple[str | int, ...], message: str, value: object) -> InitErrorDetails:
    return InitErrorDetails(
        type=PydanticCustomError("modbus_map", message), loc=loc, input=value
    )


class ModbusConfig(StrictModel):
    """Config of the ``modbus`` source: Modbus TCP or RTU polling of a register map."""

    kind: Literal["modbus"] = Field("modbus", description="Source kind.")
    transport: Literal["tcp", "rtu"] = Field(
        "tcp", description="'tcp' (Modbus TCP: host, port) or 'rtu' (a serial line: "
        "serial_port, baudrate, parity, stopbits, bytesize)."
    )
    host: str = Field("127.0.0.1", min_length=1, description="tcp: the device's address.")
    port: int = Field(502, ge=1, le=65535, description="tcp: the device's TCP port.")
    serial_port: str | None = Field(
        None, examples=["/dev/ttyUSB0"], description="rtu: serial device (or a pyserial URL)."
    )
    baudrate: int = Field(19200, gt=0, description="rtu: baud rate.")
    parity: Literal["N", "E", "O"] = Field(
        "E", description="rtu: parity N (none), E (even; the Modbus default) or O (odd)."
    )
    stopbits: Literal[1, 2] = Field(1, description="rtu: stop bits, 1 or 2.")
    bytesize: Literal[7, 8] = Field(8, description="rtu: data bits, 7 or 8.")
    poll_interval_s: float = Field(
        1.0, gt=0.0, le=3600.0, description="Seconds between polls (one reading per poll)."
    )
    timeout_s: float = Field(
        0.5, gt=0.0, le=60.0, description="Seconds to wait for each response."
    )
    retries: int = Field(
        0, ge=0, le=10, description="Resends of a request that got no response in timeout_s."
    )
    late_answer_s: float | None = Field(
        None, gt=0.0, le=600.0, description="rtu: how long after a timeout the device may "
        "still answer. Nothing else is sent on the line until that answer came or this passed "
        "(RTU frames carry no transaction id); default 4 x timeout_s."
    )
    reconnect_after_timeouts: int = Field(
        3, ge=1, description="Consecutive polls without any response after which the "
        "connection counts as lost: closed, and reopened with backoff."
    )
    max_gap: int = Field(
        8, ge=0, le=124, description="Unused registers (or bits) one read may span to join two "
        "channels into one request; 0 = only contiguous addresses."
    )
    max_registers_per_read: int = Field(
        MAX_REGISTERS_PER_READ, ge=1, le=MAX_REGISTERS_PER_READ,
        description="Registers per read request (the protocol allows 125; some devices less).",
    )
    max_bits_per_read: int = Field(
        MAX_BITS_PER_READ, ge=1, le=MAX_BITS_PER_READ,
        description="Coils or discrete inputs per read request (the protocol allows 2000).",
    )
    reconnect_initial_s: float = Field(
        0.5, gt=0, description="First reconnect delay after the connection is lost (seconds)."
    )
    reconnect_max_s: float = Field(30.0, gt=0, description="Largest reconnect delay (seconds).")
    channels: list[ChannelMap] = Field(
        min_length=1, description="The register map: one table per channel, in channel order."
    )

    @property
    def late_answer_bound_s(self) -> float:
        """``late_answer_s``, or its default of 4 x ``timeout_s``."""
        return self.late_answer_s if self.late_answer_s is not None else 4 * self.timeout_s

    def channel_names(self) -> list[str]:
        """The channel names of the map, in order."""
        return [ch.name for ch in self.channels]

    @model_validator(mode="after")
    def _possible_map(self) -> ModbusConfig:
        problems = map_problems(self.channels)
        if self.transport == "rtu" and self.serial_port is None:
            problems.append(_problem(("serial_port",), "transport 'rtu' needs a serial_port",
                                     None))
        if problems:
            raise ValidationError.from_exception_data("ModbusConfig", problems)
        return self


def map_problems(channels: list[ChannelMap]) -> list[InitErrorDetails]:
    """Every impossible entry of a register map, located under ``channels[i]``."""
    problems: list[InitErrorDetails] = []
    seen: dict[str, int] = {}
    for i, ch in enumerate(channels):
        loc: tuple[str | int, ...] = ("channels", i)
        if ch.name in seen:
            problems.append(_problem((*loc, "name"), f"duplicate channel name {ch.name!r} "
                                     f"(also channels[{seen[ch.name]}])", ch.name))
        seen.setdefault(ch.name, i)
        if ch.table in BIT_TABLES and ch.type != "bool":
            problems.append(_problem((*loc, "type"), f"a {ch.table} is one bit: type must be "
                                     "'bool'", ch.type))
        if ch.end > 65536:
            problems.append(_problem((*loc, "address"), f"{ch.type} at {ch.address} runs past "
                                     "address 65535", ch.address))
        if ch.count > 1 and ch.address % 2 == 1 and ch.word_order is None:
            problems.append(_problem(
                (*loc, "word_order"), f"{ch.type} at odd address {ch.address} with no "
                "word_order: declare word_order = 'big' or 'little' (or check for 1-based "
                "addresses: the protocol address is the manual's register number - 1)", None))
        if ch.type == "bits" and ch.bit + ch.bits > 16:
            problems.append(_problem((*loc, "bits"), f"bit field {ch.bit}+{ch.bits} does not "
                                     "fit a 16-bit register", ch.bits))
        if ch.scale == 0.0:
            problems.append(_problem((*loc, "scale"), "scale 0 makes every value the offset",
                                     ch.scale))
        if ch.min is not None and ch.max is not None and ch.min > ch.max:
            problems.append(_problem((*loc, "min"), f"min {ch.min} > max {ch.max}", ch.min))
    problems.extend(_overlaps(channels))
    return problems


def _overlaps(channels: list[ChannelMap]) -> list[InitErrorDetails]:
    """Channels of one unit and table that share addresses but decode them differently."""
    problems: list[InitErrorDetails] = []
    by_area: dict[tuple[int, str], list[int]] = {}
    for i, ch in enumerate(channels):
        by_area.setdefault((ch.unit, ch.table), []).append(i)
    for indices in by_area.values():
        ordered = sorted(indices, key=lambda i: (channels[i].address, i))
        for pos, i in enumerate(ordered):
            a = channels[i]
            for j in ordered[pos + 1:]:
                b = channels[j]
                if b.address >= a.end:
                    break
                if _compatible(a, b):
                    continue
                problems.append(_problem(
                    ("channels", max(i, j), "address"),
                    f"{b.name!r} ({b.type} at {b.address}) overlaps {a.name!r} ({a.type} at "
                    f"{a.address}) in unit {a.unit} {a.table} with a different type or order",
                    channels[max(i, j)].address))
    return problems


def _compatible(a: ChannelMap, b: ChannelMap) -> bool:
    """Two overlapping channels that may share: the same value, or bit fields of one register."""
    if a.table in BIT_TABLES:
        return True  # the same coil read twice
    bit_kinds = ("bits", "bool")
    if a.type in bit_kinds and b.type in bit_kinds:
        return a.byte_order == b.byte_order  # fields of one register (overlapping bits allowed)
    return a.address == b.address and a.layout() == b.layout()


#: The ``modbus`` kind, as the ``edge_agent.sources`` entry point names it.
PLUGIN = SourcePlugin(KIND, ModbusConfig, "agent.sources.modbus:ModbusSource")
