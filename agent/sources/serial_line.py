"""Serial line settings of the ``serial`` source: framing, flow control, RS-485 (pyserial).

pyserial takes byte size, parity, stop bits and flow control as ``serial_for_url`` keyword
arguments (:func:`line_settings`); RS-485 half-duplex direction control is a property of the
open port, ``rs485_mode = serial.rs485.RS485Settings(...)``, which the kernel driver must
support (Linux ``TIOCSRS485``; :func:`apply_rs485`). A port that refuses a setting (parity on a
pseudo-terminal, RS-485 on an RS-232 adapter) is a configuration problem of the stream.
"""

from __future__ import annotations

import contextlib
from typing import Protocol

from pydantic import Field

from agent.config.base import StrictModel


class LineConfig(Protocol):
    """The fields of a ``serial`` source config :func:`line_settings` reads
    (:class:`agent.sources.serial.SerialConfig`, which imports this module)."""

    @property
    def baudrate(self) -> int: ...

    @property
    def read_timeout_s(self) -> float: ...

    @property
    def bytesize(self) -> int: ...

    @property
    def parity(self) -> str: ...

    @property
    def stopbits(self) -> float: ...

    @property
    def rtscts(self) -> bool: ...

    @property
    def xonxoff(self) -> bool: ...


#: Stop bits pyserial accepts.
STOPBITS = (1, 1.5, 2)


class RS485Config(StrictModel):
    """RS-485 mode of a serial port (pyserial's ``serial.rs485.RS485Settings``)."""

    rts_level_for_tx: bool = Field(True, description="RTS level while sending.")
    rts_level_for_rx: bool = Field(False, description="RTS level while receiving.")
    loopback: bool = Field(False, description="Receive what is sent (if the driver can).")
    delay_before_tx_s: float | None = Field(
        None, ge=0, examples=[0.001], description="Seconds between RTS switch and sending."
    )
    delay_before_rx_s: float | None = Field(
        None, ge=0, examples=[0.001], description="Seconds between sending and RTS switch back."
    )


def line_settings(cfg: LineConfig) -> dict[str, object]:
    """The pyserial keyword arguments of ``cfg``'s line settings.

    >>> from agent.sources.serial import SerialConfig
    >>> line_settings(SerialConfig(port="loop://", channels=["a"], parity="E", stopbits=2))
    ... # doctest: +NORMALIZE_WHITESPACE
    {'baudrate': 115200, 'timeout': 1.0, 'bytesize': 8, 'parity': 'E', 'stopbits': 2,
     'rtscts': False, 'xonxoff': False}
    """
    return {"baudrate": cfg.baudrate, "timeout": cfg.read_timeout_s, "bytesize": cfg.bytesize,
            "parity": cfg.parity,
            "stopbits": int(cfg.stopbits) if float(cfg.stopbits).is_integer() else cfg.stopbits,
            "rtscts": cfg.rtscts,
            "xonxoff": cfg.xonxoff}


def apply_rs485(port: object, cfg: RS485Config) -> None:
    """Switch an open pyserial port to RS-485 mode.

    Raises:
        ValueError: The driver does not support RS-485 (pyserial: "Failed to set RS485 mode").
    """
    import serial.rs485  # noqa: PLC0415 - lazy, like pyserial itself

    try:
        port.rs485_mode = serial.rs485.RS485Settings(  # type: ignore[attr-defined]
            rts_level_for_tx=cfg.rts_level_for_tx, rts_level_for_rx=cfg.rts_level_for_rx,
            loopback=cfg.loopback, delay_before_tx=cfg.delay_before_tx_s,
            delay_before_rx=cfg.delay_before_rx_s)
    except (ValueError, OSError) as exc:
        with contextlib.suppress(Exception):  # closed: the port is unusable as configured
            port.close()  # type: ignore[attr-defined]
        raise ValueError(f"RS-485 mode not supported by this port: {exc}") from exc


def describe_line(baudrate: int, bytesize: int, parity: str, stopbits: float,
                  rtscts: bool = False, xonxoff: bool = False) -> str:
    """The line settings in the usual short form, for error messages.

    >>> describe_line(19200, 8, "E", 1, rtscts=True)
    '19200 8E1 rtscts'
    """
    stop = int(stopbits) if float(stopbits).is_integer() else stopbits
    flow = [name for name, on in (("rtscts", rtscts), ("xonxoff", xonxoff)) if on]
    return " ".join([f"{baudrate} {bytesize}{parity}{stop}", *flow])

