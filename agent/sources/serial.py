"""Serial source (pyserial): one record per line, CSV or key=value.

Framing and parsing live in :class:`LineParser`, a pure class (bytes in, records out) that is
tested without a port. Lines end in ``\\n`` or ``\\r\\n``; a line split across reads is
reassembled. Rejected lines become :class:`agent.errors.RecordError` with ``reason``:

* ``too_long``: longer than ``max_line_bytes``; the rest of it up to the next newline is dropped
  without being buffered, so memory stays bounded whatever the peer sends;
* ``not_utf8``: not valid UTF-8 (line noise, wrong baud rate);
* ``non_numeric``: a value (or, in kv, a ``key=value`` token) that is not a number;
* ``non_finite``: NaN or infinity, including overflow such as ``1e999``;
* ``field_count``: csv with the wrong number of fields;
* ``missing_channel``: kv without one of the channels (unknown keys are ignored);
* ``bad_timestamp``: the timestamp field is missing, not a number or not finite.

Blank lines are skipped silently. :class:`SerialSource` survives the port vanishing (USB adapter
unplugged): it closes, waits with :class:`agent.sources.backoff.Backoff` and reopens, reporting
each failed attempt and the recovery through :class:`agent.sources.base.ReportsStatus`.
"""

from __future__ import annotations

import contextlib
import math
import random
import re
import termios
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
from pydantic import Field, field_validator

from agent.config.base import StrictModel
from agent.errors import ConfigError, RecordError, SourceError
from agent.records import FloatArray, Reading
from agent.sources.backoff import Backoff
from agent.sources.base import Emit, Reject, SourcePlugin, StatusListener
from agent.sources.serial_line import STOPBITS, RS485Config, apply_rs485, line_settings

KIND = "serial"


class SerialConfig(StrictModel):
    """Config of the ``serial`` source."""

    kind: Literal["serial"] = Field("serial", description="Source kind.")
    port: str = Field(description="Serial device, e.g. /dev/ttyUSB0 or /dev/serial/by-id/...")
    baudrate: int = Field(115200, gt=0, description="Baud rate.")
    format: Literal["csv", "kv"] = Field(
        "csv",
        description="Line format: 'csv' (values in channel order) or 'kv' (key=value pairs "
        "separated by ',' or whitespace; keys are channel names).",
    )
    channels: list[str] = Field(min_length=1, description="Channel names, in order.")
    delimiter: str = Field(",", description="CSV field separator.")
    timestamp_field: bool = Field(
        False,
        description="csv: the first field is an epoch-seconds timestamp; kv: a 'ts' key is. "
        "Otherwise the receive time is used.",
    )
    max_line_bytes: int = Field(
        1024, ge=16, le=1_048_576, description="Longer lines are rejected and counted."
    )
    bytesize: Literal[5, 6, 7, 8] = Field(8, description="Data bits: 5, 6, 7 or 8.")
    parity: Literal["N", "E", "O", "M", "S"] = Field(
        "N", description="Parity: N (none), E (even), O (odd), M (mark) or S (space)."
    )
    stopbits: float = Field(1, description="Stop bits: 1, 1.5 or 2.")
    rtscts: bool = Field(False, description="RTS/CTS hardware flow control.")
    xonxoff: bool = Field(False, description="XON/XOFF software flow control.")
    rs485: RS485Config | None = Field(
        None, description="RS-485 half-duplex mode driven by the kernel (a [streams.source.rs485] "
        "table; unset = RS-232). Needs a port whose driver supports it (TIOCSRS485)."
    )
    read_timeout_s: float = Field(1.0, gt=0, description="pyserial read timeout in seconds.")
    reconnect_initial_s: float = Field(
        0.5, gt=0, description="First reconnect delay after the port vanishes (seconds)."
    )
    reconnect_max_s: float = Field(30.0, gt=0, description="Largest reconnect delay (seconds).")

    @field_validator("stopbits")
    @classmethod
    def _stopbits(cls, value: float) -> float:
        if value not in STOPBITS:
            raise ValueError(f"stop bits must be 1, 1.5 or 2, not {value:g}")
        return value


