"""The neighbourhood spread the grouped selection (models/recipes/skab_select.py) reports for a
held-out group is read around the candidate chosen on the other group, on the held-out files:
a spread around a point picked on the files it is read on would flatter the point."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "models" / "recipes"))

import skab_report
import skab_select
from skab_select import Candidate, Figures
from skab_study import Study

C = 3


def _file(seed: int, drift: float) -> tuple[np.ndarray, np.ndarray]:
    """600 rows: 400 normal, 100 normal with ``drift`` on the level, a 100-row fault."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(600, C))
    x[400:500] += drift
    x[500:] += 4.0
    lab = np.zeros(600, dtype=np.int8)
    lab[500:] = 1
    return x, lab


def test_held_out_spread_is_read_around_the_other_groups_choice(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(skab_select, "GRID", {"wstat": {
        "window": (5, 10), "param": (1, 2), "holdout": (0.0, 0.25), "factor": (1.0, 1.5, 2.0)}})
    files = {f"a/{i}": _file(i, 0.0) for i in range(3)}
    files |= {f"b/{i}": _file(10 + i, 1.5) for i in range(3)}
    study = Study(files, np.full(C, 0.05), {w: np.full(3 * C, 0.05) for w in (5, 10)}, ["wstat"])
    spreads: list[tuple[Candidate, frozenset[str]]] = []
    original = study.spread

    def spread(c: Candidate, names: list[str]) -> tuple[Figures, Figures]:
        spreads.append((c, frozenset(names)))
        return original(c, names)

    monkeypatch.setattr(study, "spread", spread)
    lines: list[str] = []
    skab_report.report(study, ["wstat"], lines.append)
    for group, other in (("a", "b"), ("b", "a")):
        held = frozenset(n for n in files if n.startswith(group + "/"))
        chosen = study.choose([n for n in files if n.startswith(other + "/")], "wstat")
        assert (chosen, held) in spreads
        worst, best = original(chosen, sorted(held))
        line = next(x for x in lines if x.split()[:4] == ["wstat", "held-out", "group", group]
                    and "neighbourhood" in x)
        assert f"F1 {worst.f1:.3f}..{best.f1:.3f}" in line
        assert f"FAR {best.far:.2f}..{worst.far:.2f}" in line
    assert any(x.startswith("pooled (chosen on the same files) neighbourhood") for x in lines)
