"""Robust adaptive baseline of a univariate stream: scores in robust sigmas, a fixed threshold.

The window-statistics model gives three features per window of W readings, in calibration
sigmas (the input scaled with the calibration mean μ_cal and std σ_cal): the window mean m, its
mean absolute deviation (spread) and its mean absolute first difference (roughness). Each
feature f has a baseline: a centre c_f and a robust scale s_f, both in the feature's units.

* **Start** (:func:`robust_stats`): c_f = the median of the calibration windows' feature, s_f =
  1.4826 × its median absolute deviation (the MAD, scaled to a Gaussian std), floored at the
  package's feature floor. A few outlying calibration windows do not inflate the scale.
* **Score** (:func:`robust_scores`): z_f = (f − c_f) / s_f; the score is the mean of the
  ``top_k`` largest |z_f| (top_k 1: the largest). It is a deviation in robust sigmas, so the
  threshold is a fixed number T of them, with the same meaning on every channel and every
  unit, instead of a multiple of the calibration maximum.
* **Adaptation** after every window, in order (a Huber-type robust exponential smoother: Gelper,
  Fried & Croux, "Robust forecasting with exponential and Holt-Winters smoothing", J.
  Forecasting 29, 2010). The deviation is first clipped at ± ``clip`` × s_f:
  r_f = clip(f − c_f, −A·s_f, A·s_f), then

  ```
  c_f ← c_f + α · r_f                          α = adapt_rate
  s_f ← s_f + β · (√(π/2) · |r_f| − s_f)       β = scale_rate
  ```

  √(π/2)·E|r| is σ for Gaussian r, so s_f is an exponentially weighted mean absolute deviation
  in std units. Clipping bounds one window's influence: a spike moves the centre by at most
  α·A·s_f and the scale by a factor 1 + β·(1.25·A − 1), so a short anomaly is not learned,
  while a change of normal operation that persists is followed.
* **Bounds.** The level centre stays within ± ``drift_bound`` (B) calibration sigmas of its
  start; the spread and roughness centres and every scale stay within a factor
  ``scale_bound`` (G) of their start. A slow fault is followed at most that far and then
  scores as it grows.
* **A flat calibration** (the typical calibration window has no spread: a stopped machine, a
  stuck or coarsely quantized sensor) gives no reference for the bounds: a centre of 0 cannot
  move by a factor and σ_cal sits at its floor, so the first noise after it would score
  thousands of sigmas for ever. Such a state (``bounded`` False) keeps only the scales' lower
  bound: the baseline learns the stream's level and noise from operation, at the same clipped
  rates, and the stream alarms on the change and then follows it.

The state is carried window by window, so a stream's scores do not depend on how its readings
were split into blocks. A model swap starts it again from the new calibration; across a restart
the agent keeps it (:mod:`agent.pipeline.baseline_restore`) and :func:`resume_state` checks what
comes back against the bounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from agent.records import FloatArray

#: MAD → Gaussian std.
MAD_TO_STD = 1.4826
#: Mean absolute deviation → Gaussian std (√(π/2)).
ABS_TO_STD = math.sqrt(math.pi / 2.0)


@dataclass(frozen=True, slots=True)
class RobustParams:
    """Adaptation of the robust baseline (module docstring).

    Attributes:
        adapt_rate: α in [0, 1), per window, of the centres.
        scale_rate: β in [0, 1), per window, of the scales.
        clip: A > 0, the Huber clip in robust sigmas.
        drift_bound: B ≥ 0, the level centre's largest move, calibration sigmas.
        scale_bound: G ≥ 1, the largest factor between a spread, roughness or scale value and
            its start.
    """

    adapt_rate: float = 0.01
    scale_rate: float = 0.01
    clip: float = 3.0
    drift_bound: float = 6.0
    scale_bound: float = 4.0


@dataclass(frozen=True, slots=True)
class RobustState:
    """Centres and scales ``(F,)`` in force, and those they started from (the bounds' origin);
    feature 0 is the level (window mean)."""

    centre: FloatArray
    scale: FloatArray
    centre0: FloatArray
    scale0: FloatArray
    #: False after a flat calibration: no upper bounds (module docstring).
    bounded: bool = True

    @classmethod
    def start(cls, centre: FloatArray, scale: FloatArray, bounded: bool = True) -> RobustState:
        """The state at the calibration (copies the arrays)."""
        c, s = np.array(centre, np.float64), np.array(scale, np.float64)
        return cls(c.copy(), s.copy(), c, s, bounded)


def flat_calibration(centre: FloatArray) -> bool:
    """Whether calibration feature centres ``(F,)`` (feature 0 the level, then spread and
    roughness) describe a flat calibration: the median window has no spread and no roughness.

    >>> flat_calibration(np.array([3.0, 0.0, 0.0])), flat_calibration(np.array([3.0, 0.2, 0.1]))
    (True, False)
    """
    return bool(centre.shape[0] > 1 and np.all(np.asarray(centre[1:]) == 0.0))


def robust_stats(features: FloatArray, floor: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Median ``(F,)`` and floored robust std ``(F,)`` of calibration features ``(K, F)``.

    >>> c, s = robust_stats(np.array([[0.0], [1.0], [2.0], [100.0]]), np.array([0.1]))
    >>> float(c[0]), round(float(s[0]), 3)
    (1.5, 1.483)
    """
    centre = np.median(features, axis=0)
    mad = np.median(np.abs(features - centre), axis=0)
    return centre, np.maximum(MAD_TO_STD * mad, floor) + 1e-9


def bounds(state: RobustState, p: RobustParams) -> tuple[FloatArray, FloatArray,
                                                         FloatArray, FloatArray]:
    """(centre low, centre high, scale low, scale high), each ``(F,)``, of ``state``'s start
    (module docstring; ±inf where there is no bound).

    >>> lo, hi, slo, shi = bounds(RobustState.start(np.array([0.0, 0.5]), np.ones(2)),
    ...                          RobustParams(drift_bound=6.0, scale_bound=4.0))
    >>> lo.tolist(), hi.tolist(), slo.tolist(), shi.tolist()
    ([-6.0, 0.125], [6.0, 2.0], [0.25, 0.25], [4.0, 4.0])
    """
    c0, s0, g = state.centre0, state.scale0, max(p.scale_bound, 1.0)
    if not state.bounded:
        inf = np.full_like(c0, np.inf)
        return -inf, inf, s0 / g, inf
    lo_c = np.minimum(c0 / g, c0 * g)
    hi_c = np.maximum(c0 / g, c0 * g)
    lo_c[0], hi_c[0] = c0[0] - p.drift_bound, c0[0] + p.drift_bound
    return lo_c, hi_c, s0 / g, s0 * g


def robust_scores(features: FloatArray, state: RobustState, params: RobustParams,
                  top_k: int = 1, *, levels: list[float] | None = None
                  ) -> tuple[FloatArray, FloatArray, RobustState]:
    """Score K windows in order and adapt the baseline after each.

    Args:
        features: ``(K, F)`` window features, calibration sigmas, feature 0 the window mean.
        state: The baseline before the first window.
        top_k: |z| values averaged into a score (capped at F).
        levels: If given, the level centre c_0 each window is scored against (before its
            update; calibration sigmas) is appended to it, K values.

    Returns:
        (scores ``(K,)``, |z| ``(K, F)``, the state after the last window), float64.

    >>> st = RobustState.start(np.zeros(3), np.ones(3))
    >>> s, z, st2 = robust_scores(np.array([[8.0, 0.0, 0.0]]), st, RobustParams())
    >>> float(s[0]), round(float(st2.centre[0]), 3)
    (8.0, 0.03)
    """
    k = min(max(top_k, 1), features.shape[1])
    lo_c, hi_c, lo_s, hi_s = bounds(state, params)
    c = [float(v) for v in state.centre]
    s = [float(v) for v in state.scale]
    lc, hc, ls, hs = lo_c.tolist(), hi_c.tolist(), lo_s.tolist(), hi_s.tolist()
    a, b, clip = params.adapt_rate, params.scale_rate, params.clip
    nf = len(c)
    absz = np.empty(features.shape, np.float64)
    scores = np.empty(features.shape[0], np.float64)
    for j, row in enumerate(features.tolist()):
        if levels is not None:
            levels.append(c[0])
        zs = []
        for f in range(nf):
            d = row[f] - c[f]
            zs.append(abs(d) / s[f])
            if not math.isfinite(d):  # scored off-scale by the pipeline; never learned
                continue
            lim = clip * s[f]
            r = lim if d > lim else -lim if d < -lim else d
            c[f] = min(max(c[f] + a * r, lc[f]), hc[f])
            s[f] = min(max(s[f] + b * (ABS_TO_STD * abs(r) - s[f]), ls[f]), hs[f])
        absz[j] = zs
        scores[j] = max(zs) if k == 1 else sum(sorted(zs)[-k:]) / k
    return scores, absz, RobustState(np.array(c), np.array(s), state.centre0, state.scale0,
                                     state.bounded)


#: Relative slack of :func:`resume_state`'s bound check (the bounds are applied exactly; the
#: slack only absorbs a last-digit difference).
BOUND_SLACK = 1e-9


def resume_state(start: RobustState, centre: FloatArray, scale: FloatArray,
                 params: RobustParams) -> RobustState:
    """``start`` (the calibration's state) moved to a kept ``centre`` and ``scale``, checked.

    Args:
        start: The state at the calibration (:meth:`RobustState.start`).
        centre, scale: ``(F,)`` float64 the baseline had reached, feature units.
        params: The adaptation whose bounds they must respect.

    Raises:
        ValueError: a shape other than ``(F,)``, a value that is not finite, a scale ≤ 0, or a
            value outside :func:`bounds` (beyond the drift or scale bound).

    >>> st = RobustState.start(np.zeros(3), np.ones(3))
    >>> resume_state(st, np.array([2.0, 0.0, 0.0]), np.ones(3), RobustParams()).centre.tolist()
    [2.0, 0.0, 0.0]
    >>> resume_state(st, np.array([7.0, 0.0, 0.0]), np.ones(3), RobustParams())
    Traceback (most recent call last):
    ...
    ValueError: centre beyond its bound (feature 0: 7 outside [-6, 6])
    """
    c, s = np.asarray(centre), np.asarray(scale)
    shape = start.centre0.shape
    if c.shape != shape or s.shape != shape:
        raise ValueError(f"shape {c.shape}/{s.shape}, expected {shape}")
    if c.dtype.kind not in "fi" or s.dtype.kind not in "fi":
        raise ValueError("values are not numbers")
    c, s = c.astype(np.float64), s.astype(np.float64)
    if not (np.isfinite(c).all() and np.isfinite(s).all()):
        raise ValueError("a value is not finite")
    if (s <= 0).any():
        raise ValueError("a scale is not positive")
    lo_c, hi_c, lo_s, hi_s = bounds(start, params)
    for what, v, lo, hi in (("centre", c, lo_c, hi_c), ("scale", s, lo_s, hi_s)):
        slack = BOUND_SLACK * np.maximum(np.abs(np.where(np.isfinite(lo), lo, 0.0)),
                                         np.abs(np.where(np.isfinite(hi), hi, 0.0))) + 1e-12
        out = np.flatnonzero((v < lo - slack) | (v > hi + slack))
        if out.size:
            f = int(out[0])
            raise ValueError(f"{what} beyond its bound (feature {f}: {v[f]:.6g} outside "
                             f"[{lo[f]:.6g}, {hi[f]:.6g}])")
    return RobustState(c, s, start.centre0, start.scale0, start.bounded)
