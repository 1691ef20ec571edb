"""On-device calibration: fit the input scaler, the feature statistics and the threshold.

The protocol is SKAB's (Katser & Kozitsin, 2020): fit scaler, model statistics and threshold on the
first N samples of each stream (N = 400 there), with no labels, and score what follows.

The formulas live in :mod:`cloud_sync.calibration` (pure NumPy) because the fleet fits the same
calibration on a device's uploaded samples when it retrains that device's model; this module
re-exports them for the pipeline.

Outliers (:func:`far_out_rows`): a calibration period holding a few readings far outside the
bulk of the others (a glitch, a unit error, ``1e20`` from a broken transmitter) would inflate
the scaler and with it every feature statistic and the threshold, hiding the faults that follow.
Such rows are rejected before the fit (counted, logged) and the calibration is fitted on the
rest.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from cloud_sync.calibration import (
    CalibrationFit,
    FeatureStats,
    Scaler,
    deviation_scores,
    fit_calibration,
    fit_feature_stats,
    fit_scaler,
    fit_threshold,
    sliding_windows,
)

#: Quantiles bounding the bulk of each channel's calibration readings ...
FENCE_QUANTILES = (0.05, 0.95)
#: ... and how many bulk widths beyond the bulk a reading is far out.
FENCE_WIDTHS = 10.0


def fence_floor(samples: npt.NDArray[np.float64],
                floor: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """The smallest bulk width :func:`far_out_rows` uses per channel: the package's scale floor,
    or, when larger, the channel's resolution (its smallest nonzero step between readings), so a
    quantized sensor that sat on one value while calibrating does not count its one-quantum
    steps as gross errors.

    Args:
        samples: Shape ``(N, C)``, float64, raw channel units.
        floor: Shape ``(C,)``, > 0.

    Returns:
        Shape ``(C,)``, float64.

    >>> x = np.full((400, 1), 20.0); x[::50] = 20.1
    >>> round(float(fence_floor(x, np.array([1e-9]))[0]), 6)
    0.1
    """
    steps = np.abs(np.diff(samples, axis=0))
    steps = np.where(np.isfinite(steps) & (steps > 0), steps, np.inf)
    quantum = steps.min(axis=0) if steps.shape[0] else np.full(samples.shape[1], np.inf)
    return np.maximum(floor, np.where(np.isfinite(quantum), quantum, 0.0))


def far_out_rows(
    samples: npt.NDArray[np.float64],
    floor: npt.NDArray[np.float64],
    *,
    quantiles: tuple[float, float] = FENCE_QUANTILES,
    widths: float = FENCE_WIDTHS,
) -> npt.NDArray[np.bool_]:
    """Rows of ``samples`` with a value far outside the bulk of its channel.

    Per channel, with ``lo``/``hi`` the ``quantiles`` of the column and
    ``w = max(hi - lo, floor)``, a value below ``lo - widths * w`` or above ``hi + widths * w``
    is far out (Tukey's fences, "Exploratory Data Analysis", 1977, with the quartiles widened to
    the 5th/95th percentiles and the factor from 1.5 to 10, so only gross errors qualify: about
    34 standard deviations for a Gaussian channel). The bulk is defined by quantiles, so up to
    5 % of outlying rows cannot move the fences; a channel alternating between two levels (a
    pump on and off) keeps both inside the bulk. A non-finite value is far out.

    Args:
        samples: Shape ``(N, C)``, float64, raw channel units.
        floor: Shape ``(C,)``, > 0, the smallest bulk width (the package's scale floor).

    Returns:
        Shape ``(N,)``, True for a far-out row.

    >>> x = np.array([[1.0], [1.1], [0.9], [1.05], [0.95]] * 8)
    >>> x[7] = 1e20
    >>> far_out_rows(x, np.array([0.01])).nonzero()[0].tolist()
    [7]
    >>> far_out_rows(np.array([[0.0], [5.0]] * 10), np.array([0.01])).any()
    np.False_
    """
    bad = np.logical_not(np.isfinite(samples).all(axis=1))
    if samples.shape[0] == 0 or bad.all():
        return bad
    lo, hi = np.quantile(samples[~bad], quantiles, axis=0)
    width = np.maximum(hi - lo, floor)
    with np.errstate(invalid="ignore"):  # non-finite rows are already marked
        far = (samples < lo - widths * width) | (samples > hi + widths * width)
    out: npt.NDArray[np.bool_] = bad | far.any(axis=1)
    return out


__all__ = [
    "FENCE_QUANTILES",
    "FENCE_WIDTHS",
    "CalibrationFit",
    "FeatureStats",
    "Scaler",
    "deviation_scores",
    "far_out_rows",
    "fence_floor",
    "fit_calibration",
    "fit_feature_stats",
    "fit_scaler",
    "fit_threshold",
    "sliding_windows",
]
