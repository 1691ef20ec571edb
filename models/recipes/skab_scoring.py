"""The grouped SKAB selection's scores (:mod:`skab_select` declares the grid), one fit at a time:
family, window W and floor fraction, over every series the study scores.

Series: the labelled files, their copies without one calibration row (the outlier requirement,
:func:`skab_checks.outlier_series`), and the ramped copies of their first rows (the slow-ramp
requirement, :func:`skab_checks.ramp_series`). The scores are
:func:`skab_detectors.file_scores`' (``tests/unit/test_skab_checks.py`` compares them),
computed together so that one fit's work is shared:

* the features of the N calibration rows' fit serve every threshold base, top-k and variant;
* a ramped copy shares its file's calibration (the ramp starts after it), so its threshold is
  its file's and only its scores after the calibration are computed;
* the bounded level adaptation (:func:`skab_detectors.adapted_scores_many`) runs every series,
  top-k, α and B of one threshold base together, one NumPy step per window.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent))

import skab_select as sel
from skab_detectors import (
    FeatureCache,
    FileScores,
    Scorer,
    adapted_scores_many,
    mset_fit,
    pca_fit,
    wstat_parts,
)

FloatArray = npt.NDArray[np.float64]
#: (param, holdout, series name, variant): one series' scores at one grid point of a fit.
Key = tuple[float, float, str, tuple[float, float, float]]


@dataclass(frozen=True, slots=True)
class Series:
    """One scored sequence: ``values`` ``(T, C)`` calibrated on its first ``n`` rows."""

    values: FloatArray
    n: int


@dataclass(frozen=True, slots=True)
class Ramps:
    """The ramped copies of one file's first rows (:func:`skab_checks.ramp_series`):
    ``values`` ``(V, stop, C)``, calibrated on the first ``n`` rows (the file's); the scores
    kept are those of the windows ending at rows n..stop−1."""

    values: FloatArray
    n: int


def fit_rows(n: int, holdout: float, window: int) -> int:
    """Rows m a held-out threshold base fits on (:func:`skab_detectors.file_scores`).

    Raises:
        ValueError: too few rows for the hold-out.
    """
    m = round(n * (1 - holdout))
    if m < 2 * window or n - m < window:
        raise ValueError(f"hold-out {holdout} leaves too few rows of {n} for W={window}")
    return m


def _top_k_mean(a: FloatArray, top_k: int) -> FloatArray:
    """Mean of the ``top_k`` largest of each row's last axis (as the agent and
    :func:`skab_detectors.wstat_scores`)."""
    k = min(top_k, a.shape[-1])
    out: FloatArray = np.partition(a, a.shape[-1] - k, axis=-1)[..., -k:].mean(-1)
    return out


def score_fit(family: str, window: int, floor: FloatArray, feature_floor: FloatArray,
              series: dict[str, Series], ramps: dict[str, Ramps]
              ) -> tuple[dict[Key, FileScores], dict[Key, FloatArray]]:
    """Every grid point of ``family`` at ``window`` and these floors, on every series.

    Args:
        family: A :data:`skab_select.GRID` family.
        floor: ``(C,)`` input scale floor; feature_floor: ``(3·C,)`` feature std floor.
        series: name -> series; ramps: file name (a key of ``series``) -> its ramped copies.

    Returns:
        (``Key`` -> the series' :class:`FileScores`; ``Key`` (the file's name) -> ``(V, stop − n)``
        the ramped copies' scores after the calibration).

    Raises:
        ValueError: a hold-out leaves too few rows.
    """
    if sel.detector_of(family) == "wstat":
        return _wstat(family, window, floor, feature_floor, series, ramps)
    return _fitted(family, window, floor, series, ramps)


def _fitted(family: str, window: int, floor: FloatArray, series: dict[str, Series],
            ramps: dict[str, Ramps]) -> tuple[dict[Key, FileScores], dict[Key, FloatArray]]:
    """PCA and MSET: one fit on the N rows scores the series and its ramps for every base."""
    g = sel.GRID[family]
    var = (0.0, 0.0, 0.0)

    def fit(values: FloatArray, rows: int, param: float) -> Scorer:
        if family == "pca":
            return pca_fit(values, rows, window, param, floor)
        return mset_fit(values, rows, window, int(param), floor)

    out: dict[Key, FileScores] = {}
    ramp_out: dict[Key, FloatArray] = {}
    for name, s in series.items():
        k_cal = s.n - window + 1
        for p in g["param"]:
            scorer = fit(s.values, s.n, p)
            full = scorer(s.values)
            rs = None
            if name in ramps:
                r = ramps[name]
                rs = np.stack([scorer(v)[r.n - window + 1:] for v in r.values])
            for h in g["holdout"]:
                if h <= 0:
                    base = full[:k_cal]
                else:
                    m = fit_rows(s.n, h, window)
                    base = fit(s.values[:s.n], m, p)(s.values[:s.n])[m:]
                out[(p, h, name, var)] = FileScores(base, full[k_cal:])
                if rs is not None:
                    ramp_out[(p, h, name, var)] = rs
    return out, ramp_out


@dataclass(frozen=True, slots=True)
class _Parts:
    """One series' window statistics after its calibration: signed deviations ``(K, F)``, the
    mean features ``(K, C)`` and 1 / their calibration std ``(C,)``."""

    z: FloatArray
    means: FloatArray
    inv_std: FloatArray


def _wstat(family: str, window: int, floor: FloatArray, feature_floor: FloatArray,
           series: dict[str, Series], ramps: dict[str, Ramps]
           ) -> tuple[dict[Key, FileScores], dict[Key, FloatArray]]:
    """The window statistics and their variants."""
    g = sel.GRID[family]
    variants = sel.variants(family)
    out: dict[Key, FileScores] = {}
    ramp_out: dict[Key, FloatArray] = {}
    c = next(iter(series.values())).values.shape[1]
    for robust in sorted({v[0] for v in variants}):
        caches: dict[str, FeatureCache] = {name: {} for name in series}
        parts: dict[str, _Parts] = {}
        for name, s in series.items():
            feats, dev, std = wstat_parts(s.values, s.n, window, floor, feature_floor,
                                          bool(robust), caches[name])
            k_cal = s.n - window + 1
            parts[name] = _Parts(dev[k_cal:], feats[k_cal:, :c], 1.0 / std[:c])
        ramp_parts: dict[str, _Parts] = {}
        for name, r in ramps.items():
            got = [wstat_parts(v, r.n, window, floor, feature_floor, bool(robust))
                   for v in r.values]
            k_cal = r.n - window + 1
            ramp_parts[name] = _Parts(np.stack([d[k_cal:] for _, d, _ in got]),
                                      np.stack([f[k_cal:, :c] for f, _, _ in got]),
                                      parts[name].inv_std)
        plain = (robust, 0.0, 0.0) in variants
        adapted = [(a, b) for r_, a, b in variants if r_ == robust and a > 0]
        for h in g["holdout"]:
            bases: dict[tuple[str, float], FloatArray] = {}
            for name, s in series.items():
                if h <= 0:
                    _, a_fit, _ = wstat_parts(s.values, s.n, window, floor, feature_floor,
                                              bool(robust), caches[name])
                    a_base = a_fit[: s.n - window + 1]
                else:
                    m = fit_rows(s.n, h, window)
                    _, a_fit, _ = wstat_parts(s.values[:s.n], m, window, floor, feature_floor,
                                              bool(robust), caches[name])
                    a_base = a_fit[m:]
                absz = np.abs(parts[name].z)
                for p in g["param"]:
                    base = _top_k_mean(np.abs(a_base), int(p))
                    bases[(name, p)] = base
                    if plain:
                        out[(p, h, name, (robust, 0.0, 0.0))] = FileScores(
                            base, _top_k_mean(absz, int(p)))
                        if name in ramp_parts:
                            ramp_out[(p, h, name, (robust, 0.0, 0.0))] = _top_k_mean(
                                np.abs(ramp_parts[name].z), int(p))
            if not adapted:
                continue
            runs = [(name, p, a, b) for name in series for p in g["param"] for a, b in adapted]
            scores = _adapt(parts, [(n_, p, a, b, float(bases[(n_, p)].max()))
                                    for n_, p, a, b in runs])
            for (name, p, a, b), sc in zip(runs, scores, strict=True):
                out[(p, h, name, (robust, a, b))] = FileScores(
                    bases[(name, p)], sc[: parts[name].z.shape[0]])
            if ramp_parts:
                # every ramped copy of a file is one series of the batch, with its file's level
                flat = {f"{name}#{v}": _Parts(rp.z[v], rp.means[v], rp.inv_std)
                        for name, rp in ramp_parts.items() for v in range(rp.z.shape[0])}
                rruns = [(name, v, p, a, b) for name, rp in ramp_parts.items()
                         for v in range(rp.z.shape[0]) for p in g["param"] for a, b in adapted]
                rs = _adapt(flat, [(f"{n_}#{v}", p, a, b, float(bases[(n_, p)].max()))
                                   for n_, v, p, a, b in rruns])
                for (name, v, p, a, b), sc in zip(rruns, rs, strict=True):
                    k = ramp_parts[name].z.shape[1]
                    dest = ramp_out.setdefault((p, h, name, (robust, a, b)),
                                               np.empty((ramp_parts[name].z.shape[0], k)))
                    dest[v] = sc[:k]
    return out, ramp_out


def _adapt(parts: dict[str, _Parts], runs: list[tuple[str, float, float, float, float]]
           ) -> FloatArray:
    """Adapted scores ``(len(runs), K)`` of runs (series name, top-k, α, B, adaptation level),
    K the longest series' windows (shorter ones padded)."""
    names = list(parts)
    index = {n: i for i, n in enumerate(names)}
    k = max(p.z.shape[0] for p in parts.values())
    first = parts[names[0]]
    z = np.zeros((len(names), k, first.z.shape[1]))
    means = np.zeros((len(names), k, first.means.shape[1]))
    for i, n in enumerate(names):
        z[i, : parts[n].z.shape[0]] = parts[n].z
        means[i, : parts[n].means.shape[0]] = parts[n].means
    inv = np.stack([parts[n].inv_std for n in names])
    return adapted_scores_many(
        z, means, inv, np.array([index[r[0]] for r in runs], dtype=np.int64),
        np.array([int(r[1]) for r in runs], dtype=np.int64),
        np.array([r[2] for r in runs]), np.array([r[3] for r in runs]),
        np.array([r[4] for r in runs]))
