"""The grouped SKAB selection's requirement checks (models/recipes/skab_checks.py, the slow
ramp and the outlier in calibration of skab_select.py) and the batched scoring behind them
(skab_scoring.py), on generated data: the emulated alert rules are the agent's, the batched
scores are file_scores', each check can fail, a failing candidate loses the choice, and a
choice computes the checks on its fit files only."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from agent.pipeline.drift import LevelAdaptation, adapted_scores
from agent.pipeline.rules import AlertRules, RuleParams

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "models" / "recipes"))

import skab_select  # noqa: E402
from skab_checks import (  # noqa: E402
    alert_counts,
    first_alerts,
    normal_rows,
    outlier_series,
    ramp_series,
)
from skab_detectors import adapted_scores_many, file_scores  # noqa: E402
from skab_select import Candidate  # noqa: E402
from skab_study import Study, outlier_name  # noqa: E402

C = 3
#: A grid as skab_select.GRID holds it.
Grid = dict[str, dict[str, tuple[float, ...]]]
FLOOR = np.full(C, 0.05)
FFLOOR = np.full(3 * C, 0.05)


def _agent_alerts(scores: np.ndarray, thr: float, params: RuleParams) -> list[int]:
    rules = AlertRules(params)
    return [j for j, s in enumerate(scores) if rules.update(float(s), thr, 400.0 + j)]


@pytest.mark.parametrize("params", [RuleParams(), RuleParams(k=2, n=3, clear_windows=2,
                                                             cooldown_s=5.0)])
def test_alert_counts_are_the_agents_rules(params: RuleParams) -> None:
    rng = np.random.default_rng(1)
    # bursts above and below the threshold, hovering near it, so episodes start, end and
    # restart within the cooldown
    scores = np.abs(rng.normal(size=(40, 900))).cumsum(1) % 3.0 + rng.normal(0, 0.3, (40, 900))
    thr = rng.uniform(1.0, 2.5, 40)
    thr[:5] = 5.0  # never reached
    length = rng.integers(450, 901, 40)
    got = alert_counts(scores > thr[:, None], scores < params.clear_ratio * thr[:, None],
                       np.arange(400.0, 1300.0), length, params)
    want = [len(_agent_alerts(scores[i, : length[i]], thr[i], params)) for i in range(40)]
    assert got.tolist() == want
    assert min(want) == 0 and max(want) >= 3  # some never alert, some alert again and again
    first = first_alerts(scores > thr[:, None], params)
    for i in range(40):
        alerts = _agent_alerts(scores[i], thr[i], params)
        assert first[i] == (alerts[0] if alerts else 900)


def test_batched_adaptation_is_the_agents() -> None:
    rng = np.random.default_rng(2)
    s, k, c = 3, 200, C
    z = rng.normal(size=(s, k, 3 * c))
    z[:, 100:, 0] += np.linspace(0, 4, 100)  # a drift to follow
    means = rng.normal(size=(s, k, c))
    inv = rng.uniform(0.5, 2.0, (s, c))
    runs = [(0, 1, 0.02, 3.0, 2.0), (1, 2, 0.005, 10.0, 1.5), (2, 3, 0.02, 1.0, 3.0),
            (0, 3, 0.005, 3.0, 2.5)]
    got = adapted_scores_many(z, means, inv, np.array([r[0] for r in runs]),
                              np.array([r[1] for r in runs]), np.array([r[2] for r in runs]),
                              np.array([r[3] for r in runs]), np.array([r[4] for r in runs]))
    for row, (i, top_k, rate, bound, level) in zip(got, runs, strict=True):
        want = adapted_scores(z[i], means[i], inv[i], np.zeros(c), top_k,
                              LevelAdaptation(rate, bound), level)[0]
        np.testing.assert_allclose(row, want, rtol=1e-12, atol=1e-12)


def _noise(rows: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(rows, C))


def _files(seeds: range, normal: int = 570, rows: int = 900, fault: float = 4.0
           ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Files of ``rows`` rows, normal up to ``normal``, then a fault (``fault`` on every
    channel), in groups a and b."""
    out = {}
    for i in seeds:
        x = _noise(rows, i)
        x[normal:] += fault
        lab = np.zeros(rows, dtype=np.int8)
        lab[normal:] = 1
        out[f"{'ab'[i % 2]}/{i}"] = (x, lab)
    return out


