"""Window features: the NumPy reference of what the shipped ONNX window-statistics model computes.

Defined in :mod:`cloud_sync.calibration` (the fleet's trainer checks its artefacts against the
same reference) and re-exported here: per channel, feature-major, the window ``mean``, the
``mean_abs_dev`` (mean absolute deviation) and the ``mean_abs_diff`` (mean absolute first
difference). The agent runs the model artefact; this reference is used by the recipe and the
tests that check the artefacts against it.
"""

from __future__ import annotations

from cloud_sync.calibration import FEATURES, window_features

__all__ = ["FEATURES", "window_features"]
