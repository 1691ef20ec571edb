"""Experiment: a peaks-over-threshold threshold (SPOT's initial step) in the grouped selection.

    python models/recipes/experiments/skab_pot.py --data ../shared/datasets/skab

Not part of the frozen procedure (docs/detection.md): it runs the same grouped selection of the
window statistics, rated in INT8 exactly as :mod:`skab_select` rates them, with one change: the
threshold is not max(base scores) × factor but the peaks-over-threshold quantile of the base
scores at a target risk q (Siffer et al., "Anomaly Detection in Streams with Extreme Value
Theory", KDD 2017, the initialisation step of SPOT): t = the 98th percentile of the base scores,
a generalized Pareto distribution fitted to the N_t excesses over t, and

    z_q = t + σ/ξ · ((q·n / N_t)^(−ξ) − 1)        (ξ ≠ 0;  t − σ·ln(q·n / N_t) for ξ = 0)

with n the number of base scores. The GPD is fitted by probability-weighted moments (Hosking &
Wallis, "Parameter and quantile estimation for the generalized Pareto distribution",
Technometrics 1987), closed form, which behaves on the few excesses 381 calibration windows
leave (about 8). The risk takes the place of the factor on the grid: q ∈ {1e-2, 3e-3, 1e-3,
3e-4, 1e-4} per scored window. Printed as skab_select prints it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import skab_select
from skab_select import Candidate, N, Study, load, load_int8, report

RISKS = (1e-2, 3e-3, 1e-3, 3e-4, 1e-4)
INITIAL_QUANTILE = 0.98


def pot_threshold(scores: npt.NDArray[np.float64], risk: float,
                  initial: float = INITIAL_QUANTILE) -> float:
    """z_q of the module docstring for ``scores`` ``(n,)``; the max when fewer than 3 excesses
    or tied ones.

    >>> rng = np.random.default_rng(0)
    >>> s = rng.exponential(size=100_000)
    >>> # exponential scores: the 1 − 1e-4 quantile is ln(1e4) = 9.21; the max of 1e5 is ~11.5
    >>> bool(abs(pot_threshold(s, 1e-4) - np.log(1e4)) < 0.5)
    True
    """
    t = float(np.quantile(scores, initial))
    y = np.sort(scores[scores > t] - t)
    nt, n = y.size, scores.size
    if nt < 3:
        return float(scores.max())
    a0 = float(y.mean())
    a1 = float(np.mean(y * (nt - np.arange(1, nt + 1)) / (nt - 1)))
    if a0 <= 0 or a0 - 2 * a1 <= 1e-12 * a0:  # tied excesses: no tail to fit
        return float(scores.max())
    k = a0 / (a0 - 2 * a1) - 2  # Hosking's shape; xi = -k
    sigma = 2 * a0 * a1 / (a0 - 2 * a1)
    r = risk * n / nt
    if abs(k) < 1e-9:
        return t - sigma * np.log(r)
    xi = -k
    return float(t + sigma / xi * (r ** (-xi) - 1))


class PotStudy(Study):
    """:class:`skab_select.Study` with the POT threshold; a candidate's ``factor`` is the risk."""

    def counts(self, c: Candidate, name: str) -> np.ndarray:
        key = (c, name)
        if key not in self._counts:
            s = self._scores[(c.detector, c.window, c.param, c.holdout, c.floor, name)]
            pred = s.test > pot_threshold(s.base, c.factor)
            lab = self.labels[name]
            self._counts[key] = np.array([(pred & lab).sum(), (pred & ~lab).sum(),
                                          (~pred & lab).sum(), (~pred & ~lab).sum()])
        return self._counts[key]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="SKAB root")
    args = ap.parse_args(argv)
    skab_select.GRID = {**skab_select.GRID,
                        "wstat": {**skab_select.GRID["wstat"], "factor": RISKS}}
    files, floor, ffloors = load(args.data)
    print(f"POT threshold (initial quantile {INITIAL_QUANTILE}, risk per window in place of "
          f"the factor: {RISKS}); calibration N = {N}")
    with tempfile.TemporaryDirectory() as tmp:
        floors, models = load_int8(args.data, ["wstat"], Path(tmp))
        report(PotStudy(files, floor, ffloors, ["wstat"], floors, models), ["wstat"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