GRID: Grid = {"wstat": {"window": (5,), "param": (1, 2), "holdout": (0.0, 0.25),
                  "factor": (1.5, 2.0)},
        "wstat-drift": {"window": (5,), "param": (1, 2), "holdout": (0.0, 0.25),
                        "factor": (1.5, 2.0), "robust": (0.0, 1.0),
                        "adapt_rate": (0.0, 0.02), "drift_bound": (3.0, 10.0)},
        "pca": {"window": (5,), "param": (0.9,), "holdout": (0.0, 0.25), "factor": (1.5,)},
        "mset": {"window": (5,), "param": (20,), "holdout": (0.0, 0.25), "factor": (1.5,)}}


def test_the_batched_scores_are_file_scores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(skab_select, "GRID", GRID)
    files = _files(range(2))
    study = Study(files, FLOOR, {5: FFLOOR}, list(GRID))
    n = skab_select.N
    checked = 0
    for (fam, w, p, h, _, name, var), got in study._scores.items():
        det = skab_select.detector_of(fam)
        file, _, row = name.partition("@")
        values, rows = (files[file][0], n) if not row else (
            outlier_series(files[file][0], int(row)), n - 1)
        want = file_scores(det, values, rows, w, p, h, FLOOR, FFLOOR, robust=bool(var[0]),
                           adapt_rate=var[1], drift_bound=var[2])
        np.testing.assert_allclose(got.base, want.base, rtol=1e-9)
        np.testing.assert_allclose(got.test, want.test, rtol=1e-9, atol=1e-9)
        checked += 1
        ramps = study._ramps.get((fam, w, p, h, 0.1, name, var))
        if ramps is None:
            continue
        copies, _ = ramp_series(values, n, n + ramps.shape[1],
                                np.maximum(values[:n].std(0), FLOOR), skab_select.RAMP_SLOPES)
        for v in (0, 3, copies.shape[0] - 1):
            one = file_scores(det, copies[v], n, w, p, h, FLOOR, FFLOOR, robust=bool(var[0]),
                              adapt_rate=var[1], drift_bound=var[2]).test
            np.testing.assert_allclose(ramps[v], one, rtol=1e-9, atol=1e-9)
    # 2 files x 3 calibrations x 4 (top-k, base) x (wstat + 5 drift variants) + 2 pca + 2 mset
    assert checked == 2 * 3 * (4 * 6 + 2 + 2)


def test_normal_rows_and_ramp_copies() -> None:
    labels = np.r_[np.zeros(570), np.ones(100), np.zeros(30)].astype(np.int8)
    assert normal_rows(labels, 400) == 170
    assert normal_rows(np.r_[np.zeros(300), np.ones(10), np.zeros(400)], 400) == 0
    x = _noise(600, 0)
    copies, variants = ramp_series(x, 400, 550, np.array([1.0, 2.0, 3.0]), (0.04, 0.1))
    assert copies.shape == (6, 550, C) and variants[3] == (1, 0.1)
    np.testing.assert_array_equal(copies[:, :400], np.repeat(x[None, :400], 6, 0))
    added = copies[3] - x[:550]
    assert added[:, [0, 2]].max() == 0.0
    assert added[400, 1] == pytest.approx(0.2) and added[549, 1] == pytest.approx(30.0)


def _study(monkeypatch: pytest.MonkeyPatch, files: dict[str, tuple[np.ndarray, np.ndarray]],
           grid: Grid) -> Study:
    monkeypatch.setattr(skab_select, "GRID", grid)
    return Study(files, FLOOR, {5: FFLOOR}, list(grid))


SLOW: Grid = {"wstat": {"window": (5,), "param": (1,), "holdout": (0.0,), "factor": (1.5,)},
        "wstat-drift": {"window": (5,), "param": (1,), "holdout": (0.0,), "factor": (1.5,),
                        "robust": (0.0,), "adapt_rate": (0.0, 0.05), "drift_bound": (20.0,)}}


