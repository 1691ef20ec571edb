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
* ``bad_timestamp``: the timestamp field is missing, not a number or not finite;
* ``stale_partial``: a partial line whose last byte came more than ``inter_byte_timeout_s``
  ago (the device paused or restarted mid-line): it is discarded rather than joined to bytes
  that arrive much later, which would make one reading of two unrelated halves.

Blank lines are skipped silently. :class:`SerialSource` survives the port vanishing (USB adapter
unplugged): it closes, waits with :class:`agent.sources.backoff.Backoff` and reopens, reporting
each failed attempt and the recovery through :class:`agent.sources.base.ReportsStatus`.
"""

from __future__ import annotations

import contextlib
import random
import termios
import threading
import time
from collections.abc import Callable
from typing import Any, Literal, Protocol

from pydantic import Field, field_validator

from agent.config.base import StrictModel
from agent.errors import ConfigError, RecordError, SourceError
from agent.records import Reading
from agent.sources.backoff import Backoff
from agent.sources.base import Emit, Reject, SourcePlugin, StatusListener
from agent.sources.lines import LineParser, ParsedLine
from agent.sources.serial_line import (
    STOPBITS,
    RS485Config,
    apply_rs485,
    describe_line,
    line_settings,
)

__all__ = ["KIND", "LineParser", "ParsedLine", "SerialConfig", "SerialSource"]

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
    inter_byte_timeout_s: float = Field(
        3.0,
        gt=0,
        description="A partial line whose last byte is older than this (seconds) is discarded "
        "and counted (reason stale_partial) instead of being joined to later bytes.",
    )
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
            inter_byte_timeout_s=config.inter_byte_timeout_s,
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
                f"serial port settings rejected ({_settings_text(cfg)}): {exc}",
                stream=self.stream, port=cfg.port
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
            if not data:  # read timeout: drop a stale partial line, check stop, read again
                stale = self._parser.expire(self._monotonic())
                if stale is not None:
                    reject(stale)
                continue
            received_mono = self._monotonic()
            now: float | None = None
            for item in self._parser.feed(data, received_mono):
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


def _settings_text(cfg: SerialConfig) -> str:
    text = describe_line(cfg.baudrate, cfg.bytesize, cfg.parity, cfg.stopbits, cfg.rtscts,
                         cfg.xonxoff)
    return text + (" rs485" if cfg.rs485 is not None else "")

