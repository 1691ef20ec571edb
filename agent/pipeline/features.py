"""Window features: the NumPy reference of what the shipped ONNX window-statistics model computes.

For a scaled window x of shape ``(W, C)`` the model emits, per channel c (feature-major order):

* ``mean``: (1/W) Σ_t x[t, c]
* ``mean_abs_dev``: (1/W) Σ_t |x[t, c] − mean_c|  (mean absolute deviation; chosen over the
  standard deviation because it quantizes to int8 without squaring the range)
* ``mean_abs_diff``: (1/(W−1)) Σ_t |x[t+1, c] − x[t, c]|  (mean absolute first difference,
  a roughness measure; Hjorth, "EEG analysis based on time domain properties", 1970, uses the
  same first-difference idea for his mobility parameter)

The agent runs the model artefact; this reference is used by the recipe and the tests that check
the artefacts against it.
"""

from __future__ import annotations

import numpy as np

from agent.records import Float32Array

FEATURES = ("mean", "mean_abs_dev", "mean_abs_diff")


def window_features(windows: Float32Array) -> Float32Array:
    """Compute the reference features.

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
