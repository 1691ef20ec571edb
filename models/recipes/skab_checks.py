"""The grouped SKAB selection's requirement checks (:mod:`skab_select` declares them: slow ramp,
outlier in calibration): the synthetic series they score and the agent's alert rules over
many score sequences at once. Pure NumPy, no I/O.

* :func:`normal_rows`: where a file's normal rows after the calibration end (its first
  anomalous label).
* :func:`ramp_series`: copies of a file's first rows with a level ramp on one channel.
* :func:`outlier_series`: a file without one calibration row (the agent leaves a far-out
  calibration reading out of its fit).
* :func:`first_alerts` and :func:`alert_counts`: :class:`agent.pipeline.rules.AlertRules`
  (stride 1, no single-window path) over B score sequences, one NumPy step per window;
  ``tests/unit/test_skab_checks.py`` checks them against the agent's class.
* :class:`Checks`: one candidate's results on a set of files, and whether they meet the
  requirements.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from agent.pipeline.rules import RuleParams

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

#: The agent's default alert rules, which the requirements use.
RULES = RuleParams()


def normal_rows(labels: npt.NDArray[np.integer], n: int) -> int:
    """Rows of normal operation after the first ``n`` (calibration) rows: from row ``n`` up to
    the first anomalous label, 0 when a label inside the calibration is anomalous.

    >>> normal_rows(np.array([0] * 6 + [1, 0]), 4)
    2
    >>> normal_rows(np.array([0, 1, 0, 0, 0]), 2)
    0
    """
    bad = np.flatnonzero(labels)
    end = int(bad[0]) if bad.size else labels.shape[0]
    return max(0, end - n)


def ramp_deadline(slope: float, reach: float) -> int:
    """Readings after its start by which a ramp of ``slope`` units per reading has grown to
    ``reach`` units (its value at reading i, from 1, is ``slope`` × i).

    >>> ramp_deadline(0.04, 6.0), ramp_deadline(0.1, 6.0)
    (150, 60)
    """
    return math.ceil(reach / slope - 1e-9)


def ramp_series(values: FloatArray, n: int, stop: int, unit: FloatArray,
                slopes: tuple[float, ...]) -> tuple[FloatArray, list[tuple[int, float]]]:
    """Copies of ``values[:stop]`` with a level ramp on one channel from row ``n`` on: row
    ``n + i`` gets ``slope`` × (i + 1) × ``unit[c]`` added to channel c.

    Args:
        values: ``(T, C)``, channel units; n: calibration rows (left untouched); stop: rows kept.
        unit: ``(C,)`` σ_cal per channel, channel units.
        slopes: σ_cal per reading.

    Returns:
        (``(V, stop, C)`` the ramped copies, V = C × len(slopes), channel-major; the (channel,
        slope) of each).
    """
    c = values.shape[1]
    variants = [(ch, s) for ch in range(c) for s in slopes]
    out = np.repeat(values[None, :stop], len(variants), axis=0)
    steps = np.arange(1, stop - n + 1, dtype=np.float64)
    for v, (ch, s) in enumerate(variants):
        out[v, n:, ch] += s * steps * unit[ch]
    return out, variants


def outlier_series(values: FloatArray, row: int) -> FloatArray:
    """``values`` without ``row``: what the agent calibrates on (the first N − 1 rows) when the
    reading at ``row`` of its calibration period was far out; the rows after the calibration
    are the same.

    >>> outlier_series(np.arange(5.0)[:, None], 1)[:, 0].tolist()
    [0.0, 2.0, 3.0, 4.0]
    """
    return np.delete(values, row, axis=0)


def first_alerts(above: BoolArray, rules: RuleParams = RULES) -> IntArray:
    """Index of the window that raises each sequence's first alert, ``K`` when none does.

    Before the first alert no episode has ended, so the rule is the k-of-n count alone.

    Args:
        above: ``(B, K)`` windows above the threshold, in order.

    >>> first_alerts(np.array([[1, 1, 0, 1, 1, 1, 1, 1, 0, 0]], bool)).tolist()
    [7]
    """
    count = np.cumsum(above, axis=1, dtype=np.int64)
    past = np.zeros_like(count)
    past[:, rules.n:] = count[:, :-rules.n]
    hit = (count - past) >= rules.k
    out: IntArray = np.where(hit.any(axis=1), hit.argmax(axis=1), above.shape[1])
    return out


def alert_counts(above: BoolArray, low: BoolArray, ts: FloatArray,
                 length: IntArray | None = None, rules: RuleParams = RULES) -> IntArray:
    """Alerts :class:`agent.pipeline.rules.AlertRules` raises on each of B score sequences
    (stride 1; ``rules.spike_factor`` is not emulated), from each window's comparisons with
    the threshold.

    Args:
        above: ``(B, K)`` windows scoring above the threshold, in order.
        low: ``(B, K)`` windows scoring below ``rules.clear_ratio`` × the threshold.
        ts: ``(K,)`` the windows' end times, seconds (for the cooldown).
        length: ``(B,)`` windows of each sequence that count (the rest is padding); None: K.

    Raises:
        ValueError: ``rules`` has a single-window path.

    >>> s = np.array([[2, 2, 0, 0, 0, 2, 2, 0, 0, 2, 2.0]])
    >>> r = RuleParams(k=2, n=2, clear_windows=2, cooldown_s=0)
    >>> alert_counts(s > 1, s < 0.9, np.arange(11.0), rules=r).tolist()
    [3]
    """
    if rules.spike_factor is not None:
        raise ValueError("the single-window path is not emulated")
    b, k = above.shape
    ring = np.zeros((b, rules.n), dtype=np.int64)
    above_n = np.zeros(b, dtype=np.int64)
    active = np.zeros(b, dtype=bool)
    below = np.zeros(b, dtype=np.int64)
    last = np.full(b, -np.inf)
    alerts = np.zeros(b, dtype=np.int64)
    lengths = np.full(b, k) if length is None else length
    for j in range(k):
        live = j < lengths
        a = (above[:, j] & live).astype(np.int64)
        slot = j % rules.n
        above_n += np.where(live, a - ring[:, slot], 0)
        ring[:, slot] = np.where(live, a, ring[:, slot])
        was = active & live
        below = np.where(was, np.where(low[:, j], below + 1, 0), below)
        end = was & (below >= rules.clear_windows)
        if end.any():
            active &= ~end
            below[end] = 0
            ring[end] = 0
            above_n[end] = 0
        # at stride 1 every window is scored: the rule's k of n is the whole condition
        start = ~was & live & (above_n >= rules.k)
        if start.any():
            active |= start & (rules.clear_windows > 0)
            below[start] = 0
            raise_ = start & (ts[j] - last >= rules.cooldown_s)
            last = np.where(raise_, ts[j], last)
            alerts += raise_
    return alerts


@dataclass(frozen=True, slots=True)
class Checks:
    """One candidate's requirement results on a set of files (sums over them)."""

    ramp_hits: int = 0
    ramp_judged: int = 0
    outlier_kept: int = 0
    outlier_judged: int = 0

    def __add__(self, other: Checks) -> Checks:
        return Checks(self.ramp_hits + other.ramp_hits, self.ramp_judged + other.ramp_judged,
                      self.outlier_kept + other.outlier_kept,
                      self.outlier_judged + other.outlier_judged)

    @property
    def ramp_rate(self) -> float:
        """Share of judged ramps hit (1 when none is judged: nothing to fail)."""
        return self.ramp_hits / self.ramp_judged if self.ramp_judged else 1.0

    @property
    def outlier_rate(self) -> float:
        """Share of (file, row) pairs whose alert count is unchanged (1 when none)."""
        return self.outlier_kept / self.outlier_judged if self.outlier_judged else 1.0

    def met(self, ramp_rate: float, outlier_rate: float) -> tuple[bool, bool]:
        """(slow ramp met, outlier met) at the required rates."""
        return self.ramp_rate >= ramp_rate, self.outlier_rate >= outlier_rate

    def text(self) -> str:
        return (f"ramps hit {self.ramp_hits}/{self.ramp_judged} ({100 * self.ramp_rate:.1f} %), "
                f"outlier unchanged {self.outlier_kept}/{self.outlier_judged} "
                f"({100 * self.outlier_rate:.1f} %)")
