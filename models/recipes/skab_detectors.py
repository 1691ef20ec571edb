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

Two ``wstat`` variants aimed at normal operation that drifts past what the first N rows showed:

* **Robust calibration statistics** (``robust``): the input scaler and the feature statistics
  are the median and 1.4826 × the median absolute deviation (Huber, "Robust Statistics", 1981,
  the MAD's consistency constant for a normal distribution) instead of the mean and std, with
  the same floors.
* **Bounded level adaptation** (``adapt_rate`` α > 0, ``drift_bound`` B): the multichannel form
  of the univariate package's adaptation (:mod:`agent.pipeline.univariate`), per channel. A
  level offset d ``(C,)`` in calibration-scale units starts at 0; each test window is scored with
  its mean features minus d (the window's mean against the adapted baseline μ_cal + σ_cal·d;
  spread and roughness features are level-free and not adapted); after a window whose score is
  at most the threshold base's maximum (the worst score the calibration showed, = threshold /
  factor, so a window near or above the threshold never moves it), d ← clip(d + α·(m − d),
  −B, B), m the window's mean features (Roberts, "Control chart tests based on geometric moving
  averages", 1959). Windows are taken one at a time, in order. With B large this is close to a
  drift-invariant feature (the deviation from a slow EWMA baseline), except that it freezes
  while the score is high. The scoring is the agent's own
  (:func:`agent.pipeline.drift.adapted_scores`), so a package with this adaptation in its
  manifest scores as the candidate did.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from agent.pipeline.drift import LevelAdaptation, adapted_scores
from cloud_sync.calibration import sliding_windows, window_features

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
#: A fitted detector: values ``(T, C)`` -> the score of every window ``(T − W + 1,)``.
Scorer = Callable[[FloatArray], FloatArray]

DETECTORS = ("wstat", "pca", "mset")


@dataclass(frozen=True, slots=True)
class FileScores:
    """Scores of one file: ``base`` ``(K,)`` threshold-base scores, ``test`` ``(T − N,)`` the
    scores of rows N..T−1 (row r scored by the window ending at r)."""

    base: FloatArray
    test: FloatArray


#: 1 / Φ⁻¹(3/4): 1.4826 × MAD estimates a normal distribution's std.
MAD_SCALE = 1.4826


def center_spread(x: FloatArray, robust: bool) -> tuple[FloatArray, FloatArray]:
    """Per column of ``x`` ``(K, F)``: (mean, std), or (median, :data:`MAD_SCALE` × MAD) when
    ``robust``; each ``(F,)``."""
    if not robust:
        return x.mean(0), x.std(0)
    med = np.median(x, axis=0)
    return med, MAD_SCALE * np.median(np.abs(x - med), axis=0)


def _scale(values: FloatArray, rows: int, floor: FloatArray, robust: bool = False) -> FloatArray:
    center, spread = center_spread(values[:rows], robust)
    return (values - center) / np.maximum(spread, floor)


def _top_k_mean(a: FloatArray, top_k: int) -> FloatArray:
    k = min(top_k, a.shape[1])
    out: FloatArray = np.partition(a, a.shape[1] - k, axis=1)[:, -k:].mean(1)
    return out


#: Features shared by the candidates of one fit: see :func:`wstat_scores`'s ``cache``.
FeatureCache = dict[tuple[object, ...], tuple[FloatArray, FloatArray, FloatArray]]


def wstat_scores(values: FloatArray, rows: int, window: int, top_k: int, floor: FloatArray,
                 feature_floor: FloatArray, *, robust: bool = False, adapt_rate: float = 0.0,
                 drift_bound: float = 0.0, adapt_level: float = -np.inf,
                 cache: FeatureCache | None = None) -> FloatArray:
    """Window-statistics scores with scaler and feature statistics fitted on ``values[:rows]``.

    Args:
        values: Shape ``(T, C)``, channel units.
        rows: Fit rows (the windows inside them are the calibration windows).
        window: W.
        top_k: |z| values averaged.
        floor: ``(C,)`` input scale floor; feature_floor: ``(3·C,)`` feature std floor.
        robust: median / MAD statistics (module docstring).
        adapt_rate, drift_bound, adapt_level: bounded level adaptation of the windows after the
            calibration windows (module docstring); ``adapt_level`` is the score at or below
            which a window moves the baseline. ``adapt_rate`` 0: none.
        cache: Keeps the features and their deviations between calls that differ only in
            ``top_k`` and the adaptation (the same rows of the same array, fit, floors and
            statistics); None: none kept.

    Returns:
        ``(T − W + 1,)``: score of the window ending at row j + W − 1.
    """
    hit = wstat_parts(values, rows, window, floor, feature_floor, robust, cache)
    feats, a, std = hit
    k_cal = rows - window + 1
    scores = _top_k_mean(np.abs(a), top_k)
    if adapt_rate > 0:
        c = values.shape[1]
        scores[k_cal:] = adapted_scores(a[k_cal:], feats[k_cal:, :c], 1.0 / std[:c], np.zeros(c),
                                        top_k, LevelAdaptation(adapt_rate, drift_bound),
                                        adapt_level)[0]
    return scores


