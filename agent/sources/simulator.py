"""Simulator source: a synthetic multichannel machine signal with injectable faults (demo).

Each channel ``c`` at simulated time ``t`` (seconds from the start, sample ``k``, ``t = k / fs``)::

    x_c(t) = level_c + load_gain_c * load(t) + amp_c * sin(2 pi t / period_c + phase_c)
             + std_c * (rho_c * common_k + sqrt(1 - rho_c**2) * e_ck)

``load(t)`` in [0, 1] is the pump's duty cycle (:func:`duty_load`: a square wave with smooth
edges, on for two thirds of a 120 s period), ``common_k`` an AR(1) process (phi = 0.9) shared by
all channels (so the noise is correlated, as on a real pump) and ``e_ck`` white noise, all
standard normal. The
defaults of :data:`PUMP_CHANNELS` resemble the SKAB water-pump test bed. A channel name not in
that table gets a neutral model (level 1, std 0.05).

Faults (:class:`FaultConfig`), with ``m = magnitude * std_c`` and ``u`` the fraction of the fault
elapsed: ``spike`` adds ``m`` on the first sample and on a random quarter of the others;
``drift`` adds ``m * u``; ``noise`` adds ``m * N(0, 1)``; ``stuck`` holds the value the channel
had when the fault began; ``offset`` adds ``m``. Faults draw from their own random generator, so
adding a fault changes nothing outside its channel and interval.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import Field

from agent.config.base import StrictModel
from agent.errors import ConfigError, SourceExhausted
from agent.records import FloatArray, Reading
from agent.sources.base import Emit, Reject, SourcePlugin, WaitListener, paced_wait

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


#: The ``simulator`` kind, as the ``edge_agent.sources`` entry point names it.
PLUGIN = SourcePlugin(KIND, SimulatorConfig, "agent.sources.simulator:SimulatorSource")


@dataclass(frozen=True, slots=True)
class ChannelModel:
    """Generative parameters of one simulated channel (in the channel's units).

    Attributes:
        level: Baseline with the pump off (load 0).
        noise_std: Standard deviation of the noise term; faults are sized in these units.
        amplitude: Amplitude of the slow periodic component.
        period_s: Its period in simulated seconds.
        load_gain: Added at full load (duty cycle on).
        correlation: Share ``rho`` of the noise that is common to all channels, in [0, 1].
    """

    level: float
    noise_std: float
    amplitude: float = 0.0
    period_s: float = 600.0
    load_gain: float = 0.0
    correlation: float = 0.3


#: SKAB-like defaults: load averages 2/3, so e.g. Current averages 0.5 + 2.1 * 2/3 = 1.9 A.
PUMP_CHANNELS: dict[str, ChannelModel] = {
    "Accelerometer1RMS": ChannelModel(0.205, 0.004, 0.002, 900.0, 0.008, 0.6),  # g
    "Accelerometer2RMS": ChannelModel(0.265, 0.004, 0.002, 900.0, 0.006, 0.6),  # g
    "Current": ChannelModel(0.5, 0.05, 0.02, 300.0, 2.1, 0.4),  # A, duty cycles 0.5..2.6
    "Pressure": ChannelModel(0.2, 0.03, 0.02, 300.0, 0.07, 0.4),  # bar
    "Temperature": ChannelModel(80.0, 0.05, 0.05, 3600.0, 0.0, 0.1),  # degC, slow drift
    "Thermocouple": ChannelModel(28.0, 0.05, 0.03, 1800.0, 0.0, 0.1),  # degC
    "Voltage": ChannelModel(230.0, 1.5, 1.0, 240.0, -1.0, 0.2),  # V, sags a little under load
    "Volume Flow RateRMS": ChannelModel(31.0, 0.3, 0.2, 300.0, 1.5, 0.5),  # l/min
}
DEFAULT_CHANNEL = ChannelModel(1.0, 0.05, 0.02, 600.0, 0.0, 0.3)

_DUTY_PERIOD_S = 120.0
_EDGE_SHARPNESS = 8.0
_AR_PHI = 0.9
_SPIKE_PROBABILITY = 0.25


def duty_load(t: float) -> float:
    """Pump load in [0, 1] at simulated time ``t`` seconds: on for 2/3 of each 120 s period.

    A smoothed square wave: ``0.5 * (1 + tanh(8 * (sin(2 pi t / 120) + 0.5)))``; ``sin > -0.5``
    holds for two thirds of each period.

    >>> round(duty_load(30.0), 3), round(duty_load(90.0), 3)
    (1.0, 0.0)
    """
    return 0.5 * (
        1.0 + math.tanh(_EDGE_SHARPNESS * (math.sin(2 * math.pi * t / _DUTY_PERIOD_S) + 0.5))
    )


class SimulatorSource:
    """Generates a pump-like multichannel signal with the configured faults.

    Args:
        config: The ``simulator`` config.
        stream: Stream name stamped on every reading.
        clock: Wall clock, epoch seconds; the first reading is stamped ``clock()`` at the start
            of :meth:`run` and each next one ``1 / sample_rate_hz`` later.
        sleep: ``sleep(seconds)`` used for pacing; default ``stop.wait``.
        monotonic: Monotonic clock in seconds (pacing and ``Reading.received_mono``).

    Attributes:
        stream: The stream name.
        channels: The configured channel names.
        noise_std: Shape ``(C,)``, float64: each channel's noise std (the unit of fault sizes).

    Raises:
        ConfigError: When a fault names a channel that is not simulated.
    """

    def __init__(
        self,
        config: SimulatorConfig,
        stream: str,
        *,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], object] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.stream = stream
        self.channels: tuple[str, ...] = tuple(config.channels)
        unknown = sorted({f.channel for f in config.faults} - set(self.channels))
        if unknown:
            raise ConfigError(
                f"simulator faults name unknown channel(s) {unknown}; channels: "
                f"{list(self.channels)}",
                stream=stream,
            )
        self._clock = clock
        self._sleep = sleep
        self._monotonic = monotonic
        self._wait_listener: WaitListener | None = None
        models = [PUMP_CHANNELS.get(name, DEFAULT_CHANNEL) for name in self.channels]
        self._level = np.array([m.level for m in models])
        self.noise_std: FloatArray = np.array([m.noise_std for m in models])
        self._amplitude = np.array([m.amplitude for m in models])
        self._omega = np.array([2 * math.pi / m.period_s for m in models])
        self._load_gain = np.array([m.load_gain for m in models])
        rho = np.array([m.correlation for m in models])
        self._rho = rho
        self._own = np.sqrt(1.0 - rho**2)
        self._fault_index = [self.channels.index(f.channel) for f in config.faults]

    def set_wait_listener(self, listener: WaitListener | None) -> None:
        """Announce each pacing wait (a slow sample rate is no stall):
        :class:`agent.sources.base.ReportsWaits`."""
        self._wait_listener = listener

    def run(self, emit: Emit, reject: Reject, stop: threading.Event) -> None:
        """Generate readings until ``stop`` is set or ``duration_s`` of simulated time has passed.

        Raises:
            SourceExhausted: After ``duration_s`` simulated seconds (never when it is 0).
        """
        cfg = self.config
        wait = self._sleep if self._sleep is not None else stop.wait
        rng = np.random.default_rng(cfg.seed)
        fault_rng = np.random.default_rng([cfg.seed, 1])
        n_channels = len(self.channels)
        phase = rng.uniform(0.0, 2 * math.pi, n_channels)
        stuck: dict[int, float] = {}
        common = 0.0
        dt = 1.0 / cfg.sample_rate_hz
        start_wall = self._clock()
        start_mono = self._monotonic()
        k = 0
        while not stop.is_set():
            t = k * dt
            if cfg.duration_s and t >= cfg.duration_s:
                raise SourceExhausted(
                    "simulation ended", stream=self.stream, duration_s=cfg.duration_s, readings=k
                )
            noise = rng.standard_normal(n_channels + 1)
            common = _AR_PHI * common + math.sqrt(1 - _AR_PHI**2) * noise[0]
            values = (
                self._level
                + self._load_gain * duty_load(t)
                + self._amplitude * np.sin(self._omega * t + phase)
                + self.noise_std * (self._rho * common + self._own * noise[1:])
            )
            for n, (fault, ch) in enumerate(zip(cfg.faults, self._fault_index, strict=True)):
                if fault.start_s <= t < fault.start_s + fault.duration_s:
                    values[ch] = self._apply_fault(
                        fault, value=values[ch], ch=ch, t=t, n=n, stuck=stuck, rng=fault_rng
                    )
                else:
                    stuck.pop(n, None)
            if cfg.speed > 0.0:
                now = self._monotonic()
                delay = start_mono + t / cfg.speed - now
                if delay > 0.0:
                    paced_wait(wait, delay, now, self._wait_listener)
                    if stop.is_set():
                        return
            emit(Reading(self.stream, start_wall + t, values, received_mono=self._monotonic()))
            k += 1

    def _apply_fault(
        self,
        fault: FaultConfig,
        *,
        value: float,
        ch: int,
        t: float,
        n: int,
        stuck: dict[int, float],
        rng: np.random.Generator,
    ) -> float:
        m = fault.magnitude * float(self.noise_std[ch])
        if fault.kind == "spike":
            first = n not in stuck
            stuck[n] = value  # marks "started"; the held value is unused for spikes
            return value + m if first or rng.random() < _SPIKE_PROBABILITY else value
        if fault.kind == "drift":
            return value + m * (t - fault.start_s) / fault.duration_s
        if fault.kind == "noise":
            return value + m * float(rng.standard_normal())
        if fault.kind == "stuck":
            return stuck.setdefault(n, value)
        return value + m  # offset
