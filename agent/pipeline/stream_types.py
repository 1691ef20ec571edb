"""What a stream's pipeline (:mod:`agent.pipeline.stream`) hands out: alert events, the output
of one block of readings, and the protocol of an observer of scored batches. Re-exported by
:mod:`agent.pipeline.stream`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from agent.pipeline.detector import Calibration
from agent.pipeline.episodes import Transition
from agent.pipeline.timeline import ClockStep
from agent.records import (
    Aggregate,
    Explanation,
    Float32Array,
    FloatArray,
    Frame,
    FrameOrigin,
    TopChannel,
)


class BatchObserver(Protocol):
    """Sees every scored batch of a stream (called in the pipeline's thread; must be quick)."""

    def observe(self, windows: Float32Array, scores: FloatArray, threshold: float) -> None:
        """Args: ``windows`` ``(K, W, C)`` raw; ``scores`` ``(K,)``; the threshold in force."""
        ...


@dataclass(frozen=True, slots=True)
class AlertEvent:
    """An alert decided by the rules, before the store gives it a sequence number.

    Attributes:
        stream: Stream name.
        score: Score of the triggering window.
        threshold: Threshold in force.
        window_start: First sample time of the window, epoch s UTC.
        window_end: Last sample time of the window, epoch s UTC.
        top_channels: Largest contributors first.
        received_mono: Monotonic receive time of the window's newest reading (0 if unknown).
        origin: A recorded camera input's file (and video frame) of the alerting frame; None
            for sensor streams and live cameras.
        explanation: Expected value and deviation (univariate streams,
            :mod:`agent.pipeline.univariate`); None otherwise.
        frame: The alerting frame of a camera stream (its snapshot is made from it); None
            for sensor streams.
        kind: The episode event (:mod:`agent.pipeline.episodes`): ``raised``, ``updated``
            or ``cleared``; the window fields are those of the window that made it.
        peak_score: The episode's largest score so far (``updated`` and ``cleared``).
        reason: Why a ``cleared`` event ended its episode: ``recovered`` (the hysteresis)
            or ``end_of_input`` (a recorded input ended with the episode open); None for the
            other events.
    """

    stream: str
    score: float
    threshold: float
    window_start: float
    window_end: float
    top_channels: tuple[TopChannel, ...]
    received_mono: float
    origin: FrameOrigin | None = None
    explanation: Explanation | None = None
    frame: Frame | None = field(default=None, repr=False, compare=False)
    kind: Transition = "raised"
    peak_score: float | None = None
    reason: str | None = None


@dataclass(slots=True)
class StreamOutput:
    """What one ``process_block`` call produced.

    Attributes:
        end_index: Shape ``(K,)``, index in the block of each window's last sample.
        scores: Shape ``(K,)``, float64; NaN for windows inside the calibration period.
        threshold: Threshold in force at the end of the block (NaN while calibrating).
        alerts: Alerts raised (the ``raised`` events of :attr:`events`).
        events: Every episode event (``raised``, ``updated``, ``cleared``), in window order.
        aggregates: Intervals closed.
        calibrated: A calibration finished during this block.
        calibration_outliers: Far-out readings left out of that calibration.
        nonfinite_scores: Windows whose score was not finite (scored :data:`OFF_SCALE`).
        clock_steps: Clock steps found in this block's timestamps; the aggregate interval
            open at each was closed (it is in ``aggregates``).
    """

    end_index: npt.NDArray[np.int64]
    scores: FloatArray
    threshold: float
    alerts: list[AlertEvent] = field(default_factory=list)
    events: list[AlertEvent] = field(default_factory=list)
    aggregates: list[Aggregate] = field(default_factory=list)
    calibrated: Calibration | None = None
    calibration_outliers: int = 0
    nonfinite_scores: int = 0
    clock_steps: list[ClockStep] = field(default_factory=list)