def wstat_parts(values: FloatArray, rows: int, window: int, floor: FloatArray,
                feature_floor: FloatArray, robust: bool = False,
                cache: FeatureCache | None = None) -> tuple[FloatArray, FloatArray, FloatArray]:
    """The window statistics of :func:`wstat_scores` before the top-k: (features ``(K, 3·C)``,
    their signed deviations from the calibration ``(K, 3·C)``, the feature std ``(3·C,)``),
    K = T − W + 1, fitted on ``values[:rows]``; ``cache`` as there."""
    key = (values.__array_interface__["data"][0], values.shape, rows, window, robust,
           floor.tobytes(), feature_floor.tobytes())
    hit = cache.get(key) if cache is not None else None
    if hit is None:
        z = _scale(values, rows, floor, robust).astype(np.float32)
        feats = window_features(sliding_windows(z, window)).astype(np.float64)
        center, spread = center_spread(feats[: rows - window + 1], robust)
        std = np.maximum(spread, feature_floor) + 1e-9
        hit = (feats, (feats - center) / std, std)
        if cache is not None:
            cache[key] = hit
    return hit


def adapted_scores_many(z: FloatArray, means: FloatArray, inv_std: FloatArray,
                        series: IntArray, top_k: IntArray, rate: FloatArray,
                        bound: FloatArray, level: FloatArray) -> FloatArray:
    """:func:`agent.pipeline.drift.adapted_scores` for B runs at once, each from offset 0: run b
    scores series ``series[b]`` with its own top-k, α, B and adaptation level. The windows are
    still taken one at a time, in order (one NumPy step per window for all runs); the scores
    equal the agent's up to the order of the top-k's summation (float64 rounding).

    Args:
        z: ``(S, K, F)`` signed standardised feature deviations of S series, the C mean
            features first (pad shorter series with zeros; their padded scores mean nothing).
        means: ``(S, K, C)`` the windows' mean features.
        inv_std: ``(S, C)`` 1 / the mean features' calibration std.
        series: ``(B,)`` the series of each run; top_k ``(B,)`` ≥ 1; rate, bound, level ``(B,)``.

    Returns:
        ``(B, K)`` float64 scores.
    """
    c = means.shape[2]
    kmax = int(top_k.max())
    # per window, every series: the adapted features' inputs and the level-free top kmax
    zc = np.ascontiguousarray(z[:, :, :c].transpose(1, 0, 2))
    mc = np.ascontiguousarray(means.transpose(1, 0, 2))
    rest = np.ascontiguousarray(
        (-np.sort(-np.abs(z[:, :, c:]), axis=2))[:, :, :kmax].transpose(1, 0, 2))
    inv = inv_std[series]
    runs = np.arange(series.shape[0])
    kth = top_k - 1
    low, high = -bound[:, None], bound[:, None]
    rate2 = rate[:, None]
    d = np.zeros((series.shape[0], c))
    out = np.empty((series.shape[0], z.shape[1]))
    row = np.empty((series.shape[0], c + kmax))
    for j in range(z.shape[1]):
        np.abs(zc[j][series] - d * inv, out=row[:, :c])
        row[:, c:] = rest[j][series]
        top = np.cumsum(-np.sort(-row, axis=1), axis=1)[runs, kth] / top_k
        out[:, j] = top
        move = top <= level
        if move.any():
            step = np.minimum(np.maximum(d + rate2 * (mc[j][series] - d), low), high)
            d = np.where(move[:, None], step, d)
    return out


def pca_scores(values: FloatArray, rows: int, window: int, var: float,
               floor: FloatArray) -> FloatArray:
    """Lagged-window PCA score max(T²/T²₉₉, Q/Q₉₉), fitted on ``values[:rows]``; shape as
    :func:`wstat_scores`."""
    return pca_fit(values, rows, window, var, floor)(values)


