"""Grouped model selection (models/recipes/skab_select.py) on small generated files.

The property that matters: a figure reported for a group (or a fold) comes from a candidate
chosen without reading any of that group's (fold's) files.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "models" / "recipes"))

import skab_select  # noqa: E402
from skab_select import Candidate  # noqa: E402
from skab_study import Study  # noqa: E402

C = 3


def _file(seed: int, drift: float) -> tuple[np.ndarray, np.ndarray]:
    """600 rows: 400 normal, then 100 normal (with ``drift`` on the level) and a 100-row fault."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(600, C))
    x[400:500] += drift
    x[500:] += 4.0
    lab = np.zeros(600, dtype=np.int8)
    lab[500:] = 1
    return x, lab


@pytest.fixture(scope="module")
def study(monkeypatch_module: pytest.MonkeyPatch) -> Study:
    grid = {"wstat": {"window": (5, 10), "param": (1, 2), "holdout": (0.0, 0.25),
                      "factor": (1.0, 1.5, 2.0)}}
    monkeypatch_module.setattr(skab_select, "GRID", grid)
    files = {f"a/{i}": _file(i, 0.0) for i in range(4)}
    files |= {f"b/{i}": _file(10 + i, 1.5) for i in range(4)}
    floors = {w: np.full(3 * C, 0.05) for w in (5, 10)}
    return Study(files, np.full(C, 0.05), floors, ["wstat"])


@pytest.fixture(scope="module")
def monkeypatch_module() -> pytest.MonkeyPatch:
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


class _Spy:
    """Records which files a study reads while it chooses."""

    def __init__(self, study: Study, monkeypatch: pytest.MonkeyPatch) -> None:
        self.read: set[str] = set()
        original = study.counts

        def counts(c: Candidate, name: str) -> np.ndarray:
            self.read.add(name)
            return original(c, name)

        monkeypatch.setattr(study, "counts", counts)


def test_leave_group_out_never_reads_the_held_out_group(study: Study,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    for group in ("a", "b"):
        train = [n for n in study.files if not n.startswith(group + "/")]
        spy = _Spy(study, monkeypatch)
        study.choose(train)
        assert spy.read and not any(n.startswith(group + "/") for n in spy.read)
        monkeypatch.undo()


def test_leave_files_out_chooses_without_the_fold(study: Study,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    chosen_on: list[set[str]] = []
    original = study.choose

    def choose(names: list[str], family: str | None = None,
               rule: str | None = None) -> Candidate:
        chosen_on.append(set(names))
        return original(names, family, rule)

    monkeypatch.setattr(study, "choose", choose)
    figs = study.leave_files_out(folds=2)
    assert set(figs) == {"a", "b"}
    assert len(chosen_on) == 2
    folds = [set(study.files) - s for s in chosen_on]
    assert folds[0].isdisjoint(chosen_on[0]) and folds[1].isdisjoint(chosen_on[1])
    assert folds[0] | folds[1] == set(study.files)


def test_drift_in_one_group_picks_a_threshold_that_covers_it(study: Study) -> None:
    """Group b drifts after calibration; a rule rated on the worst group must not alarm on the
    drift: its chosen candidate keeps b's false-alarm rate low."""
    choice = study.choose(list(study.files))
    b = study.evaluate(choice, [n for n in study.files if n.startswith("b/")])
    assert b.far < 20.0
    assert b.f1 > 0.6


def test_neighbours_stay_in_family_and_base(study: Study) -> None:
    c = Candidate("wstat", 5, 1, 0.25, 1.5)
    hood = study.neighbours(c)
    assert c in hood
    assert all(n.holdout == 0.25 and n.detector == "wstat" for n in hood)
    assert {n.factor for n in hood} == {1.0, 1.5, 2.0}
    assert len(hood) == 1 + 2 + 1 + 1


def test_figures_follow_skab_definitions() -> None:
    f = skab_select.figures(np.array([6, 2, 2, 8]))
    assert f.f1 == pytest.approx(6 / (6 + 2))
    assert f.far == pytest.approx(20.0)
    assert f.mar == pytest.approx(25.0)


def test_floor_is_an_axis_of_the_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    """The floors are chosen by the procedure, not fixed: each fraction has its own scores, and
    the neighbourhood steps along it."""
    grid = {"wstat": {"window": (5,), "param": (1, 2), "holdout": (0.0,),
                      "factor": (1.0, 1.5), "floor": (0.05, 0.5)}}
    monkeypatch.setattr(skab_select, "GRID", grid)
    files = {f"a/{i}": _file(i, 0.0) for i in range(2)}
    files |= {f"b/{i}": _file(10 + i, 1.5) for i in range(2)}
    floors = {f: (np.full(C, f), {5: np.full(3 * C, f)}) for f in (0.05, 0.5)}
    study = Study(files, floors[0.05][0], floors[0.05][1], ["wstat"], floors)
    assert {c.floor for c in study.candidates} == {0.05, 0.5}
    c = Candidate("wstat", 5, 1, 0.0, 1.0, 0.05)
    assert dataclasses.replace(c, floor=0.5) in study.neighbours(c)
    # a ten times larger feature floor divides the deviations: the floor reaches the scores
    low = study._scores[("wstat", 5, 1, 0.0, 0.05, "a/0", (0.0, 0.0, 0.0))].test
    high = study._scores[("wstat", 5, 1, 0.0, 0.5, "a/0", (0.0, 0.0, 0.0))].test
    assert high.max() < low.max()
    assert study.choose(list(files)).floor in (0.05, 0.5)