#: The ``serial`` kind, as the ``edge_agent.sources`` entry point names it.
PLUGIN = SourcePlugin(KIND, SerialConfig, "agent.sources.serial:SerialSource")


_KV_SPLIT = re.compile(r"[,\s]+")


@dataclass(frozen=True, slots=True)
class ParsedLine:
    """One accepted line.

    Attributes:
        ts: Epoch seconds from the line's timestamp field, or None (use the receive time).
        values: Shape ``(C,)``, float64, finite, in channel order.
    """

    ts: float | None
    values: FloatArray


class LineParser:
    """Splits a byte stream into lines and parses each into channel values (no I/O).

    Args:
        channels: Channel names, in order (C of them).
        fmt: ``csv`` (values in channel order) or ``kv`` (``key=value`` separated by ``,`` or
            whitespace).
        delimiter: csv field separator.
        timestamp_field: csv: the first field is epoch seconds; kv: the ``ts`` key is.
        max_line_bytes: Longest accepted line, excluding its terminator.

    >>> p = LineParser(["a", "b"])
    >>> p.feed(b"1.5,2")
    []
    >>> [r.values.tolist() for r in p.feed(b"\\r\\n3,4\\n")]
    [[1.5, 2.0], [3.0, 4.0]]
    >>> [e.reason for e in p.feed(b"1,x\\n1,nan\\n1\\n\\xff,1\\n")]
    ['non_numeric', 'non_finite', 'field_count', 'not_utf8']
    >>> kv = LineParser(["a", "b"], fmt="kv", timestamp_field=True)
    >>> r = kv.parse_line(b"ts=100.5 b=2 a=1 extra=9")
    >>> r.ts, r.values.tolist()
    (100.5, [1.0, 2.0])
    """

    def __init__(
        self,
        channels: list[str] | tuple[str, ...],
        fmt: Literal["csv", "kv"] = "csv",
        delimiter: str = ",",
        timestamp_field: bool = False,
        max_line_bytes: int = 1024,
    ) -> None:
        if not channels:
            raise ValueError("LineParser needs at least one channel")
        self.channels = tuple(channels)
        self.fmt = fmt
        self.delimiter = delimiter
        self.timestamp_field = timestamp_field
        self.max_line_bytes = max_line_bytes
        self._buffer = bytearray()
        self._discarding = False

    def reset(self) -> None:
        """Drop any partial line (after a reconnect, the rest of it is gone)."""
        self._buffer.clear()
        self._discarding = False

    def feed(self, data: bytes) -> list[ParsedLine | RecordError]:
        """Add bytes from the port; return the lines they complete, parsed or rejected, in order.

        The buffer never holds more than ``max_line_bytes + 1`` bytes between calls.
        """
        out: list[ParsedLine | RecordError] = []
        buf = self._buffer
        buf += data
        start = 0
        while True:
            end = buf.find(b"\n", start)
            if end < 0:
                break
            if self._discarding:
                self._discarding = False  # the tail of a line already rejected as too long
            else:
                line = bytes(buf[start:end])
                if line.endswith(b"\r"):
                    line = line[:-1]
                if len(line) > self.max_line_bytes:
                    out.append(self._too_long(len(line)))
                else:
                    try:
                        parsed = self.parse_line(line)
                    except RecordError as exc:
                        out.append(exc)
                    else:
                        if parsed is not None:
                            out.append(parsed)
            start = end + 1
        del buf[:start]
        # +1: a line of exactly max_line_bytes may still be waiting for the \n of its \r\n.
        if len(buf) > self.max_line_bytes + 1:
            if not self._discarding:
                out.append(self._too_long(len(buf)))
                self._discarding = True
            buf.clear()
        return out

    def _too_long(self, size: int) -> RecordError:
        return RecordError(
            f"line longer than {self.max_line_bytes} bytes ({size} so far)", reason="too_long"
        )

    def parse_line(self, line: bytes) -> ParsedLine | None:
        """Parse one line without its terminator.

        Returns:
            The parsed line, or None for a blank line.

        Raises:
            RecordError: With a ``reason`` from the module docstring.
        """
        try:
            text = line.decode("utf-8").strip()
        except UnicodeDecodeError as exc:
            raise RecordError(f"line is not UTF-8: {line[:32]!r}", reason="not_utf8") from exc
        if not text:
            return None
        if self.fmt == "kv":
            return self._parse_kv(text)
        return self._parse_csv(text)

    def _parse_csv(self, text: str) -> ParsedLine:
        fields = text.split(self.delimiter)
        expected = len(self.channels) + (1 if self.timestamp_field else 0)
        if len(fields) != expected:
            raise RecordError(
                f"line has {len(fields)} fields, expected {expected}: {text[:64]!r}",
                reason="field_count",
            )
        ts = _timestamp(fields[0]) if self.timestamp_field else None
        return ParsedLine(ts, _values(fields[-len(self.channels) :], text))

    def _parse_kv(self, text: str) -> ParsedLine:
        pairs: dict[str, str] = {}
        for token in _KV_SPLIT.split(text):
            if not token:
                continue
            key, sep, value = token.partition("=")
            if not sep:
                raise RecordError(f"token {token[:32]!r} is not key=value", reason="non_numeric")
            pairs[key] = value
        missing = [c for c in self.channels if c not in pairs]
        if missing:
            raise RecordError(f"line lacks channel(s) {missing}", reason="missing_channel")
        ts: float | None = None
        if self.timestamp_field:
            if "ts" not in pairs:
                raise RecordError("line lacks the 'ts' key", reason="bad_timestamp")
            ts = _timestamp(pairs["ts"])
        return ParsedLine(ts, _values([pairs[c] for c in self.channels], text))