def pca_fit(values: FloatArray, rows: int, window: int, var: float,
            floor: FloatArray) -> Scorer:
    """:func:`pca_scores`' fit on ``values[:rows]``, as a function scoring any ``(T, C)`` array
    with it (the rows after the fit may differ from ``values``')."""
    center, spread = center_spread(values[:rows], False)
    scale = np.maximum(spread, floor)

    def lags(v: FloatArray) -> FloatArray:
        z = (v - center) / scale
        out: FloatArray = sliding_windows(z, window).reshape(-1, window * z.shape[1])
        return out

    x = lags(values[:rows])
    mu = x.mean(0)
    _, s, vt = np.linalg.svd(x - mu, full_matrices=False)
    ev = s**2 / (x.shape[0] - 1) + 1e-12
    r = int(np.searchsorted(np.cumsum(ev) / ev.sum(), var) + 1)

    def parts(v: FloatArray) -> tuple[FloatArray, FloatArray]:
        a = lags(v) - mu
        t = a @ vt[:r].T
        return (t**2 / ev[:r]).sum(1), ((a - t @ vt[:r]) ** 2).sum(1)

    t2c, qc = parts(values[:rows])
    t2_99, q99 = np.quantile(t2c, 0.99), np.quantile(qc, 0.99) + 1e-12

    def score(v: FloatArray) -> FloatArray:
        t2, q = parts(v)
        out: FloatArray = np.maximum(t2 / t2_99, q / q99)
        return out

    return score


def mset_scores(values: FloatArray, rows: int, window: int, memory: int,
                floor: FloatArray) -> FloatArray:
    """MSET-style residual norm on window means, memory fitted on ``values[:rows]``; shape as
    :func:`wstat_scores`."""
    return mset_fit(values, rows, window, memory, floor)(values)


def mset_fit(values: FloatArray, rows: int, window: int, memory: int,
             floor: FloatArray) -> Scorer:
    """:func:`mset_scores`' fit on ``values[:rows]``, as a function scoring any ``(T, C)``
    array with it."""
    center, spread = center_spread(values[:rows], False)
    scale = np.maximum(spread, floor)

    def means(v: FloatArray) -> FloatArray:
        out: FloatArray = sliding_windows((v - center) / scale, window).mean(1)
        return out

    cal = means(values[:rows])
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
        out: FloatArray = np.exp(-d2 / (2 * h * h))
        return out

    g = np.linalg.pinv(sim(mem, mem) + 1e-6 * np.eye(mem.shape[0]))

    def score(v: FloatArray) -> FloatArray:
        x = means(v)
        w = sim(x, mem) @ g
        w = w / np.maximum(w.sum(1, keepdims=True), 1e-9)
        out: FloatArray = np.linalg.norm(x - w @ mem, axis=1)
        return out

    return score


def file_scores(detector: str, values: FloatArray, n: int, window: int, param: float,
                holdout: float, floor: FloatArray, feature_floor: FloatArray, *,
                robust: bool = False, adapt_rate: float = 0.0,
                drift_bound: float = 0.0, cache: FeatureCache | None = None) -> FileScores:
    """Threshold-base and test scores of one file (see the module docstring).

    Args:
        detector: One of :data:`DETECTORS`.
        values: ``(T, C)``, T > n.
        n: Calibration rows N.
        window: W.
        param: ``top_k`` (wstat), explained variance (pca) or memory size (mset).
        holdout: Fraction h of the N rows held out for the threshold base, 0 ≤ h < 1.
        robust, adapt_rate, drift_bound: the ``wstat`` variants (module docstring); the
            threshold-base scores are never adapted, and their maximum is the adaptation level.
        cache: ``wstat``: passed to :func:`wstat_scores` (one per file, fit and floors).

    Raises:
        ValueError: an unknown detector, a variant of a detector other than ``wstat``, or too
            few rows for the hold-out.
    """
    if detector != "wstat" and (robust or adapt_rate > 0):
        raise ValueError(f"{detector}: robust statistics and adaptation are wstat variants")

    def run(rows: int, upto: int, level: float | None = None) -> FloatArray:
        vals = values[:upto]
        if detector == "wstat":
            if level is None:
                return wstat_scores(vals, rows, window, int(param), floor, feature_floor,
                                    robust=robust, cache=cache)
            return wstat_scores(vals, rows, window, int(param), floor, feature_floor,
                                robust=robust, adapt_rate=adapt_rate, drift_bound=drift_bound,
                                adapt_level=level, cache=cache)
        if detector == "pca":
            return pca_scores(vals, rows, window, param, floor)
        if detector == "mset":
            return mset_scores(vals, rows, window, int(param), floor)
        raise ValueError(f"unknown detector {detector!r}")

    full: FloatArray | None
    if holdout <= 0:
        full = run(n, values.shape[0])
        base = full[: n - window + 1]
    else:
        fit = round(n * (1 - holdout))
        if fit < 2 * window or n - fit < window:
            raise ValueError(f"hold-out {holdout} leaves too few rows of {n} for W={window}")
        base = run(fit, n)[fit:]
        full = run(n, values.shape[0]) if adapt_rate <= 0 else None
    if adapt_rate > 0:
        full = run(n, values.shape[0], float(base.max()))
    assert full is not None
    return FileScores(base, full[n - window + 1:])
