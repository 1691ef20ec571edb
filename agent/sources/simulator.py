"""Simulator source: a synthetic multichannel machine signal with injectable faults (demo)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from agent.config.base import StrictModel

KIND = "simulator"


class FaultConfig(StrictModel):
    """One injected fault: from ``start_s`` for ``duration_s`` seconds of simulated time."""

    kind: Literal["spike", "drift", "noise", "stuck", "offset"] = Field(
        description="Fault shape."
    )
    channel: str = Field(description="Channel the fault hits.")
    start_s: float = Field(ge=0, description="Start, seconds after the source starts.")
    duration_s: float = Field(gt=0, description="Length in seconds.")
    magnitude: float = Field(3.0, description="Size in units of the channel's noise std.")


class SimulatorConfig(StrictModel):
    """Config of the ``simulator`` source."""

    kind: Literal["simulator"] = Field("simulator", description="Source kind.")
    channels: list[str] = Field(
        default_factory=lambda: [
            "Accelerometer1RMS",
            "Accelerometer2RMS",
            "Current",
            "Pressure",
            "Temperature",
            "Thermocouple",
            "Voltage",
            "Volume Flow RateRMS",
        ],
        min_length=1,
        description="Channel names (defaults match the SKAB pump so the shipped model applies).",
    )
    sample_rate_hz: float = Field(1.0, gt=0, description="Samples per simulated second.")
    speed: float = Field(
        20.0, ge=0, description="Simulated seconds per wall second; 0 = as fast as possible."
    )
    seed: int = Field(0, description="Random seed (same seed, same signal).")
    faults: list[FaultConfig] = Field(default_factory=list, description="Injected faults.")
    duration_s: float = Field(
        0.0, ge=0, description="Stop after this much simulated time; 0 = run forever."
    )
