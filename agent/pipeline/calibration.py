"""On-device calibration: fit the input scaler, the feature statistics and the threshold.

The protocol is SKAB's (Katser & Kozitsin, 2020): fit scaler, model statistics and threshold on the
first N samples of each stream (N = 400 there), with no labels, and score what follows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agent.records import FloatArray


@dataclass(frozen=True, slots=True)
class Scaler:
    """z = (x − mean) / scale, per channel.

    Attributes:
        mean: Shape ``(C,)``, float64, channel units.
        scale: Shape ``(C,)``, float64, channel units, > 0.
    """

    mean: FloatArray
    scale: FloatArray


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
