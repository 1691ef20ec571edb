"""The drift variants of the SKAB window statistics (models/recipes/skab_detectors.py) and how
the grouped selection (skab_select.py) holds them beside the unchanged candidates."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "models" / "recipes"))

import skab_report  # noqa: E402
import skab_select  # noqa: E402
from skab_detectors import center_spread, file_scores  # noqa: E402
from skab_select import Candidate  # noqa: E402
from skab_study import Study  # noqa: E402

C = 3
FLOOR = np.full(C, 0.05)
FFLOOR = np.full(3 * C, 0.05)


def _noise(rows: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(rows, C))


def _scores(x: np.ndarray, rate: float = 0.0, bound: float = 0.0, robust: bool = False
            ) -> np.ndarray:
    return file_scores("wstat", x, 400, 10, 1, 0.0, FLOOR, FFLOOR, robust=robust,
                       adapt_rate=rate, drift_bound=bound).test


def test_adaptation_follows_a_slow_drift_within_its_bound() -> None:
    x = _noise(1400)
    x[400:, 0] += np.linspace(0.0, 4.0, 1000)  # 4 sigma over 1,000 rows on one channel
    plain, adapted = _scores(x), _scores(x, 0.02, 10.0)
    assert adapted[-200:].mean() < 0.5 * plain[-200:].mean()
    # bounded at 1 sigma, the baseline follows at most 1 of the 4 sigmas
    tight = _scores(x, 0.02, 1.0)
    assert adapted[-200:].mean() < tight[-200:].mean() < plain[-200:].mean()


def test_a_fault_above_the_calibration_maximum_never_moves_the_baseline() -> None:
    x = _noise(800)
    x[400:, 1] += 100.0  # a step: every scored window, from the first, is above the
    base = file_scores("wstat", x, 400, 10, 1, 0.0, FLOOR, FFLOOR).base  # calibration's worst
    plain = _scores(x)
    assert plain.min() > base.max()
    np.testing.assert_array_equal(_scores(x, 0.02, 10.0), plain)
    # the same step, 1 sigma, is quiet enough to be followed
    x[400:, 1] -= 99.0
    assert _scores(x, 0.02, 10.0)[-100:].mean() < _scores(x)[-100:].mean()


def test_adaptation_leaves_the_threshold_base_alone() -> None:
    x = _noise(900)
    x[400:, 0] += 2.0
    for h in (0.0, 0.25):
        a = file_scores("wstat", x, 400, 10, 2, h, FLOOR, FFLOOR, adapt_rate=0.02,
                        drift_bound=3.0)
        b = file_scores("wstat", x, 400, 10, 2, h, FLOOR, FFLOOR)
        np.testing.assert_array_equal(a.base, b.base)
        assert a.test.shape == b.test.shape


def test_robust_statistics_ignore_a_calibration_outlier() -> None:
    x = _noise(2000)
    x[5, 0] = 500.0
    _, std = center_spread(x, robust=False)
    med, mad = center_spread(x, robust=True)
    assert std[0] > 5 and abs(mad[0] - 1.0) < 0.1 and abs(med[0]) < 0.1
    # one wild calibration reading inflates the mean/std scale and hides a later 5-sigma step
    y = _noise(800)
    y[100, 0] = 500.0
    y[400:, 0] += 5.0
    assert _scores(y, robust=True)[10:].mean() > 3 * _scores(y)[10:].mean()


def _files(drift: bool = False) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    files = {f"{g}/{i}": (_noise(600, 10 * k + i), np.r_[np.zeros(500), np.ones(100)])
             for k, g in enumerate("ab") for i in range(2)}
    for _, (x, _) in files.items():
        if drift:
            x[400:, 0] += np.linspace(0.0, 3.0, 200)  # a drift the adapted candidates follow
        x[500:] += 4.0
    return files


BASE = {"window": (5,), "param": (1,), "holdout": (0.0,), "factor": (1.5, 2.0)}


def test_variants_are_candidates_beside_the_unchanged_ones(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    grid = {"wstat": BASE, "wstat-drift": {**BASE, "robust": (0.0, 1.0),
                                           "adapt_rate": (0.0, 0.005, 0.02),
                                           "drift_bound": (3.0, 10.0)}}
    monkeypatch.setattr(skab_select, "GRID", grid)
    files = _files()
    study = Study(files, FLOOR, {5: FFLOOR}, ["wstat", "wstat-drift"])
    # 2 factors x 2 robust x (off + 2 rates x 2 bounds); the unchanged ones are wstat's only
    assert len(study.candidates) == 2 * 2 * 5
    assert {c.kind for c in study.candidates if c.detector == "wstat"} == {"max"}
    assert {c.kind for c in study.candidates if c.detector == "wstat-drift"} == {
        "adapt", "robust", "robust+adapt"}
    plain = Candidate("wstat", 5, 1, 0.0, 1.5)
    assert all(n.variant == (0, 0, 0) for n in study.neighbours(plain))
    adapted = Candidate("wstat-drift", 5, 1, 0.0, 1.5, adapt_rate=0.005, drift_bound=3.0)
    hood = study.neighbours(adapted)
    assert {(n.adapt_rate, n.drift_bound) for n in hood} == {(0.005, 3.0), (0.02, 3.0),
                                                              (0.005, 10.0)}
    # the drift family is scored by the window statistics: its robust-off, adapt-off scores
    # would be wstat's, and its adapted scores start from them
    key = ("wstat-drift", 5, 1, 0.0, 0.1, "a/0", (0.0, 0.005, 3.0))
    assert study._scores[key].base.shape == study._scores[
        ("wstat", 5, 1, 0.0, 0.1, "a/0", (0.0, 0.0, 0.0))].base.shape
    assert study.choose(list(files), rule="max").variant == (0, 0, 0)
    assert study.choose(list(files), rule="robust+adapt").kind == "robust+adapt"
    assert study.choose(list(files), family=("wstat", "wstat-drift"),
                        rule=("max", "adapt")).kind in ("max", "adapt")
    assert study.choose(list(files)) in study.candidates


def test_the_wstat_family_alone_studies_what_it_did_before_the_variants() -> None:
    rows = skab_report.report_rows(["wstat"])
    assert [r[0] for r in rows] == ["wstat/max", "wstat/pot", "wstat"]
    assert not any(any(v) for v in skab_select.variants("wstat"))
    both = [r[0] for r in skab_report.report_rows(["wstat", "wstat-drift"])]
    assert both[-3:] == ["wstat-drift", "shippable", "any family"]


def test_only_kinds_the_agent_implements_are_shipped(monkeypatch: pytest.MonkeyPatch) -> None:
    grid = {"wstat": BASE, "wstat-drift": {**BASE, "robust": (0.0, 1.0),
                                           "adapt_rate": (0.0, 0.02), "drift_bound": (3.0,)}}
    monkeypatch.setattr(skab_select, "GRID", grid)
    files = _files(drift=True)
    study = Study(files, FLOOR, {5: FFLOOR}, ["wstat", "wstat-drift"])
    lines: list[str] = []
    choice = skab_report.report(study, ["wstat", "wstat-drift"], lines.append)
    assert choice.kind in skab_select.SHIPPABLE_KINDS and not choice.robust
    assert any(x.startswith("chosen among all families") for x in lines)
    # the procedure that picks the shipped defaults is itself reported held out
    # (per group: its figures, the neighbourhood's spread, the requirements)
    assert sum(x.startswith("shippable   held-out group") for x in lines) == 6
