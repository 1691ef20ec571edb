"""Serial source (pyserial): one record per line, CSV or key=value."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from agent.config.base import StrictModel

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
    read_timeout_s: float = Field(1.0, gt=0, description="pyserial read timeout in seconds.")
    reconnect_initial_s: float = Field(
        0.5, gt=0, description="First reconnect delay after the port vanishes (seconds)."
    )
    reconnect_max_s: float = Field(30.0, gt=0, description="Largest reconnect delay (seconds).")
