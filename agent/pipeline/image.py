"""One camera stream's pipeline: frame → normalise → model → score vs threshold → alert rules.

Pure code: no I/O, no clocks (the frame carries its times). The camera source has already
converted the frame to the model's colour mode and size
(:func:`agent.sources.camera.to_model_image`); this module normalises it as the package's
image input spec says::

    x[c, y, x] = (pixel / 255 - mean[c]) / std[c]        float32, shape (1, C, H, W)

The score is the model's own output (``score.kind = "model_score"``) and the threshold the
package's (a quantile of held-out good images' scores). The alert rules are the sensor streams'
(:mod:`agent.pipeline.rules`: k of n frames above the threshold, hysteresis, cooldown), one
"window" per frame; alerts name no channels. Aggregates count frames, scores and alerts per
interval (no sensor channels). An alert of a recorded input names the frame's file (and video
frame index) (``Frame.origin`` → ``AlertEvent.origin`` → the payload's ``source``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from agent.inference.base import Backend
from agent.pipeline.aggregates import IntervalAggregator
from agent.pipeline.episodes import Lifecycle
from agent.pipeline.rules import AlertRules, RuleParams
from agent.pipeline.stream import AlertEvent
from agent.pipeline.timeline import ClockStep, StepDetector
from agent.records import Aggregate, Float32Array, Frame


@dataclass(frozen=True, slots=True)
class ImageSpec:
    """Model input: ``height`` x ``width`` x ``channels``; per-channel ``mean`` and ``std`` of
    pixel / 255 (shape ``(C,)`` each)."""

    height: int
    width: int
    channels: int
    mean: tuple[float, ...]
    std: tuple[float, ...]


def normalise(image: np.ndarray, spec: ImageSpec) -> Float32Array:
    """Turn a model-sized uint8 image into the model input.

    Args:
        image: ``uint8`` ``(H, W)`` (C = 1) or ``(H, W, C)``.
        spec: The input spec.

    Returns:
        ``float32`` ``(1, C, H, W)``.

    Raises:
        ValueError: the image's size or channel count differs from the spec.

    >>> spec = ImageSpec(2, 2, 1, (0.5,), (0.5,))
    >>> normalise(np.array([[0, 255], [255, 0]], np.uint8), spec)[0, 0].tolist()
    [[-1.0, 1.0], [1.0, -1.0]]
    """
    img = image[:, :, None] if image.ndim == 2 else image
    if img.shape != (spec.height, spec.width, spec.channels):
        raise ValueError(f"frame shape {image.shape} does not fit the model input "
                         f"{spec.height}x{spec.width}x{spec.channels}")
    mean = np.asarray(spec.mean, np.float32) * 255.0
    scale = 1.0 / (np.asarray(spec.std, np.float32) * 255.0)
    x = (img.astype(np.float32) - mean) * scale
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None])


@dataclass(slots=True)
class ImageOutput:
    """What one frame produced: its ``score``, the ``threshold``, alerts and closed aggregates."""

    score: float
    threshold: float
    alerts: list[AlertEvent] = field(default_factory=list)
    #: Every episode event (``raised``, ``updated``, ``cleared``); ``alerts`` are the raised.
    events: list[AlertEvent] = field(default_factory=list)
    aggregates: list[Aggregate] = field(default_factory=list)
    #: A clock step found at this frame (:mod:`agent.pipeline.timeline`): the interval open
    #: before it is in ``aggregates``, and the rules' cooldown counts monotonic time across it.
    clock_step: ClockStep | None = None


class ImagePipeline:
    """Score one camera stream's frames.

    Args:
        stream: Stream name.
        device_id: Device id (stamped on aggregates).
        spec: Model input spec.
        backend: Runs the model: ``(1, C, H, W)`` float32 → ``(1,)`` score.
        threshold: Score threshold (from the package).
        rules: Alert rule parameters.
        aggregate_interval_s: Aggregate interval in seconds (stream time).
    """

    def __init__(self, stream: str, device_id: str, spec: ImageSpec, backend: Backend,
                 threshold: float, rules: RuleParams, aggregate_interval_s: float = 60.0) -> None:
        self.stream = stream
        self.spec = spec
        self.backend = backend
        self.threshold = threshold
        self.rules = AlertRules(rules)
        #: The open episode and its ``updated`` reports (:mod:`agent.pipeline.episodes`).
        self.lifecycle = Lifecycle(self.rules)
        self.aggregator = IntervalAggregator(device_id, stream, (), aggregate_interval_s)
        self.clock = StepDetector()
        self._rule_offset = 0.0  # minus the clock steps so far (rule time stays monotonic)

    def score(self, image: np.ndarray) -> float:
        """The model's score of one model-sized uint8 image (see :func:`normalise`).

        Raises:
            ValueError: wrong image shape. agent.errors.ModelError: the backend failed.
        """
        out = self.backend.run(normalise(image, self.spec))
        return float(np.asarray(out).reshape(-1)[0])

    def close(self) -> None:
        """Close the backend (shutdown, after the last frame)."""
        self.backend.close()

    def process(self, frame: Frame) -> ImageOutput:
        """Score ``frame``, apply the alert rules, count it in its aggregate interval.

        Raises:
            ValueError: wrong image shape. agent.errors.ModelError: the backend failed.
        """
        score = self.score(frame.image)
        ts = np.array([frame.ts])
        out = ImageOutput(score, self.threshold)
        steps = self.clock.find(ts, np.array([frame.received_mono]))
        if steps:
            out.clock_step = steps[0]
            out.aggregates = self.aggregator.flush()
            self._rule_offset -= steps[0].size_s
        out.aggregates += self.aggregator.add_readings(np.zeros((1, 0)), ts)
        kind = self.lifecycle.step(score, self.threshold, frame.ts + self._rule_offset)
        if kind is not None:
            event = AlertEvent(
                self.stream, score, self.threshold, frame.ts, frame.ts, (),
                frame.received_mono, frame.origin, frame=frame, kind=kind,
                peak_score=None if kind == "raised" else self.lifecycle.peak)
            out.events.append(event)
            if kind == "raised":
                out.alerts.append(event)
        self.aggregator.add_scores(np.array([score]), int(kind == "raised"))
        return out

    def flush(self) -> list[Aggregate]:
        """Close the open aggregate interval (shutdown)."""
        return self.aggregator.flush()
