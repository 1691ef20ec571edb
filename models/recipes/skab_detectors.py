"""Candidate SKAB detectors for model selection (NumPy references, no I/O).

Every detector follows SKAB's per-file protocol (Katser & Kozitsin, 2020): it is fitted on the
first N rows of one file with no labels and scores every later row with the window that ends at
that row. Each returns, per file, the *threshold base* scores (the calibration scores the
threshold rule is fitted on) and the test scores; the threshold is ``max(base) × factor``.

Detectors:

* ``wstat``: the shipped window statistics (mean, mean absolute deviation, mean |Δ| per channel;
  :func:`cloud_sync.calibration.window_features`), each standardised against its calibration
  statistics, score = mean of the ``top_k`` largest |z|.
* ``pca``: lagged-window PCA (the W × C lag vector; MacGregor & Kourti, "Statistical process
  control of multivariate processes", 1995): Hotelling's T² on the components that explain
  ``param`` of the variance and the residual Q (SPE), each divided by its 99th calibration
  percentile, score = max of the two.
* ``mset``: MSET-style similarity estimation (Gross et al., "Application of a model-based fault
  detection system to nuclear plant signals", 1997): a memory of ``param`` calibration states
  chosen by min-max ordering, a Gaussian similarity operator, the estimate is the
  similarity-weighted memory state, score = ‖x − x̂‖ on window means.

Threshold base (``holdout``): 0 = the in-sample calibration scores (the statistics fitted on all
N rows score the same rows; what the agent did up to package v1). h > 0 = *held-out* calibration
scores: the statistics are fitted on the first (1 − h)·N rows and score the windows inside the last
h·N rows, so the base scores show how far normal operation drifts past a fit, the same way the
test rows will; the test scores still use statistics fitted on all N rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from cloud_sync.calibration import sliding_windows, window_features

FloatArray = npt.NDArray[np.float64]

DETECTORS = ("wstat", "pca", "mset")


@dataclass(frozen=True, slots=True)
class FileScores:
    """Scores of one file: ``base`` ``(K,)`` threshold-base scores, ``test`` ``(T − N,)`` the
    scores of rows N..T−1 (row r scored by the window ending at r)."""

    base: FloatArray
    test: FloatArray


def _scale(values: FloatArray, rows: int, floor: FloatArray) -> FloatArray:
    seg = values[:rows]
    return (values - seg.mean(0)) / np.maximum(seg.std(0), floor)


def wstat_scores(values: FloatArray, rows: int, window: int, top_k: int, floor: FloatArray,
                 feature_floor: FloatArray) -> FloatArray:
    """Window-statistics scores with scaler and feature statistics fitted on ``values[:rows]``.

    Args:
        values: Shape ``(T, C)``, channel units.
        rows: Fit rows (the windows inside them are the calibration windows).
        window: W.
        top_k: |z| values averaged.
        floor: ``(C,)`` input scale floor; feature_floor: ``(3·C,)`` feature std floor.

    Returns:
        ``(T − W + 1,)``: score of the window ending at row j + W − 1.
    """
    z = _scale(values, rows, floor).astype(np.float32)
    feats = window_features(sliding_windows(z, window)).astype(np.float64)
    cal = feats[: rows - window + 1]
    std = np.maximum(cal.std(0), feature_floor) + 1e-9
    a = np.abs((feats - cal.mean(0)) / std)
    k = min(top_k, a.shape[1])
    return np.partition(a, a.shape[1] - k, axis=1)[:, -k:].mean(1)


def pca_scores(values: FloatArray, rows: int, window: int, var: float,
               floor: FloatArray) -> FloatArray:
    """Lagged-window PCA score max(T²/T²₉₉, Q/Q₉₉), fitted on ``values[:rows]``; shape as
    :func:`wstat_scores`."""
    z = _scale(values, rows, floor)
    x = sliding_windows(z, window).reshape(-1, window * z.shape[1])
    cal = x[: rows - window + 1]
    mu = cal.mean(0)
    _, s, vt = np.linalg.svd(cal - mu, full_matrices=False)
    ev = s**2 / (cal.shape[0] - 1) + 1e-12
    r = int(np.searchsorted(np.cumsum(ev) / ev.sum(), var) + 1)
    a = x - mu
    t = a @ vt[:r].T
    t2 = (t**2 / ev[:r]).sum(1)
    q = ((a - t @ vt[:r]) ** 2).sum(1)
    k = cal.shape[0]
    return np.maximum(t2 / np.quantile(t2[:k], 0.99), q / (np.quantile(q[:k], 0.99) + 1e-12))


def mset_scores(values: FloatArray, rows: int, window: int, memory: int,
                floor: FloatArray) -> FloatArray:
    """MSET-style residual norm on window means, memory fitted on ``values[:rows]``; shape as
    :func:`wstat_scores`."""
    z = _scale(values, rows, floor)
    x = sliding_windows(z, window).mean(1)
    cal = x[: rows - window + 1]
    idx = [int(np.argmax(np.linalg.norm(cal, axis=1)))]
    dist = np.linalg.norm(cal - cal[idx[0]], axis=1)
    for _ in range(min(memory, cal.shape[0]) - 1):
        i = int(np.argmax(dist))
        idx.append(i)
        dist = np.minimum(dist, np.linalg.norm(cal - cal[i], axis=1))
    mem = cal[idx]
    h = float(np.median(np.linalg.norm(mem[:, None] - mem[None], axis=2))) + 1e-9

    def sim(a: FloatArray, b: FloatArray) -> FloatArray:
        d2 = ((a[:, None, :] - b[None, :, :]) ** 2).sum(2)
        return np.exp(-d2 / (2 * h * h))

    g = np.linalg.pinv(sim(mem, mem) + 1e-6 * np.eye(mem.shape[0]))
    w = sim(x, mem) @ g
    w = w / np.maximum(w.sum(1, keepdims=True), 1e-9)
    return np.linalg.norm(x - w @ mem, axis=1)


def file_scores(detector: str, values: FloatArray, n: int, window: int, param: float,
                holdout: float, floor: FloatArray, feature_floor: FloatArray) -> FileScores:
    """Threshold-base and test scores of one file (see the module docstring).

    Args:
        detector: One of :data:`DETECTORS`.
        values: ``(T, C)``, T > n.
        n: Calibration rows N.
        window: W.
        param: ``top_k`` (wstat), explained variance (pca) or memory size (mset).
        holdout: Fraction h of the N rows held out for the threshold base, 0 ≤ h < 1.

    Raises:
        ValueError: an unknown detector, or too few rows for the hold-out.
    """
    def run(rows: int, upto: int) -> FloatArray:
        vals = values[:upto]
        if detector == "wstat":
            return wstat_scores(vals, rows, window, int(param), floor, feature_floor)
        if detector == "pca":
            return pca_scores(vals, rows, window, param, floor)
        if detector == "mset":
            return mset_scores(vals, rows, window, int(param), floor)
        raise ValueError(f"unknown detector {detector!r}")

    full = run(n, values.shape[0])
    if holdout <= 0:
        return FileScores(full[: n - window + 1], full[n - window + 1:])
    fit = round(n * (1 - holdout))
    if fit < 2 * window or n - fit < window:
        raise ValueError(f"hold-out {holdout} leaves too few rows of {n} for W={window}")
    part = run(fit, n)
    return FileScores(part[fit:], full[n - window + 1:])
