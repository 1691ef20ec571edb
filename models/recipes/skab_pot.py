"""Peaks-over-threshold (POT) threshold rule: a threshold with a stated false-alarm meaning.

Siffer, Fouque, Termier, Largouët, "Anomaly Detection in Streams with Extreme Value Theory",
KDD 2017. By the Pickands–Balkema–de Haan theorem the excesses ``Y = s − t`` of the scores ``s``
over a high initial threshold ``t`` follow (approximately) a generalized Pareto distribution
GPD(γ, σ). The threshold with exceedance probability ``q`` per scored window is then

    z_q = t + σ/γ · ((q·n / N_t)^(−γ) − 1)      (γ ≠ 0)
    z_q = t + σ · log(N_t / (q·n))              (γ = 0, the exponential limit)

with ``n`` the number of calibration scores and ``N_t`` the number of them above ``t``. This is
the paper's batch POT step (SPOT's initialisation); the agent calibrates once per stream, so
SPOT's streaming update is not used.

γ and σ are the maximum-likelihood estimates found as in the paper with Grimshaw's reduction
(Grimshaw, "Computing maximum likelihood estimates for the generalized Pareto distribution",
Technometrics 1993): with ``x = γ/σ``, a local maximum of the likelihood is a root of
``u(x)·v(x) = 1``, ``u(x) = mean(1/(1 + x·Y))``, ``v(x) = 1 + mean(log(1 + x·Y))``, and then
``γ = v(x) − 1``, ``σ = γ/x``. Every root in ``(−1/max(Y), 0)`` and ``(0, x_max]`` is found on a
log-spaced grid (sign changes, then Brent) and the candidate (roots and the exponential fit at
``x = 0``) with the largest likelihood is kept. NumPy/SciPy only, no I/O.

Caveat stated once here: the calibration windows overlap (hop 1), so the scores are strongly
autocorrelated; ``q`` is a per-window exceedance probability *under the fitted tail*, and the
fit has far fewer independent points than ``n``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.optimize import brentq

FloatArray = npt.NDArray[np.float64]

#: Excesses at most this fraction of |t| (at least 1) are ties with t, not peaks: float32 runtimes
#: return scores equal in exact arithmetic a few 1e-7 apart, and an excess of 1e-7 next to ones
#: of 0.1..1 drives the maximum-likelihood fit to γ ≈ 11, σ ≈ 1e-6 and a threshold of 1e30
#: (valve1/10 through the agent's FP32 ONNX path, W 10).
TIE_RTOL = 1e-5
#: Fewest peaks a fit uses: when ``(1 − init)·n`` is smaller, t is lowered to the score below
#: the MIN_PEAKS largest ones (fixed with the grid, before any SKAB file was scored).
MIN_PEAKS = 5


@dataclass(frozen=True, slots=True)
class GPDFit:
    """``gamma`` (shape γ), ``sigma`` (scale σ > 0) and the log-likelihood of the excesses."""

    gamma: float
    sigma: float
    loglik: float


def _loglik(y: FloatArray, gamma: float, sigma: float) -> float:
    if sigma <= 0:
        return -math.inf
    if abs(gamma) < 1e-12:
        return float(-y.size * math.log(sigma) - y.sum() / sigma)
    a = 1 + gamma * y / sigma
    if np.any(a <= 0):
        return -math.inf
    return float(-y.size * math.log(sigma) - (1 + 1 / gamma) * np.log(a).sum())


def fit_gpd(y: FloatArray) -> GPDFit:
    """Maximum-likelihood GPD fit of excesses ``y`` (all > 0) by Grimshaw's reduction.

    Raises:
        ValueError: no excesses, or an excess ≤ 0.
    """
    y = np.asarray(y, dtype=np.float64)
    if y.size == 0 or np.any(y <= 0):
        raise ValueError("GPD fit needs positive excesses")
    mean, ymin, ymax = float(y.mean()), float(y.min()), float(y.max())

    def w(x: float) -> float:
        a = 1 + x * y
        return float(np.mean(1 / a) * (1 + np.mean(np.log(a))) - 1)

    eps = 1e-8 / mean
    lo = -1 / ymax + eps
    hi = 2 * (mean - ymin) / ymin**2 if ymin > 0 else 1e6 / mean
    hi = max(hi, 10 * eps)
    grids = [-np.geomspace(-lo, eps, 200), np.geomspace(eps, hi, 200)] if lo < -eps else [
        np.geomspace(eps, hi, 200)]
    fits = [GPDFit(0.0, mean, _loglik(y, 0.0, mean))]
    for grid in grids:
        a = 1 + grid[:, None] * y[None, :]
        vals = np.mean(1 / a, axis=1) * (1 + np.mean(np.log(a), axis=1)) - 1
        for i in np.nonzero(np.sign(vals[:-1]) * np.sign(vals[1:]) < 0)[0]:
            x = brentq(w, float(grid[i]), float(grid[i + 1]))
            gamma = float(np.mean(np.log1p(x * y)))
            sigma = gamma / x
            if sigma > 0:
                fits.append(GPDFit(gamma, sigma, _loglik(y, gamma, sigma)))
    return max(fits, key=lambda f: f.loglik)


def pot_threshold(scores: FloatArray, init: float, q: float) -> float:
    """The score with exceedance probability ``q`` under the GPD fitted to the tail of
    ``scores`` above their ``init`` quantile (at least :data:`MIN_PEAKS` peaks).

    Args:
        scores: ``(n,)`` calibration (threshold-base) scores.
        init: Level of the initial threshold t, 0 < init < 1.
        q: Exceedance probability, 0 < q < N_t / n.

    Returns:
        z_q (module docstring); t itself when the tail is flat (no excess above t beyond
        :data:`TIE_RTOL`).

    Raises:
        ValueError: too few scores, or q or init out of range.
    """
    return pot_thresholds(scores, init, (q,))[0]


def pot_thresholds(scores: FloatArray, init: float, qs: tuple[float, ...]) -> tuple[float, ...]:
    """:func:`pot_threshold` for several ``qs`` from one GPD fit (the fit depends on ``init``
    only).

    Raises:
        ValueError: as :func:`pot_threshold`.
    """
    s = np.sort(np.asarray(scores, dtype=np.float64))
    n = s.size
    if n <= MIN_PEAKS or not 0 < init < 1 or not all(0 < q < 1 for q in qs):
        raise ValueError(f"bad POT fit: n={n} init={init} q={qs}")
    k = max(MIN_PEAKS, math.ceil((1 - init) * n))
    t = float(s[n - k - 1])
    y = s[n - k:] - t
    y = y[y > TIE_RTOL * max(abs(t), 1.0)]
    if y.size == 0:
        return tuple(t for _ in qs)
    fit = fit_gpd(y)
    out = []
    for q in qs:
        r = q * n / y.size
        if abs(fit.gamma) < 1e-12:
            out.append(t + fit.sigma * math.log(1 / r))
        else:
            out.append(t + fit.sigma / fit.gamma * (float(r ** (-fit.gamma)) - 1))
    return tuple(out)