def test_a_ramp_the_adaptation_follows_fails_the_ramp_check(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    # a ramp slow enough (0.01 sigma_cal per reading, 6 sigma_cal after 600 readings) for a
    # fast, wide adaptation to follow: the unadapted candidate hits it, the adapted one not
    monkeypatch.setattr(skab_select, "RAMP_SLOPES", (0.01,))
    study = _study(monkeypatch, _files(range(4), normal=1000, rows=1100), SLOW)
    names = sorted(study.files)
    plain = Candidate("wstat", 5, 1, 0.0, 1.5)
    adapted = Candidate("wstat-drift", 5, 1, 0.0, 1.5, adapt_rate=0.05, drift_bound=20.0)
    assert study.checks(plain, names).ramp_judged == 4 * C
    assert study.checks(plain, names).ramp_rate == 1.0
    assert study.checks(adapted, names).ramp_rate < 0.5
    groups = study.group_files(names)
    assert study.met(plain, groups)[0] and not study.met(adapted, groups)[0]


def test_a_ramp_too_long_for_the_normal_rows_is_not_judged(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    # 170 normal rows after the calibration: the 0.1 ramp (60 readings) is judged, the 0.04
    # ramp (150) is judged too; with 100 rows only the 0.1 one
    short = _study(monkeypatch, _files(range(2), normal=500, rows=700), SLOW)
    assert short.checks(Candidate("wstat", 5, 1, 0.0, 1.5), short.files).ramp_judged == 2 * C
    assert set(short.deadlines["a/0"].tolist()) == {150, 60}


def _bump_files(bump: float) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A 1-row bump of ``bump`` at row 100 of every file's calibration sets its in-sample
    threshold; the fault after it scores between the thresholds with and without that row."""
    files = _files(range(4), fault=0.0)
    for x, _ in files.values():
        x[100, 0] += bump
        x[600:700, 0] += 2.5
    return files


def test_a_calibration_row_that_sets_the_threshold_fails_the_outlier_check(
        monkeypatch: pytest.MonkeyPatch) -> None:
    grid: Grid = {"wstat": {"window": (5,), "param": (1,), "holdout": (0.0,), "factor": (1.0,)}}
    c = Candidate("wstat", 5, 1, 0.0, 1.0)
    bumped = _study(monkeypatch, _bump_files(12.0), grid)
    counts = bumped.alerts(c)
    without = [counts[bumped._index[outlier_name(n, 100)]] for n in sorted(bumped.files)]
    own = [counts[bumped._index[n]] for n in sorted(bumped.files)]
    assert without != own  # the row that set the threshold changes the alerts
    got = bumped.checks(c, bumped.files)
    assert got.outlier_judged == 4 * len(skab_select.OUTLIER_ROWS)
    assert got.outlier_rate < skab_select.OUTLIER_KEEP_RATE
    assert not bumped.met(c, bumped.group_files(bumped.files))[1]
    plain = _study(monkeypatch, _bump_files(0.0), grid)
    assert plain.met(c, plain.group_files(plain.files))[1]


def test_a_candidate_failing_a_requirement_loses_the_choice(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    study = _study(monkeypatch, _files(range(4)), {"wstat": GRID["wstat"]})
    names = sorted(study.files)
    groups = study.group_files(names)
    best_rated = max(study.candidates, key=lambda c: study.rating(c, groups))
    assert study.choose(names) == best_rated  # it meets both here
    met = study.met

    def fails_ramp(c: Candidate, g: dict[str, list[str]]) -> tuple[bool, bool]:
        return (False, met(c, g)[1]) if c == best_rated else met(c, g)

    monkeypatch.setattr(study, "met", fails_ramp)
    choice = study.choose(names)
    assert choice != best_rated and study.met(choice, groups) == (True, True)
    # when every candidate fails it, the best-rated of those meeting the other one wins
    monkeypatch.setattr(study, "met", lambda c, g: (False, met(c, g)[1]))
    assert study.choose(names) == best_rated


def test_a_choice_checks_only_its_fit_files(monkeypatch: pytest.MonkeyPatch) -> None:
    study = _study(monkeypatch, _files(range(4)), SLOW)
    read: set[str] = set()
    ramp, outlier = study._ramp_check, study._outlier_check

    def spy_ramp(c: Candidate, name: str):  # type: ignore[no-untyped-def]
        read.add(name)
        return ramp(c, name)

    def spy_outlier(c: Candidate, name: str):  # type: ignore[no-untyped-def]
        read.add(name)
        return outlier(c, name)

    monkeypatch.setattr(study, "_ramp_check", spy_ramp)
    monkeypatch.setattr(study, "_outlier_check", spy_outlier)
    for group in ("a", "b"):
        read.clear()
        study._checks.clear()
        study._met.clear()
        study.choose([n for n in study.files if not n.startswith(group + "/")])
        assert read and not any(n.startswith(group + "/") for n in read)
