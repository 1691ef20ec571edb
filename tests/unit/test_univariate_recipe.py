"""The univariate package recipe (models/recipes/univariate_wstat.py) takes every detector and
rule default from the grouped selection: it has no hand-picked fallback to ship silently."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "models" / "recipes"))

import univariate_wstat

CHOICE = {"window": 5, "top_k": 1, "threshold_sigma": 5.0, "adapt_rate": 0.01,
          "scale_rate": 0.01, "drift_bound": 6.0, "clip": 3.0, "scale_bound": 4.0, "rule_k": 3,
          "rule_n": 5, "spike_factor": 1.5}


def test_a_build_without_a_selection_is_refused(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        univariate_wstat.main(["--data", str(tmp_path), "--out", str(tmp_path / "pkg")])
    assert exc.value.code == 2
    assert "--selection" in capsys.readouterr().err
    assert not (tmp_path / "pkg").exists()


def test_a_selection_missing_a_choice_names_it(tmp_path: Path) -> None:
    sel = tmp_path / "uni.json"
    drop = ("rule_k", "threshold_sigma")
    sel.write_text(json.dumps({k: v for k, v in CHOICE.items() if k not in drop}))
    with pytest.raises(SystemExit, match=r"lacks threshold_sigma, rule_k") as exc:
        univariate_wstat.main(["--data", str(tmp_path), "--out", str(tmp_path / "pkg"),
                               "--selection", str(sel)])
    assert "univariate_select.py" in str(exc.value.code)
    assert not (tmp_path / "pkg").exists()


def test_a_full_selection_is_taken_whole(tmp_path: Path) -> None:
    sel = tmp_path / "uni.json"
    sel.write_text(json.dumps({**CHOICE, "extra": 1}))
    assert univariate_wstat.read_selection(sel) == CHOICE
    off = {**CHOICE, "spike_factor": None}  # the single-window path off is a choice too
    sel.write_text(json.dumps(off))
    assert univariate_wstat.read_selection(sel) == off
    sel.write_text("[1, 2]")
    with pytest.raises(SystemExit, match="JSON object"):
        univariate_wstat.read_selection(sel)
    sel.write_text("{not json")
    with pytest.raises(SystemExit, match="not a selection file"):
        univariate_wstat.read_selection(sel)


def test_spike_windows_stay_inside_the_sample_range() -> None:
    """The INT8 quantization sample's spike windows: 1 or 3 rows at the sample's extremes, so
    the output ranges cover a spike whose input the INT8 artefact still represents."""
    windows = np.random.default_rng(0).normal(size=(200, 5, 1))
    out = univariate_wstat.spike_windows(windows, 4, np.random.default_rng(1))
    lo, hi = windows.min(), windows.max()
    assert out.shape == (4, 5, 1) and lo <= out.min() and out.max() <= hi
    assert [int(np.isin(w, (lo, hi)).sum()) for w in out] == [1, 3, 1, 3]
