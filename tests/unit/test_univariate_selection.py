"""The univariate grouped selection (models/recipes/univariate_select.py): event counting, and
that a group's held-out figure comes from a choice that never read that group."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "models" / "recipes"))

import univariate_select as sel


def test_events_alarms_and_delay_are_counted_per_labelled_run() -> None:
    labels = np.zeros(100, np.int8)
    labels[40:60] = 1
    labels[80:90] = 1
    alarms = np.zeros(100, np.int8)
    alarms[[10, 45, 50]] = 1  # one false alarm, event 1 found 5 rows in, event 2 missed
    r = sel.rate(alarms, labels, scored_from=20)
    assert (r.alarms, r.hits, r.events, r.detected) == (3, 2, 2, 1)
    assert r.delay == pytest.approx(5 / 20)
    assert r.precision == pytest.approx(2 / 3) and r.recall == pytest.approx(0.5)
    # an event that ends inside the calibration is not counted
    assert sel.rate(alarms, labels, scored_from=70).events == 1


def _series(seed: int, shift_at: int | None) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=1200)
    lab = np.zeros(1200, np.int8)
    if shift_at is not None:
        x[shift_at : shift_at + 300] += 4.0
        lab[shift_at : shift_at + 300] = 1
    return x, lab


def test_held_out_choice_never_reads_the_held_out_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sel, "GRID", {"window": (5, 10), "top_k": (2,), "factor": (1.25, 2.0),
                                      "adapt": ((0.0, 0.0), (0.01, 3.0)),
                                      "rule": ((5, 10), (7, 10))})
    monkeypatch.setattr(sel, "AXES", tuple(sel.GRID))
    floors = {w: np.array([0.15, 0.03, 0.045]) for w in (5, 10)}
    series = {"a/1/x": _series(0, 600), "a/2/x": _series(1, None),
              "b/1/x": _series(2, 700), "b/2/x": _series(3, None)}
    study = sel.Study(series, floors)
    train = ["a/1/x", "a/2/x"]
    chosen = study.choose(train)
    # the same choice whatever group b's labels say
    flipped = {k: (v[0], 1 - v[1] if k.startswith("b/") else v[1]) for k, v in series.items()}
    assert sel.Study(flipped, floors).choose(train) == chosen
    lines: list[str] = []
    sel.report(study, lines.append)
    assert any(line.startswith("held-out group a") for line in lines)
    assert any(line.startswith("pooled, chosen on all") for line in lines)
