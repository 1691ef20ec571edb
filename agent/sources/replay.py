"""Replay source: recorded CSV files (SKAB layout or comma-separated with a named time column)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from agent.config.base import StrictModel

KIND = "replay"


class ReplayConfig(StrictModel):
    """Config of the ``replay`` source."""

    kind: Literal["replay"] = Field("replay", description="Source kind.")
    path: str = Field(description="CSV file to replay.")
    delimiter: str = Field(
        "auto", description="Field separator: 'auto' (sniff ';' or ','), ';', ',' or '\\t'."
    )
    time_column: str = Field("datetime", description="Name of the timestamp column.")
    time_format: str = Field(
        "auto",
        description="'auto' (ISO 8601 / 'YYYY-MM-DD hh:mm:ss', naive = UTC), 'epoch_s' or "
        "'epoch_ms'.",
    )
    channels: list[str] = Field(
        default_factory=list,
        description="Columns to read, in order; empty = every column except the time column and "
        "ignore_columns.",
    )
    ignore_columns: list[str] = Field(
        default_factory=lambda: ["anomaly", "changepoint"],
        description="Columns never read as channels (labels).",
    )
    speed: float = Field(
        0.0,
        ge=0.0,
        description="Replay speed: 1.0 = real time from the file's timestamps, N = N times faster, "
        "0 = as fast as possible.",
    )
    loop: bool = Field(False, description="Start again at the end of the file.")
    restamp: bool = Field(
        False,
        description="Replace file timestamps with the current time (keeps the file's spacing).",
    )
