"""One stream's pipeline: windows → calibration → detector → alert rules → aggregates.

Pure code: no I/O, no clocks. The composition root feeds blocks of readings and persists what
comes out (alerts to the outbox, aggregates to the store).

Model updates (:mod:`agent.services.updater`) work through three calls, all made by the thread
that calls :meth:`StreamPipeline.process_block`, between two blocks: :meth:`~StreamPipeline.swap`
replaces the detector and calibration (windows, alert-rule state and aggregates carry on: no
reading is dropped, alert episodes continue), keeping the previous pair as a fallback: if the new
detector raises :class:`~agent.errors.ModelError`, the block is scored with the previous one,
which takes over again, and :attr:`~StreamPipeline.fallback_error` says why.
:attr:`~StreamPipeline.observer` sees every scored batch (shadow scoring, post-swap watch).
The calibration samples are kept (:attr:`~StreamPipeline.calibration_samples`) so a candidate
model calibrates on the same readings.

Outliers and non-finite scores (nothing vanishes silently): far-out readings of the
calibration period (:func:`agent.pipeline.calibration.far_out_rows`) are left out of the fit and
counted (:attr:`StreamOutput.calibration_outliers`); a window whose score is not finite (a
reading the model cannot represent) scores :data:`OFF_SCALE`, so it counts as above any
threshold and can alert, and is counted (:attr:`StreamOutput.nonfinite_scores`).

Clock steps (:mod:`agent.pipeline.timeline`): at a step in the timestamps the open aggregate
interval is closed, and the alert rules' cooldown keeps counting monotonic seconds across it
(:attr:`StreamOutput.clock_steps` reports each step once).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import numpy.typing as npt

from agent.errors import ModelError
from agent.pipeline.aggregates import IntervalAggregator
from agent.pipeline.calibration import far_out_rows, fence_floor
from agent.pipeline.detector import (
    Calibration,
    DetectorSpec,
    FeatureDeviationDetector,
    ScoredBatch,
)
from agent.pipeline.episodes import Lifecycle
from agent.pipeline.rules import AlertRules, RuleParams
from agent.pipeline.stream_types import AlertEvent, BatchObserver, StreamOutput
from agent.pipeline.timeline import StepDetector
from agent.pipeline.windowing import SlidingWindower, WindowBatch
from agent.records import (
    Aggregate,
    Float32Array,
    FloatArray,
    TopChannel,
)

__all__ = ["OFF_SCALE", "AlertEvent", "BatchObserver", "StreamOutput", "StreamPipeline"]

#: The score of a window whose computed score is not finite: above any threshold.
OFF_SCALE = float(np.finfo(np.float64).max)


class StreamPipeline:
    """Process one stream's readings block by block.

    Args:
        stream: Stream name.
        device_id: Device id (stamped on aggregates).
        spec: Detector spec (window, hop, calibration length ...).
        detector: The calibrated-scoring detector.
        rules: Alert rule parameters.
        aggregate_interval_s: Aggregate interval in seconds.
        top_channels: How many channels an alert names.
        calibration: A calibration to start from (e.g. restored after a restart); None =
            calibrate on the first ``spec.calibration_samples`` samples.
    """

    def __init__(
        self,
        stream: str,
        device_id: str,
        spec: DetectorSpec,
        detector: FeatureDeviationDetector,
        rules: RuleParams,
        aggregate_interval_s: float = 60.0,
        top_channels: int = 3,
        calibration: Calibration | None = None,
    ) -> None:
        if spec.calibration_samples < spec.window + 1:
            raise ValueError(
                f"calibration_samples ({spec.calibration_samples}) must exceed the window "
                f"({spec.window})"
            )
        self.stream = stream
        self.spec = spec
        self.detector = detector
        self.rules = AlertRules(rules)
        #: The open episode and its ``updated`` reports (params settable after construction).
        self.lifecycle = Lifecycle(self.rules)
        self.top_channels = top_channels
        self.windower = SlidingWindower(spec.window, spec.hop, len(spec.channels))
        self.aggregator = IntervalAggregator(device_id, stream, spec.channels,
                                             aggregate_interval_s)
        self.calibration = calibration
        self._cal_buf: list[FloatArray] = []
        self._cal_count = 0
        #: Shape ``(N, C)``: the readings the calibration was fitted on (None until then).
        self.calibration_samples: FloatArray | None = None
        #: Previous detector and calibration after :meth:`swap` (run-time fallback).
        self.fallback: tuple[FeatureDeviationDetector, Calibration] | None = None
        #: Set when the swapped-in detector failed and the fallback took over again.
        self.fallback_error: ModelError | None = None
        #: Sees every scored batch (shadow scoring, post-swap watch); None = nobody.
        self.observer: BatchObserver | None = None
        # windows whose last sample index is below this are calibration windows (unscored); a
        # restored calibration scores from the first window
        self._score_from = 0 if calibration is not None else spec.calibration_samples
        #: Finds clock steps in the stream's timestamps (:mod:`agent.pipeline.timeline`).
        self.clock = StepDetector()
        # added to window end times for the alert rules: minus the sum of the steps so far
        self._rule_offset = 0.0
        #: The last scored window: (start, end, score, received_mono), for end_of_input.
        self._last_window: tuple[float, float, float, float] | None = None
        # the level offset of an adapting detector and the calibration it belongs to
        self._offset: tuple[Calibration, FloatArray] | None = None

    @property
    def calibrating(self) -> bool:
        """True until the calibration period is complete."""
        return self.calibration is None

    @property
    def level_offset(self) -> FloatArray | None:
        """``(C,)`` the level offset of an adapting detector after the last scored window, in
        calibration sigmas (:mod:`agent.pipeline.drift`); None before one or without one."""
        return self._offset[1] if self._offset is not None else None

    @property
    def threshold(self) -> float:
        """Threshold in force (NaN while calibrating)."""
        return self.calibration.threshold if self.calibration is not None else math.nan

    def process_block(
        self, values: FloatArray, ts: FloatArray, received_mono: float = 0.0,
        mono: FloatArray | None = None,
    ) -> StreamOutput:
        """Feed readings.

        Args:
            values: Shape ``(N, C)``, float64, in channel order.
            ts: Shape ``(N,)``, epoch seconds UTC, non-decreasing (a clock step excepted:
                :mod:`agent.pipeline.timeline`).
            received_mono: Monotonic receive time of the newest reading.
            mono: Shape ``(N,)``, each reading's monotonic receive time (0 = unknown); lets a
                forward clock step be told from a fast replay.

        Raises:
            ValueError: shape mismatch.
            agent.errors.ModelError: the backend failed.
        """
        n = values.shape[0]
        out = StreamOutput(np.zeros(0, np.int64), np.zeros(0), math.nan)
        if n == 0:
            return out
        out.clock_steps = self.clock.find(ts, mono)
        ends: list[npt.NDArray[np.int64]] = [np.zeros(0, np.int64)]
        scores: list[FloatArray] = [np.zeros(0)]
        starts = [0, *(step.index for step in out.clock_steps)]
        for k, (a, b) in enumerate(zip(starts, [*starts[1:], n], strict=True)):
            if k:  # a clock step: close the open interval; rule time goes on monotonically
                out.aggregates += self.aggregator.flush()
                self._rule_offset -= out.clock_steps[k - 1].size_s
            if b > a:
                self._process_span(values[a:b], ts[a:b], received_mono, out, ends, scores, a)
        out.end_index = np.concatenate(ends)
        out.scores = np.concatenate(scores)
        out.threshold = self.threshold
        return out

    def _process_span(
        self, values: FloatArray, ts: FloatArray, received_mono: float, out: StreamOutput,
        ends: list[npt.NDArray[np.int64]], scores: list[FloatArray], offset: int,
    ) -> None:
        # split the span where the aggregate interval changes, so scores and alerts land in
        # the interval of their window's last sample
        n = values.shape[0]
        slots = np.floor(ts / self.aggregator.interval_s)
        cuts = (np.flatnonzero(np.diff(slots)) + 1).tolist()
        for a, b in zip([0, *cuts], [*cuts, n], strict=True):
            out.aggregates += self.aggregator.add_readings(values[a:b], ts[a:b])
            e, sc = self._process(values[a:b], ts[a:b], received_mono, out)
            ends.append(e + a + offset)
            scores.append(sc)

    def _process(
        self, values: FloatArray, ts: FloatArray, received_mono: float, out: StreamOutput
    ) -> tuple[npt.NDArray[np.int64], FloatArray]:
        seen_before = self.windower.samples_seen
        if self.calibration is None:
            need = self.spec.calibration_samples - self._cal_count
            take = values[:need]
            self._cal_buf.append(np.array(take, dtype=np.float64))
            self._cal_count += take.shape[0]
        batch = self.windower.push_block(values, ts)
        scores = np.full(len(batch), math.nan)
        if self.calibration is None and self._cal_count >= self.spec.calibration_samples:
            samples = np.concatenate(self._cal_buf)
            far = far_out_rows(samples, fence_floor(samples, self.spec.scale_floor))
            if far.any() and int((~far).sum()) > self.spec.window:
                samples = samples[~far]
                out.calibration_outliers = int(far.sum())
            self.calibration_samples = samples
            self.calibration = self.detector.calibrate(samples)
            self._cal_buf = []
            out.calibrated = self.calibration
        if self.calibration is None or len(batch) == 0:
            self.aggregator.add_scores(scores, 0)
            return batch.end_index, scores
        # windows ending inside the calibration period stay unscored
        absolute_end = seen_before + batch.end_index
        live = absolute_end >= self._score_from
        alerts = 0
        if live.any():
            windows = batch.data[live]
            # > 1 while the latency budget skips windows; read before scoring, which may change
            # the hop for the next block (DeadlineGuard.on_stride)
            stride = max(1, self.windower.hop // self.spec.hop)
            with np.errstate(over="ignore", invalid="ignore"):  # non-finite: handled below
                raw = self._score(windows)
            scored = self._finite(raw, windows, out)
            scores[live] = scored.scores
            thr = self.threshold
            if self.observer is not None:
                self.observer.observe(windows, scored.scores, thr)
            for j, i in enumerate(np.flatnonzero(live)):
                rule_ts = float(batch.end_ts[i]) + self._rule_offset
                kind = self.lifecycle.step(float(scored.scores[j]), thr, rule_ts, stride)
                if kind is not None:
                    event = self._event(batch, int(i), scored.scores[j],
                                        scored.contributions[j], received_mono)
                    if kind != "raised":
                        event = replace(event, kind=kind, peak_score=self.lifecycle.peak,
                                        reason="recovered" if kind == "cleared" else None)
                    else:
                        out.alerts.append(event)
                        alerts += 1
                    out.events.append(event)
        self.aggregator.add_scores(scores, alerts)
        if live.any():
            k = int(np.flatnonzero(live)[-1])
            self._last_window = (float(batch.start_ts[k]), float(batch.end_ts[k]),
                                 float(scores[k]), received_mono)
        return batch.end_index, scores

    def end_of_input(self) -> AlertEvent | None:
        """The input ended with an episode open (a recorded file read to its end): its
        ``cleared`` event (reason ``end_of_input``, the last scored window), else None."""
        if self._last_window is None or not self.lifecycle.end():
            return None
        start, end, score, mono = self._last_window
        return AlertEvent(self.stream, score, self.threshold, start, end, (), mono,
                          kind="cleared", peak_score=self.lifecycle.peak, reason="end_of_input")

    def _finite(self, scored: ScoredBatch, windows: Float32Array, out: StreamOutput) -> ScoredBatch:
        """Non-finite scores become OFF_SCALE (counted); such a window's contributions are each
        channel's share of its largest scaled deviation (float64, where the model's float32
        overflowed), or equal shares when even that is not finite."""
        bad = ~np.isfinite(scored.scores)
        if not bad.any():
            return scored
        assert self.calibration is not None
        out.nonfinite_scores += int(bad.sum())
        scaler = self.calibration.scaler
        with np.errstate(all="ignore"):
            dev = np.abs((windows[bad].astype(np.float64) - scaler.mean) / scaler.scale).max(axis=1)
            dev = np.where(np.isfinite(dev), dev, 0.0)
            total = dev.sum(axis=1, keepdims=True)
            share = np.divide(dev, total, out=np.full_like(dev, 1.0 / dev.shape[1]),
                              where=(total > 0) & np.isfinite(total))
        contrib = scored.contributions.copy()
        contrib[bad] = share
        return ScoredBatch(np.where(bad, OFF_SCALE, scored.scores), contrib)

    def _score(self, windows: Float32Array) -> ScoredBatch:
        try:
            return self._run_detector(windows)
        except ModelError as exc:
            if self.fallback is None:
                raise
            self.detector, self.calibration = self.fallback
            self.fallback, self.fallback_error = None, exc
            return self._run_detector(windows)

    def _run_detector(self, windows: Float32Array) -> ScoredBatch:
        """Score with the detector in force; one with a level adaptation carries its offset
        from window to window, from 0 at each new calibration (:mod:`agent.pipeline.drift`)."""
        cal = self.calibration
        assert cal is not None
        if self.detector.adaptation is None:
            return self.detector.score(windows, cal)
        start = self._offset[1] if self._offset is not None and self._offset[0] is cal else (
            np.zeros(len(self.spec.channels)))
        scored, offset = self.detector.score_adapted(windows, cal, start)
        self._offset = (cal, offset)
        return scored

    def swap(
        self,
        detector: FeatureDeviationDetector,
        calibration: Calibration,
        keep_fallback: bool = True,
    ) -> None:
        """Score with ``detector`` and ``calibration`` from the next block on.

        Call between blocks from the thread that calls :meth:`process_block`. Windowing, alert
        rules and aggregates continue unchanged.

        Args:
            detector: The new detector (same channels and window as the spec).
            calibration: Its calibration (e.g. fitted on :attr:`calibration_samples`).
            keep_fallback: Keep the current pair as :attr:`fallback` (False for a rollback).

        Raises:
            ValueError: still calibrating, or the new detector's channels or window differ.
        """
        if self.calibration is None:
            raise ValueError("cannot swap the detector while the stream is calibrating")
        if detector.spec.channels != self.spec.channels or detector.spec.window != self.spec.window:
            raise ValueError("the new detector's channels or window differ from the stream's")
        self.fallback = (self.detector, self.calibration) if keep_fallback else None
        self.fallback_error = None
        self.detector, self.calibration = detector, calibration

    def _event(
        self, batch: WindowBatch, i: int, score: float, contrib: FloatArray, mono: float
    ) -> AlertEvent:
        order = np.argsort(-contrib)[: self.top_channels]
        top = tuple(TopChannel(self.spec.channels[c], float(contrib[c])) for c in order)
        return AlertEvent(
            stream=self.stream,
            score=float(score),
            threshold=self.threshold,
            window_start=float(batch.start_ts[i]),
            window_end=float(batch.end_ts[i]),
            top_channels=top,
            received_mono=mono,
        )

    def flush(self) -> list[Aggregate]:
        """Close the open aggregate interval (shutdown)."""
        return self.aggregator.flush()
