"""Bounded level adaptation: a baseline that follows slow normal drift, but not a fault.

One rule, used by both stream kinds:

* **The step** (:func:`follow_level`): after a quiet window, the level ℓ moves toward that
  window's mean m by α and is clipped to a bound: ℓ ← clip(ℓ + α·(m − ℓ), low, high) (an EWMA of
  the quiet windows' means; Roberts, "Control chart tests based on geometric moving averages",
  1959). The univariate pipeline (:mod:`agent.pipeline.univariate`) applies it to its baseline
  μ in channel units, bounded at μ_cal ± B·σ_cal.
* **Per channel, window by window** (:func:`adapted_scores`, a multichannel package whose
  manifest has ``score.adaptation``): the level offset d ``(C,)`` is in calibration sigmas
  (the scaled input's units) and starts at 0, bounded at ±B. Each window's mean features are
  scored against it: their standardised deviation becomes (m − mean_cal − d) / std_cal, which is
  the window's mean against the adapted baseline μ_cal + σ_cal·d. The spread and roughness
  features do not depend on the level and are not adapted (a change of noise is a fault
  signature). After a window whose score is at most the threshold base's quantile (threshold /
  factor: the worst score the calibration showed), d takes the step toward the window's mean
  features. A window near or above the threshold never moves d, and d never leaves ±B, so a
  slow fault is followed at most B sigmas and then scores as it grows.

The windows are taken one at a time, in order, so a stream's result does not depend on how its
readings were split into blocks. The model package recipe's selection
(``models/recipes/skab_detectors.py``) scores its candidates with this same function, so the
figures it chose on are the agent's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agent.records import FloatArray


@dataclass(frozen=True, slots=True)
class LevelAdaptation:
    """Per-channel level adaptation of a multichannel package (manifest ``score.adaptation``).

    Attributes:
        rate: α in (0, 1], per scored window.
        bound: B > 0, the largest offset, in calibration sigmas.
    """

    rate: float
    bound: float


def follow_level(level: FloatArray | float, target: FloatArray | float, rate: float,
                 low: FloatArray | float, high: FloatArray | float) -> FloatArray:
    """One bounded EWMA step: clip(``level`` + ``rate``·(``target`` − ``level``), low, high).

    Args:
        level, target, low, high: Scalars or arrays of one shape, one unit.

    >>> float(follow_level(0.0, 10.0, 0.5, -3.0, 3.0))
    3.0
    """
    step: FloatArray = np.minimum(np.maximum(
        np.add(level, rate * np.subtract(target, level)), low), high)
    return step


def adapted_scores(z: FloatArray, means: FloatArray, inv_std: FloatArray, offset: FloatArray,
                   top_k: int, adaptation: LevelAdaptation, level: float
                   ) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Scores of K windows in order, the mean features taken against the adapted level.

    Args:
        z: ``(K, F)`` signed standardised feature deviations against the calibration, the C
            mean features first (feature-major).
        means: ``(K, C)`` the windows' mean features (scaled input, calibration sigmas).
        inv_std: ``(C,)`` 1 / the mean features' calibration std.
        offset: ``(C,)`` the level offset d at the first window.
        top_k: |z| values averaged into a score.
        adaptation: α and B.
        level: A window scoring at most this moves d (the threshold base's quantile).

    Returns:
        (scores ``(K,)``, adapted |z| ``(K, F)``, d after the last window ``(C,)``), float64.
    """
    c = offset.shape[0]
    out = np.empty(z.shape[0])
    absz = np.abs(z)
    d = np.array(offset, dtype=np.float64)
    k = min(top_k, z.shape[1])
    rest = -np.sort(-absz[:, c:], axis=1)[:, :k]  # the level-free features' top k
    row = np.empty(c + rest.shape[1])  # this window's adapted mean |z|, then ``rest``
    kth = row.size - k
    rate, low, high = adaptation.rate, -adaptation.bound, adaptation.bound
    for j in range(z.shape[0]):
        np.abs(z[j, :c] - d * inv_std, out=row[:c])
        row[c:] = rest[j]
        s = float(np.add.reduce(np.partition(row, kth)[kth:]) / k)  # the top k's mean
        out[j] = s
        absz[j, :c] = row[:c]
        if s <= level:
            d = follow_level(d, means[j], rate, low, high)
    return out, absz, d
