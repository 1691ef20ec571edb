"""Feature-deviation detector: calibrated scoring of windows with a model backend.

Score definition (the package's ``score.kind = feature_deviation``):

1. scale each window with the calibrated scaler: z = (x − mean) / scale (per channel);
2. run the model: F = len(features) × C window features (:mod:`agent.pipeline.features`);
3. standardise each feature against its calibration-window mean and (floored) std;
4. score = mean of the ``top_k`` largest |standardised feature| values.

threshold = quantile(threshold-base scores, q) × factor, the base being the calibration windows'
own scores or, with a hold-out, their out-of-sample scores
(:func:`cloud_sync.calibration.fit_calibration`). With the package's bounded level adaptation
(:mod:`agent.pipeline.drift`), step 3 takes each window's mean features against a level offset
that the stream carries from window to window (:meth:`FeatureDeviationDetector.score_adapted`).
This is the per-series calibrate-then-score protocol of SKAB (Katser & Kozitsin, 2020); top-k
averaging of standardised residuals is the "top-k" score aggregation used by e.g. PyOD's and
Merlion's ensemble scorers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agent.inference.base import Backend
from agent.pipeline.drift import LevelAdaptation, adapted_scores
from agent.records import Float32Array, FloatArray
from cloud_sync.calibration import (
    CalibrationFit,
    FeatureStats,
    Scaler,
    deviation_scores,
    fit_calibration,
    fit_threshold,
)


@dataclass(frozen=True, slots=True)
class DetectorSpec:
    """Everything the detector needs from the model package and the stream config.

    Attributes:
        channels: Channel names, model input order.
        window: W, samples per window.
        hop: Samples between windows.
        calibration_samples: N, samples in the calibration period.
        scale_floor: Shape ``(C,)``, lower bound of the input scale, channel units.
        n_features: Features per channel (F = n_features × C).
        top_k: |z| values averaged into the score.
        feature_std_floor: Shape ``(F,)``.
        threshold_quantile: q in (0, 1].
        threshold_factor: Margin > 0.
        threshold_holdout: Fraction of the calibration samples held out for the threshold
            base, 0 = in-sample (:func:`cloud_sync.calibration.fit_calibration`).
    """

    channels: tuple[str, ...]
    window: int
    hop: int
    calibration_samples: int
    scale_floor: FloatArray
    n_features: int
    top_k: int
    feature_std_floor: FloatArray
    threshold_quantile: float
    threshold_factor: float
    threshold_holdout: float = 0.0


#: A fitted calibration: ``scaler``, ``features`` (feature statistics), ``threshold`` and
#: ``scores`` (``(K,)``, the calibration windows' scores, for diagnostics). The fleet fits the same
#: type on a device's uploaded samples (:mod:`cloud_sync.calibration`).
Calibration = CalibrationFit


@dataclass(frozen=True, slots=True)
class ScoredBatch:
    """Scores of K windows: ``scores`` ``(K,)`` float64; ``contributions`` ``(K, C)`` rows sum
    to 1 (each channel's share of the total |z| over its features)."""

    scores: FloatArray
    contributions: FloatArray


class FeatureDeviationDetector:
    """Calibrate on the first N samples of a stream, then score windows.

    Saturation fallback: an INT8 artefact represents its scaled input only inside the range its
    quantization was calibrated on (``input_range``); a larger value is clipped, so a 1000-sigma
    spike would score like a 12-sigma one. Windows holding any scaled value outside that range
    are therefore run through ``fallback`` (the package's FP32 twin) instead. They are rare
    (only far-out, i.e. anomalous, readings) and counted in ``fallback_windows``.

    Args:
        spec: Detector spec (from the model package and stream config).
        backend: Runs the model artefact (``(B, W, C)`` → ``(B, F)``).
        max_batch: Largest batch handed to the backend at once.
        fallback: FP32 backend for windows outside ``input_range``; None = no fallback.
        input_range: ``(low, high)`` of scaled inputs the backend represents unclipped.
        adaptation: Bounded per-channel level adaptation (the manifest's ``score.adaptation``;
            the first feature is the window mean); None = off.
    """

    def __init__(
        self,
        spec: DetectorSpec,
        backend: Backend,
        max_batch: int = 256,
        *,
        fallback: Backend | None = None,
        input_range: tuple[float, float] | None = None,
        adaptation: LevelAdaptation | None = None,
    ) -> None:
        self.spec = spec
        self.adaptation = adaptation
        self.backend = backend
        self.max_batch = max_batch
        self.fallback = fallback if input_range is not None else None
        self.input_range = input_range
        self.fallback_windows = 0

    def close(self) -> None:
        """Close the backend and the FP32 fallback (shutdown, after the last window)."""
        self.backend.close()
        if self.fallback is not None:
            self.fallback.close()

    def _run(self, scaled: Float32Array) -> FloatArray:
        outs = [
            self.backend.run(scaled[i : i + self.max_batch])
            for i in range(0, scaled.shape[0], self.max_batch)
        ]
        if not outs:
            return np.zeros((0, self.spec.n_features * len(self.spec.channels)))
        feats = np.concatenate(outs).astype(np.float64)
        if self.fallback is not None and self.input_range is not None:
            low, high = self.input_range
            outside = ((scaled < low) | (scaled > high)).any(axis=(1, 2))
            if outside.any():
                feats[outside] = self.fallback.run(scaled[outside]).astype(np.float64)
                self.fallback_windows += int(outside.sum())
        return feats

    def calibrate(self, samples: FloatArray) -> Calibration:
        """Fit scaler, feature statistics and threshold on raw ``samples`` (``(N, C)``).

        Every window of W consecutive samples (hop 1) inside ``samples`` is a calibration window.

        Raises:
            ValueError: fewer than W + 1 samples or a channel count mismatch.
            agent.errors.ModelError: the backend failed.
        """
        sp = self.spec
        return fit_calibration(
            samples,
            self._run,
            window=sp.window,
            scale_floor=sp.scale_floor,
            feature_std_floor=sp.feature_std_floor,
            top_k=sp.top_k,
            quantile=sp.threshold_quantile,
            factor=sp.threshold_factor,
            holdout=sp.threshold_holdout,
        )

    @staticmethod
    def _scale(windows: Float32Array, scaler: Scaler) -> Float32Array:
        return scaler.apply(windows)

    def _scores(self, feats: FloatArray, stats: FeatureStats) -> tuple[FloatArray, FloatArray]:
        return deviation_scores(feats, stats, self.spec.top_k)

    def score_adapted(self, windows: Float32Array, calibration: Calibration,
                      offset: FloatArray) -> tuple[ScoredBatch, FloatArray]:
        """Score raw windows one by one with the level adaptation (:mod:`agent.pipeline.drift`).

        Args:
            windows: Shape ``(K, W, C)``, float32, raw values.
            calibration: From :meth:`calibrate`.
            offset: ``(C,)`` level offset d before the first window, calibration sigmas.

        Returns:
            Scores and contributions, and d after the last window ``(C,)``.

        Raises:
            ValueError: the detector has no adaptation.
            agent.errors.ModelError: the backend failed.
        """
        if self.adaptation is None:
            raise ValueError("score_adapted needs a detector with an adaptation")
        feats = self._run(self._scale(windows, calibration.scaler))
        stats = calibration.features
        c = len(self.spec.channels)
        level = fit_threshold(calibration.scores, self.spec.threshold_quantile, 1.0)
        scores, z, offset = adapted_scores(
            (feats - stats.mean) / stats.std, feats[:, :c], 1.0 / stats.std[:c], offset,
            self.spec.top_k, self.adaptation, level)
        return ScoredBatch(scores, self._contributions(z)), offset

    def score(self, windows: Float32Array, calibration: Calibration) -> ScoredBatch:
        """Score raw windows.

        Args:
            windows: Shape ``(K, W, C)``, float32, raw (unscaled) values.
            calibration: From :meth:`calibrate`.

        Returns:
            Scores and per-channel contributions.

        Raises:
            agent.errors.ModelError: the backend failed.
        """
        feats = self._run(self._scale(windows, calibration.scaler))
        scores, z = self._scores(feats, calibration.features)
        return ScoredBatch(scores, self._contributions(z))

    def _contributions(self, z: FloatArray) -> FloatArray:
        """Each channel's share ``(K, C)`` of the total |z| ``(K, F)`` over its features."""
        c = len(self.spec.channels)
        per_channel = z.reshape(z.shape[0], self.spec.n_features, c).sum(axis=1)
        total = per_channel.sum(axis=1, keepdims=True)
        shares: FloatArray = np.divide(
            per_channel, total, out=np.full_like(per_channel, 1.0 / c), where=total > 0
        )
        return shares
