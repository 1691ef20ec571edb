"""On-device calibration: fit the input scaler, the feature statistics and the threshold.

The protocol is SKAB's (Katser & Kozitsin, 2020): fit scaler, model statistics and threshold on the
first N samples of each stream (N = 400 there), with no labels, and score what follows.

The formulas live in :mod:`cloud_sync.calibration` (pure NumPy) because the fleet fits the same
calibration on a device's uploaded samples when it retrains that device's model; this module
re-exports them for the pipeline.
"""

from __future__ import annotations

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

__all__ = [
    "CalibrationFit",
    "FeatureStats",
    "Scaler",
    "deviation_scores",
    "fit_calibration",
    "fit_feature_stats",
    "fit_scaler",
    "fit_threshold",
    "sliding_windows",
]
