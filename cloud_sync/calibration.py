"""Calibration formulas shared by the device and the fleet (pure NumPy, no I/O).

The device fits its calibration on the first N readings of a stream (SKAB's protocol: Katser &
Kozitsin, 2020: fit scaler, model statistics and threshold on the first N samples of each series,
N = 400 there, with no labels). The fleet fits the SAME calibration on the samples a device
uploaded, so a cloud-trained package can carry it (:class:`cloud_sync.manifest.FittedCalibration`)
and the device detects from its first window. Both sides call these functions; the model is
passed in as a function ``(B, W, C) float32 scaled windows -> (B, F) features``, so the device
runs it on its backend and the fleet on ONNX Runtime.

Window features (what the window-statistics model computes; :func:`window_features` is the NumPy
reference), for a scaled window x of shape ``(W, C)``, per channel c, feature-major:

* ``mean``: (1/W) Σ_t x[t, c]
* ``mean_abs_dev``: (1/W) Σ_t |x[t, c] − mean_c|  (mean absolute deviation; chosen over the
  standard deviation because it quantizes to int8 without squaring the range)
* ``mean_abs_diff``: (1/(W−1)) Σ_t |x[t+1, c] − x[t, c]|  (mean absolute first difference, a
  roughness measure; Hjorth, "EEG analysis based on time domain properties", 1970, uses the
  same first-difference idea for his mobility parameter)

Score: each feature standardised against its calibration mean and floored std; the score is the
mean of the ``top_k`` largest |z| (top-k aggregation as in PyOD's and Merlion's scorers).
threshold = quantile(threshold-base scores, q) × factor. The threshold base is either the
calibration windows' own (in-sample) scores, or, with a hold-out fraction h > 0, the scores of the
windows inside the last h·N samples under a scaler and statistics fitted on the first (1 − h)·N:
out-of-sample scores that show how far normal operation drifts past a fit, as every later window
will (the scaler and statistics that score the stream are still fitted on all N samples). Held-out
calibration is the usual guard against an optimistic in-sample threshold (Hastie, Tibshirani &
Friedman, "The Elements of Statistical Learning", 2009, §7.2); its fraction and factor are chosen by
the grouped selection in ``models/recipes/skab_select.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
Float32Array = npt.NDArray[np.float32]
#: A model: scaled windows ``(B, W, C)`` float32 -> features ``(B, F)``.
FeatureFn = Callable[[Float32Array], npt.NDArray[np.floating]]

FEATURES = ("mean", "mean_abs_dev", "mean_abs_diff")

_T = TypeVar("_T", bound=np.generic)


def window_features(windows: Float32Array) -> Float32Array:
    """Compute the reference window features.

    Args:
        windows: Shape ``(B, W, C)``, float32, scaled.

    Returns:
        Shape ``(B, 3·C)``, float32: all channels' means, then mean absolute deviations, then
        mean |Δ|.

    >>> x = np.array([[[0.0], [2.0], [1.0]]], dtype=np.float32)
    >>> [round(float(v), 4) for v in window_features(x)[0]]
    [1.0, 0.6667, 1.5]
    """
    mean = windows.mean(axis=1)
    mean_abs_dev = np.abs(windows - windows.mean(axis=1, keepdims=True)).mean(axis=1)
    mad = np.abs(np.diff(windows, axis=1)).mean(axis=1)
    return np.concatenate([mean, mean_abs_dev, mad], axis=1).astype(np.float32)


def sliding_windows(samples: npt.NDArray[_T], window: int) -> npt.NDArray[_T]:
    """Every window of ``window`` consecutive rows (hop 1).

    Args:
        samples: Shape ``(N, C)``.
        window: W ≤ N.

    Returns:
        Shape ``(N − W + 1, W, C)``, same dtype; window k ends at row k + W − 1.

    >>> sliding_windows(np.arange(4.0).reshape(4, 1), 3)[:, :, 0].tolist()
    [[0.0, 1.0, 2.0], [1.0, 2.0, 3.0]]
    """
    idx = np.arange(samples.shape[0] - window + 1)[:, None] + np.arange(window)[None, :]
    return samples[idx]


@dataclass(frozen=True, slots=True)
class Scaler:
    """z = (x − mean) / scale, per channel.

    Attributes:
        mean: Shape ``(C,)``, float64, channel units.
        scale: Shape ``(C,)``, float64, channel units, > 0.
    """

    mean: FloatArray
    scale: FloatArray

    def apply(self, windows: npt.NDArray[np.floating]) -> Float32Array:
        """Scale raw windows ``(..., C)`` to float32."""
        return ((windows - self.mean) / self.scale).astype(np.float32)


def fit_scaler(samples: FloatArray, floor: FloatArray) -> Scaler:
    """Fit per-channel mean and std, the std floored at ``floor``.

    Args:
        samples: Shape ``(N, C)``, float64, N ≥ 2.
        floor: Shape ``(C,)``, > 0: lower bound of the scale (a flat channel during calibration
            would otherwise turn sensor noise into huge z values).

    Raises:
        ValueError: fewer than 2 samples, shape mismatch, or a non-positive floor.

    >>> s = fit_scaler(np.array([[1.0, 5.0], [3.0, 5.0]]), np.array([0.1, 0.5]))
    >>> s.mean.tolist(), s.scale.tolist()
    ([2.0, 5.0], [1.0, 0.5])
    """
    if samples.ndim != 2 or samples.shape[0] < 2 or samples.shape[1] != floor.shape[0]:
        raise ValueError(f"need (N>=2, {floor.shape[0]}) samples, got {samples.shape}")
    if np.any(floor <= 0):
        raise ValueError("scale floor must be > 0")
    return Scaler(samples.mean(axis=0), np.maximum(samples.std(axis=0), floor))


@dataclass(frozen=True, slots=True)
class FeatureStats:
    """Per-feature mean and std over the calibration windows (std floored), shapes ``(F,)``."""

    mean: FloatArray
    std: FloatArray


def fit_feature_stats(features: FloatArray, floor: FloatArray) -> FeatureStats:
    """Fit per-feature mean and floored std.

    Args:
        features: Shape ``(K, F)``, K ≥ 2 calibration windows.
        floor: Shape ``(F,)``, ≥ 0; a tiny epsilon is added so the std is never 0.

    Raises:
        ValueError: fewer than 2 windows or shape mismatch.
    """
    if features.ndim != 2 or features.shape[0] < 2 or features.shape[1] != floor.shape[0]:
        raise ValueError(f"need (K>=2, {floor.shape[0]}) features, got {features.shape}")
    std = np.maximum(features.std(axis=0), floor) + 1e-9
    return FeatureStats(features.mean(axis=0), std)


def fit_threshold(scores: FloatArray, quantile: float, factor: float) -> float:
    """threshold = quantile(scores, ``quantile``) × ``factor``.

    Raises:
        ValueError: no scores, a quantile outside (0, 1] or a non-positive factor.

    >>> fit_threshold(np.array([1.0, 2.0, 4.0]), 1.0, 1.5)
    6.0
    """
    if scores.size == 0 or not 0 < quantile <= 1 or factor <= 0:
        raise ValueError(f"bad threshold fit: n={scores.size} q={quantile} factor={factor}")
    return float(np.quantile(scores, quantile) * factor)


def deviation_scores(
    features: FloatArray, stats: FeatureStats, top_k: int
) -> tuple[FloatArray, FloatArray]:
    """Feature-deviation scores.

    Args:
        features: Shape ``(K, F)``.
        stats: Calibration feature statistics.
        top_k: How many of the largest |z| are averaged (capped at F).

    Returns:
        (scores ``(K,)``, |z| ``(K, F)``), float64.

    >>> st = FeatureStats(np.zeros(3), np.ones(3))
    >>> deviation_scores(np.array([[1.0, -4.0, 2.0]]), st, 2)[0].tolist()
    [3.0]
    """
    z = np.abs((features - stats.mean) / stats.std)
    k = min(top_k, z.shape[1])
    top = np.partition(z, z.shape[1] - k, axis=1)[:, -k:]
    return top.mean(axis=1), z


@dataclass(frozen=True, slots=True)
class CalibrationFit:
    """A calibration fitted on raw samples.

    Attributes:
        scaler: Input scaler.
        features: Feature statistics.
        threshold: Score threshold.
        scores: Shape ``(K,)``, the calibration windows' scores.
    """

    scaler: Scaler
    features: FeatureStats
    threshold: float
    scores: FloatArray


def fit_calibration(
    samples: FloatArray,
    model: FeatureFn,
    *,
    window: int,
    scale_floor: FloatArray,
    feature_std_floor: FloatArray,
    top_k: int,
    quantile: float,
    factor: float,
    holdout: float = 0.0,
) -> CalibrationFit:
    """Fit scaler, feature statistics and threshold on raw ``samples`` (``(N, C)``).

    Every window of W consecutive samples (hop 1) inside ``samples`` is a calibration window.
    With ``holdout`` = h > 0 the threshold is fitted on the held-out scores described in the
    module docstring (and ``CalibrationFit.scores`` holds those); with h = 0 on the calibration
    windows' own scores.

    Raises:
        ValueError: fewer than W + 1 samples, a channel count mismatch, h outside [0, 0.9], or
            a hold-out that leaves fewer than 2·W fit or W held-out samples.
        Whatever ``model`` raises.
    """
    if samples.ndim != 2 or samples.shape[0] < window + 1:
        raise ValueError(f"calibration needs at least {window + 1} samples, got {samples.shape}")
    if not 0.0 <= holdout <= 0.9:
        raise ValueError(f"hold-out fraction {holdout} outside [0, 0.9]")
    scaler = fit_scaler(samples, scale_floor)
    windows = sliding_windows(samples, window).astype(np.float32)
    feats = np.asarray(model(scaler.apply(windows)), dtype=np.float64)
    stats = fit_feature_stats(feats, feature_std_floor)
    scores = deviation_scores(feats, stats, top_k)[0]
    if holdout > 0:
        scores = holdout_scores(samples, model, window=window, scale_floor=scale_floor,
                                feature_std_floor=feature_std_floor, top_k=top_k,
                                holdout=holdout)
    return CalibrationFit(scaler, stats, fit_threshold(scores, quantile, factor), scores)


def holdout_scores(
    samples: FloatArray,
    model: FeatureFn,
    *,
    window: int,
    scale_floor: FloatArray,
    feature_std_floor: FloatArray,
    top_k: int,
    holdout: float,
) -> FloatArray:
    """Out-of-sample calibration scores: scaler and statistics fitted on the first
    m = round((1 − h)·N) samples score every window inside samples m..N−1.

    Args:
        samples: ``(N, C)`` raw calibration samples.
        holdout: h in (0, 0.9].

    Returns:
        ``(N − m − W + 1,)`` float64 scores.

    Raises:
        ValueError: fewer than 2·W fit samples or fewer than W held-out samples.
        Whatever ``model`` raises.

    >>> rng = np.random.default_rng(0)
    >>> x = rng.normal(size=(100, 2))
    >>> s = holdout_scores(x, window_features, window=5, scale_floor=np.full(2, 0.1),
    ...                    feature_std_floor=np.full(6, 0.01), top_k=2, holdout=0.25)
    >>> s.shape
    (21,)
    """
    n = samples.shape[0]
    fit = round(n * (1.0 - holdout))
    if fit < 2 * window or n - fit < window:
        raise ValueError(f"hold-out {holdout} of {n} samples leaves too few for W={window}")
    scaler = fit_scaler(samples[:fit], scale_floor)
    windows = sliding_windows(samples, window).astype(np.float32)
    feats = np.asarray(model(scaler.apply(windows)), dtype=np.float64)
    stats = fit_feature_stats(feats[: fit - window + 1], feature_std_floor)
    return deviation_scores(feats[fit:], stats, top_k)[0]
