"""One channel at irregular intervals: gaps, bounded drift adaptation, explained alerts.

A univariate stream (a bearing temperature, a motor current) runs through the same
:class:`~agent.pipeline.stream.StreamPipeline` (windows, calibration, detector, alert rules,
aggregates) with three additions, parameters from the package's ``univariate`` manifest section
(:class:`cloud_sync.manifest.UnivariateSpec`). Windows count samples, not seconds: an irregular
interval is scored like a regular one, only a gap is treated apart.

* **Gaps.** Let m be the median of the last :data:`INTERVAL_HISTORY` intervals that were not
  gaps (known once :data:`MIN_INTERVALS` were seen). A reading more than ``gap_factor`` × m after
  the previous one starts a new window: the windower restarts, so no window bridges the gap,
  and the first window after it is scored W samples later. Calibration and the alert rules'
  state carry on (an episode may span a gap). A reading whose timestamp is earlier than the
  previous one, or whose value is not finite, is rejected (counted in :attr:`rejected`).
* **Bounded drift adaptation.** Only the level is adapted. The baseline μ (the scaler mean)
  starts at the calibration mean μ_cal. After each scored window whose score is below
  ``adapt_below`` × threshold: μ ← μ + α·(x̄_w − μ), α = ``adapt_rate`` (an EWMA of the quiet
  windows' means; Roberts, "Control chart tests based on geometric moving averages", 1959), then
  μ ← clip(μ, μ_cal − B·σ_cal, μ_cal + B·σ_cal), B = ``drift_bound``, σ_cal the calibration
  scale. Windows near or above the threshold never move it, and the total move is bounded, so a
  slow fault is tracked at most B sigmas and then scores as it grows; a benign drift within B
  sigmas is followed. Spread and roughness (the other features) are not adapted: a change of
  noise is a fault signature. The updates of one block use the scores of that block, computed
  with the baseline at its start. A restart resumes from the calibration (μ = μ_cal).
* **Scale floor and robust adaptive score** (``threshold_sigma`` set, packages from
  ``univariate-wstat@3``): the detector's part, :mod:`agent.pipeline.univariate_detector`. With
  the robust score the window features are scored against a baseline whose level and scale
  both adapt, robustly and within bounds (:mod:`agent.pipeline.robust`), carried by this
  pipeline window by window; the level EWMA above is then not used. The agent keeps that
  baseline across restarts (:meth:`UnivariatePipeline.resume_baseline`,
  :mod:`agent.pipeline.baseline_restore`).
* **Explanation.** Each alert carries :class:`agent.records.Explanation`: expected = the
  baseline level in force when the alerting window was scored (with the robust score, before
  that window's update, whatever the block size), observed = the alerting window's mean,
  deviation = observed − expected, and that deviation in σ_cal.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections import deque
from dataclasses import replace
from typing import Protocol

import numpy as np

from agent.errors import ConfigError
from agent.pipeline.aggregates import IntervalAggregator
from agent.pipeline.detector import (
    Calibration,
    DetectorSpec,
    FeatureDeviationDetector,
    ScoredBatch,
)
from agent.pipeline.drift import follow_level
from agent.pipeline.robust import RobustParams, RobustState, flat_calibration, robust_scores
from agent.pipeline.rules import RuleParams
from agent.pipeline.stream import AlertEvent, StreamOutput, StreamPipeline
from agent.pipeline.univariate_detector import UnivariateDetector, UnivariateParams
from agent.pipeline.windowing import SlidingWindower, WindowBatch
from agent.records import Explanation, Float32Array, FloatArray
from cloud_sync.calibration import Scaler

log = logging.getLogger("agent.pipeline")


class _HasChannel(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def channel(self) -> str | None: ...


#: Intervals the running median looks at.
INTERVAL_HISTORY = 64
#: Intervals needed before a gap can be recognised.
MIN_INTERVALS = 8


def accepted_rows(values: FloatArray, ts: FloatArray, last: float = -math.inf) -> np.ndarray:
    """Mask ``(N,)`` of the readings a univariate stream accepts: a finite value (all of
    ``values``' ``(N, C)`` columns) and a finite time not before the previous accepted one's
    (``last`` for the first).

    >>> v = np.array([[1.0], [np.nan], [2.0], [3.0]])
    >>> accepted_rows(v, np.array([0, 1, 2, 1.5])).tolist()
    [True, False, True, False]
    """
    ok = np.isfinite(values).all(axis=1) & np.isfinite(ts)
    mask = np.zeros(ts.shape[0], bool)
    for i in np.flatnonzero(ok):
        if ts[i] >= last:
            mask[i] = True
            last = float(ts[i])
    return mask


def univariate_channel(sc: _HasChannel, model: str, package_channels: tuple[str, ...],
                       source_channels: tuple[str, ...]) -> tuple[str]:
    """The source channel a one-channel package scores (the stream's ``channel`` key).

    ``channel`` when set; else the source channel named like the package's; else the source's
    only channel.

    Raises:
        agent.errors.ConfigError: none of these applies, or ``channel`` is not a source channel.
    """
    if sc.channel is not None:
        if sc.channel not in source_channels:
            msg = (f"streams.{sc.name}.channel: {sc.channel!r} is not a channel of the source "
                   f"(source channels: {list(source_channels)})")
            raise ConfigError(msg, problems=[msg])
        return (sc.channel,)
    if package_channels[0] in source_channels:
        return (package_channels[0],)
    if len(source_channels) == 1:
        return (source_channels[0],)
    msg = (f"streams.{sc.name}: model {model} scores one channel; the source has "
           f"{list(source_channels)}: name the one to score with 'channel'")
    raise ConfigError(msg, problems=[msg])


class UnivariatePipeline(StreamPipeline):
    """:class:`StreamPipeline` for one channel with gaps, bounded adaptation and explanations.

    Args:
        stream, device_id, spec, rules, aggregate_interval_s, top_channels, calibration: As
            :class:`StreamPipeline`.
        detector: A :class:`UnivariateDetector`.
        params: Gap and adaptation parameters.
        channel_label: The name alerts and aggregates give the channel (the plant's, mapped by
            the stream's ``channel`` key); None = the package's.

    Raises:
        ValueError: the spec has more than one channel, or as :class:`StreamPipeline`.
    """

    def __init__(self, stream: str, device_id: str, spec: DetectorSpec,
                 detector: FeatureDeviationDetector, rules: RuleParams, params: UnivariateParams,
                 aggregate_interval_s: float = 60.0, top_channels: int = 3,
                 calibration: Calibration | None = None, channel_label: str | None = None
                 ) -> None:
        if len(spec.channels) != 1:
            raise ValueError(f"a univariate stream has one channel, got {spec.channels}")
        super().__init__(stream, device_id, spec, detector, rules, aggregate_interval_s,
                         top_channels, calibration)
        self.channel_label = channel_label or spec.channels[0]
        self.aggregator = IntervalAggregator(device_id, stream, (self.channel_label,),
                                             aggregate_interval_s)
        self.params = params
        self._intervals: deque[float] = deque(maxlen=INTERVAL_HISTORY)
        self._last_ts: float | None = None
        #: Readings rejected (non-finite value, or a timestamp before the previous one).
        self.rejected = 0
        #: Gaps seen (window restarts).
        self.gaps = 0
        #: Calibration the baseline is bounded against (the one fitted or restored).
        self.origin: Calibration | None = calibration
        # the robust baseline and the calibration it started from
        self._robust: tuple[Calibration, RobustState] | None = None
        # the baseline level (channel units) each window of the last scored batch was scored
        # against, for the alerts' explanations
        self._levels: FloatArray = np.zeros(0)

    @property
    def baseline(self) -> float:
        """The baseline level in force, channel units (NaN while calibrating): μ, or with the
        robust score μ_cal + σ_cal × the level centre."""
        cal = self.calibration
        if cal is None:
            return math.nan
        state = self.robust_state
        if state is None:
            return float(cal.scaler.mean[0])
        return float(cal.scaler.mean[0] + cal.scaler.scale[0] * state.centre[0])

    @property
    def robust_state(self) -> RobustState | None:
        """The robust baseline in force (:mod:`agent.pipeline.robust`), None without the
        robust score or before its first window (it then starts from the calibration)."""
        if self._robust is None or self._robust[0] is not self.calibration:
            return None
        return self._robust[1]

    def baseline_start(self) -> RobustState | None:
        """The robust baseline at the calibration in force (its bounds' origin), None without
        the robust score or while calibrating."""
        cal = self.calibration
        if self.robust_params is None or cal is None:
            return None
        flat = flat_calibration(np.asarray(cal.features.mean))
        return RobustState.start(cal.features.mean, cal.features.std, bounded=not flat)

    def resume_baseline(self, state: RobustState) -> None:
        """Continue from ``state`` (a baseline kept across a restart, started at the calibration
        in force: :func:`agent.pipeline.robust.resume_state` of :meth:`baseline_start`)
        instead of the calibration's start.

        Raises:
            ValueError: the stream is calibrating or has no robust score.
        """
        if self.calibration is None or self.robust_params is None:
            raise ValueError(f"stream {self.stream}: no robust baseline to resume")
        self._robust = (self.calibration, state)

    def accepted(self, values: FloatArray, ts: FloatArray) -> np.ndarray:
        """:func:`accepted_rows` after this pipeline's last accepted reading (no state change)."""
        return accepted_rows(values, ts, -math.inf if self._last_ts is None else self._last_ts)

    def _gap_cuts(self, ts: FloatArray) -> list[int]:
        """Indices of ``ts`` (accepted, non-decreasing) that start a new window."""
        cuts = []
        prev = self._last_ts
        for i, t in enumerate(ts.tolist()):
            if prev is not None:
                dt = t - prev
                # median >= min: an interval within gap_factor x min is no gap (no median needed)
                if len(self._intervals) >= MIN_INTERVALS and dt > self.params.gap_factor * max(
                        min(self._intervals), 1e-9) and dt > self.params.gap_factor * max(
                        float(np.median(self._intervals)), 1e-9):
                    cuts.append(i)
                else:
                    self._intervals.append(dt)
            prev = t
        self._last_ts = prev
        return cuts

    def restart_window(self) -> None:
        """Start a new window (after a gap): the next window ends W samples from now."""
        self.windower = SlidingWindower(self.spec.window, self.windower.hop, 1)
        self._score_from = 0 if self.calibration is not None else (
            self.spec.calibration_samples - self._cal_count)
        self.gaps += 1

    def process_block(self, values: FloatArray, ts: FloatArray, received_mono: float = 0.0,
                      mono: FloatArray | None = None) -> StreamOutput:
        """Feed readings; as :meth:`StreamPipeline.process_block`, except that rejected
        readings are skipped (``end_index`` indexes the block as given) and gaps restart the
        window.

        Args:
            values: Shape ``(N, 1)``, float64, channel units.
            ts: Shape ``(N,)``, epoch seconds UTC.
            received_mono, mono: As :meth:`StreamPipeline.process_block`.
        """
        if values.ndim != 2 or values.shape[1] != 1 or ts.shape != (values.shape[0],):
            raise ValueError(f"expected values (N, 1) and ts (N,), got {values.shape}, "
                             f"{ts.shape}")
        keep = np.flatnonzero(self.accepted(values, ts))
        self.rejected += values.shape[0] - keep.size
        v, t = values[keep], ts[keep]
        m = mono[keep] if mono is not None else None
        total = StreamOutput(np.zeros(0, np.int64), np.zeros(0), self.threshold)
        ends, scores = [], []
        bounds = [0, *self._gap_cuts(t), t.shape[0]]
        for j, (a, b) in enumerate(itertools.pairwise(bounds)):
            if j > 0:
                self.restart_window()
            if a == b:
                continue
            out = super().process_block(v[a:b], t[a:b], received_mono,
                                        None if m is None else m[a:b])
            if out.calibrated is not None:
                self.origin = total.calibrated = out.calibrated
            ends.append(keep[out.end_index + a])
            scores.append(out.scores)
            total.alerts += out.alerts
            total.events += out.events
            total.aggregates += out.aggregates
        if ends:
            total.end_index = np.concatenate(ends).astype(np.int64)
            total.scores = np.concatenate(scores)
        total.threshold = self.threshold
        return total

    def swap(self, detector: FeatureDeviationDetector, calibration: Calibration,
             keep_fallback: bool = True) -> None:
        """As :meth:`StreamPipeline.swap`; the new calibration is the new bound's origin."""
        super().swap(detector, calibration, keep_fallback)
        self.origin = calibration

    def _score(self, windows: Float32Array) -> ScoredBatch:
        level = self.baseline
        scored = super()._score(windows)
        if self.robust_params is None:
            # the block's windows are scored against the level at its start
            self._levels = np.full(windows.shape[0], level)
            self._adapt(windows, scored.scores)
        return scored

    @property
    def robust_params(self) -> RobustParams | None:
        """The robust baseline's adaptation, None without the robust score."""
        det = self.detector
        return det.params.robust if isinstance(det, UnivariateDetector) else None

    def _run_detector(self, windows: Float32Array) -> ScoredBatch:
        """With the robust score: the windows against the robust baseline, adapted window by
        window from the calibration's start (:mod:`agent.pipeline.robust`)."""
        p, cal, det = self.robust_params, self.calibration, self.detector
        if p is None or not isinstance(det, UnivariateDetector):
            return super()._run_detector(windows)
        assert cal is not None
        state = self.robust_state
        if state is None:
            state = self.baseline_start()
            assert state is not None
            if not state.bounded:
                log.warning("stream %s: the calibration period was flat (most windows without "
                            "any change): the baseline learns the stream's level and noise from "
                            "operation, without its drift bounds; calibrate over normal "
                            "operation (calibration_samples) to keep them", self.stream)
        levels: list[float] = []
        scores, _, state = robust_scores(det.features(windows, cal), state, p, self.spec.top_k,
                                         levels=levels)
        self._robust = (cal, state)
        self._levels = cal.scaler.mean[0] + cal.scaler.scale[0] * np.asarray(levels, np.float64)
        return ScoredBatch(scores, np.ones((scores.shape[0], 1)))

    def _adapt(self, windows: Float32Array, scores: FloatArray) -> None:
        """The bounded EWMA of the baseline (module docstring)."""
        cal, origin, p = self.calibration, self.origin, self.params
        if cal is None or p.adapt_rate <= 0:
            return
        if origin is None:
            origin = self.origin = cal
        quiet = scores < p.adapt_below * cal.threshold
        if not quiet.any():
            return
        mu0, sigma = float(origin.scaler.mean[0]), float(origin.scaler.scale[0])
        mu = float(cal.scaler.mean[0])
        low, high = mu0 - p.drift_bound * sigma, mu0 + p.drift_bound * sigma
        for m in windows[quiet, :, 0].mean(axis=1).tolist():
            mu = float(follow_level(mu, m, p.adapt_rate, low, high))
        self.calibration = replace(cal, scaler=Scaler(np.array([mu]), cal.scaler.scale))

    def _event(self, batch: WindowBatch, i: int, score: float, contrib: FloatArray,
               mono: float) -> AlertEvent:
        event = super()._event(batch, i, score, contrib, mono)
        # the scored windows are the batch's last len(self._levels)
        j = i - (len(batch) - self._levels.shape[0])
        expected = float(self._levels[j]) if 0 <= j < self._levels.shape[0] else self.baseline
        observed = float(batch.data[i, :, 0].astype(np.float64).mean())
        assert self.calibration is not None
        sigma = float(self.calibration.scaler.scale[0])
        top = tuple(replace(t, channel=self.channel_label) for t in event.top_channels)
        return replace(event, top_channels=top, explanation=Explanation(
            expected, observed, observed - expected, (observed - expected) / sigma))