def _timestamp(field: str) -> float:
    try:
        ts = float(field)
    except ValueError:
        raise RecordError(f"bad timestamp {field[:32]!r}", reason="bad_timestamp") from None
    if not math.isfinite(ts):
        raise RecordError(f"non-finite timestamp {field[:32]!r}", reason="bad_timestamp")
    return ts


def _values(fields: list[str], text: str) -> FloatArray:
    try:
        values = np.array([float(f) for f in fields], dtype=np.float64)
    except ValueError:
        raise RecordError(f"non-numeric value in {text[:64]!r}", reason="non_numeric") from None
    if not np.isfinite(values).all():
        raise RecordError(f"non-finite value in {text[:64]!r}", reason="non_finite")
    return values


class SerialPort(Protocol):
    """The part of ``serial.Serial`` the source uses."""

    @property
    def in_waiting(self) -> int:
        """Bytes ready to read."""
        ...

    def read(self, size: int = 1) -> bytes:
        """Read up to ``size`` bytes, waiting at most the port's timeout."""
        ...

    def close(self) -> None:
        """Close the port."""
        ...


SerialFactory = Callable[..., SerialPort]


class SerialSource:
    """Reads lines from a serial port; reconnects by itself when the port vanishes.

    ``run`` returns only when ``stop`` is set (it checks it at least once per
    ``read_timeout_s`` and wakes from a reconnect wait as soon as it is set). It never raises
    for a vanished port; it reports outages through the listener set by
    :meth:`set_status_listener`.

    Args:
        config: The ``serial`` config.
        stream: Stream name stamped on every reading.
        serial_factory: Opens a port: ``factory(port, **line_settings(config))``; default
            ``serial.serial_for_url`` (also accepts ``loop://`` and ``socket://`` URLs).
        clock: Wall clock, epoch seconds, for readings without a timestamp field.
        sleep: ``sleep(seconds)`` between reconnect attempts; default ``stop.wait``.
        monotonic: Monotonic clock in seconds for ``Reading.received_mono``.
        rng: Random source for the backoff jitter.

    Attributes:
        stream: The stream name.
        channels: The configured channel names.
    """

    def __init__(
        self,
        config: SerialConfig,
        stream: str,
        *,
        serial_factory: SerialFactory | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], object] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        import serial  # noqa: PLC0415 - lazy: pyserial loads only when a serial source is configured

        self.config = config
        self.stream = stream
        self.channels: tuple[str, ...] = tuple(config.channels)
        self._factory: SerialFactory = (
            serial_factory if serial_factory is not None else serial.serial_for_url
        )
        self._port_errors: tuple[type[BaseException], ...] = (serial.SerialException, OSError)
        self._clock = clock
        self._sleep = sleep
        self._monotonic = monotonic
        self._backoff = Backoff(
            config.reconnect_initial_s,
            max(config.reconnect_max_s, config.reconnect_initial_s),
            rng=rng,
        )
        self._parser = LineParser(
            self.channels,
            fmt=config.format,
            delimiter=config.delimiter,
            timestamp_field=config.timestamp_field,
            max_line_bytes=config.max_line_bytes,
        )
        self._listener: StatusListener | None = None

    def set_status_listener(self, listener: StatusListener | None) -> None:
        """Receive a SourceError per failed open/read and None when reading works again."""
        self._listener = listener

    def _report(self, error: SourceError | None) -> None:
        if self._listener is not None:
            self._listener(error)

    def run(self, emit: Emit, reject: Reject, stop: threading.Event) -> None:
        """Read lines until ``stop`` is set, reopening the port whenever it fails.

        Raises:
            ConfigError: When pyserial rejects the port settings (e.g. an invalid baud rate).
        """
        wait = self._sleep if self._sleep is not None else stop.wait
        while not stop.is_set():
            port = self._open()
            if port is not None:
                try:
                    self._read_until_failure(port, emit, reject, stop)
                finally:
                    _close_quietly(port)
            if not stop.is_set():
                wait(self._backoff.next_delay())

    def _open(self) -> SerialPort | None:
        cfg = self.config
        try:
            port = self._factory(cfg.port, **line_settings(cfg))
            if cfg.rs485 is not None:
                apply_rs485(port, cfg.rs485)
        except (ValueError, termios.error) as exc:  # e.g. parity on a pty: tcsetattr EINVAL
            raise ConfigError(
                f"serial port settings rejected: {exc}", stream=self.stream, port=cfg.port
            ) from exc
        except self._port_errors as exc:
            self._report(
                SourceError(f"cannot open serial port: {exc}", stream=self.stream, port=cfg.port)
            )
            return None
        self._parser.reset()
        return port

    def _read_until_failure(
        self, port: SerialPort, emit: Emit, reject: Reject, stop: threading.Event
    ) -> None:
        healthy = False
        while not stop.is_set():
            try:
                data = port.read(max(1, port.in_waiting))
            except self._port_errors as exc:
                self._report(
                    SourceError(
                        f"serial port failed: {exc}", stream=self.stream, port=self.config.port
                    )
                )
                return
            if not healthy:
                healthy = True
                self._backoff.reset()
                self._report(None)
            if not data:
                continue  # read timeout: check stop and read again
            received_mono = self._monotonic()
            now: float | None = None
            for item in self._parser.feed(data):
                if isinstance(item, RecordError):
                    reject(item)
                    continue
                ts = item.ts
                if ts is None:
                    if now is None:
                        now = self._clock()
                    ts = now
                emit(Reading(self.stream, ts, item.values, received_mono=received_mono))


def _close_quietly(port: Any) -> None:
    with contextlib.suppress(Exception):  # the port is already broken; nothing to report
        port.close()
