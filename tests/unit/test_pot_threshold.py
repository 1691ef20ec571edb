"""The peaks-over-threshold rule (models/recipes/skab_pot.py) and its place in the grouped
selection (models/recipes/skab_select.py), on generated data."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import genpareto

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "models" / "recipes"))

import skab_report  # noqa: E402
import skab_select  # noqa: E402
from skab_pot import MIN_PEAKS, fit_gpd, pot_threshold  # noqa: E402
from skab_select import Candidate  # noqa: E402
from skab_study import Study  # noqa: E402


@pytest.mark.parametrize("gamma", [-0.3, 0.0, 0.2, 0.5])
def test_grimshaw_fit_is_the_maximum_likelihood_fit(gamma: float) -> None:
    rng = np.random.default_rng(1)
    y = genpareto.rvs(gamma, scale=2.0, size=1500, random_state=rng)
    y = y[y > 0]
    fit = fit_gpd(y)
    c, _, s = genpareto.fit(y, floc=0)
    assert fit.gamma == pytest.approx(c, abs=0.01)
    assert fit.sigma == pytest.approx(s, rel=0.01)
    assert fit.loglik >= genpareto.logpdf(y, c, scale=s).sum() - 1e-3


def test_the_threshold_has_its_exceedance_probability() -> None:
    """On exponential scores P(s > z) = exp(−z): z_q ≈ −log q."""
    x = np.random.default_rng(2).exponential(size=200_000)
    for q in (1e-3, 1e-4):
        assert pot_threshold(x, 0.9, q) == pytest.approx(-math.log(q), rel=0.05)
    # a smaller q lies further out
    assert pot_threshold(x[:400], 0.9, 1e-5) > pot_threshold(x[:400], 0.9, 1e-3)


def test_few_scores_keep_min_peaks_and_flat_tails_give_t() -> None:
    x = np.random.default_rng(3).exponential(size=60)
    assert pot_threshold(x, 0.98, 1e-4) > np.sort(x)[-MIN_PEAKS - 1]
    assert pot_threshold(np.ones(50), 0.9, 1e-4) == 1.0
    with pytest.raises(ValueError):
        pot_threshold(x[:MIN_PEAKS], 0.9, 1e-4)


def test_float32_ties_are_not_peaks() -> None:
    """Scores equal up to float32 noise at t do not become a near-zero excess that drives the
    fit to a degenerate shape (the case seen on a SKAB file through the ONNX FP32 path)."""
    tail = np.array([3.178747875, 3.178748194, 3.178748486, 3.2994585, 3.3043793, 3.5669517,
                     3.6994758, 4.1038725, 4.4033449])
    scores = np.concatenate([np.linspace(0.5, 2.8, 382), tail])
    z = pot_threshold(scores, 0.98, 1e-5)
    assert 4.4 < z < 20


def _file(seed: int, drift: float) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(600, 3))
    x[400:500] += drift
    x[500:] += 4.0
    lab = np.zeros(600, dtype=np.int8)
    lab[500:] = 1
    return x, lab


def test_pot_candidates_sit_beside_max_ones_and_stay_in_their_rule(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(skab_select, "GRID", {"wstat": {
        "window": (5,), "param": (1, 2), "holdout": (0.0,), "factor": (1.0, 1.5),
        "q": (1e-3, 1e-4, 1e-5), "init": (0.9, 0.95)}})
    files = {f"a/{i}": _file(i, 0.0) for i in range(2)}
    files |= {f"b/{i}": _file(10 + i, 1.5) for i in range(2)}
    study = Study(files, np.full(3, 0.05), {5: np.full(9, 0.05)}, ["wstat"])
    rules = {c.rule for c in study.candidates}
    assert rules == {"max", "pot"}
    assert sum(c.rule == "pot" for c in study.candidates) == 2 * 3 * 2
    c = Candidate("wstat", 5, 1, 0.0, 1.0, rule="pot", q=1e-4, init=0.9)
    hood = study.neighbours(c)
    assert all(n.rule == "pot" and n.factor == 1.0 for n in hood)
    assert {n.q for n in hood} == {1e-3, 1e-4, 1e-5} and {n.init for n in hood} == {0.9, 0.95}
    assert study.choose(list(files), rule="pot").rule == "pot"
    assert study.choose(list(files), rule="max").rule == "max"
    # the threshold is read from the file's base (calibration) scores alone
    base = study._scores[("wstat", 5, 1, 0.0, 0.1, "a/0", (0.0, 0.0, 0.0))].base
    assert study.threshold(c, "a/0") == pot_threshold(base, 0.9, 1e-4)
    lines: list[str] = []
    skab_report.report(study, ["wstat"], lines.append)
    for label in ("wstat/max", "wstat/pot", "wstat"):
        assert any(x.split()[:3] == [label, "held-out", "group"] for x in lines)
