"""SKAB loading (models/recipes/skab_data.py) on small generated CSV files: training rows that
repeat a labelled file are dropped, and files that share rows form one recording session.

The real dataset has both cases: the anomaly-free recording ends with the first rows of
``other/5.csv``, and ``other/2``, ``/3`` and ``/4`` overlap; the generated files reproduce them
with other timestamps.
"""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "models" / "recipes"))

import skab_data  # noqa: E402
import skab_floors  # noqa: E402
import skab_select  # noqa: E402
from skab_study import Study  # noqa: E402

T0 = dt.datetime(2021, 5, 1, 8, 0, 0)
HEADER = "datetime;a;b"


def _write(path: Path, start_s: int, rows: int, labelled: bool, seed: int) -> None:
    """``rows`` rows at 1 s from T0 + ``start_s``; values from ``seed``, so two files written
    over the same seconds with the same seed hold the same rows."""
    rng = np.random.default_rng(seed)
    vals = rng.normal(size=(rows, 2))
    head = HEADER + (";anomaly;changepoint" if labelled else "")
    lines = [head]
    for i in range(rows):
        t = (T0 + dt.timedelta(seconds=start_s + i)).strftime("%Y-%m-%d %H:%M:%S")
        lines.append(f"{t};{vals[i, 0]:.6f};{vals[i, 1]:.6f}" + (";0.0;0.0" if labelled else ""))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    # training: seconds 0..999; labelled g/1 starts at second 900 (repeats its last 100 rows)
    _write(tmp_path / "anomaly-free" / "anomaly-free.csv", 0, 1000, False, 0)
    _write(tmp_path / "g" / "1.csv", 900, 300, True, 1)
    # g/2 and g/3 overlap (seconds 2000..2299 and 2250..2549), g/4 only touches g/3
    _write(tmp_path / "g" / "2.csv", 2000, 300, True, 2)
    _write(tmp_path / "g" / "3.csv", 2250, 300, True, 3)
    _write(tmp_path / "g" / "4.csv", 2550, 300, True, 4)
    _write(tmp_path / "h" / "1.csv", 5000, 300, True, 5)
    return tmp_path


def test_training_rows_in_a_labelled_files_time_span_are_dropped(root: Path) -> None:
    full = skab_data.read_skab(skab_data.anomaly_free_file(root))
    train = skab_data.training_recording(root)
    assert full.values.shape == (1000, 2)
    assert train.values.shape == (900, 2)
    np.testing.assert_array_equal(train.values, full.values[:900])
    assert train.times is not None and full.times is not None
    assert int(train.times.max()) < int(full.times.min()) + 900
    labelled = [skab_data.read_skab(p) for p in skab_data.labelled_files(root)]
    skab_data.assert_disjoint(train, labelled)
    with pytest.raises(ValueError, match=r"100 training rows fall inside .*1\.csv"):
        skab_data.assert_disjoint(full, labelled)


def test_a_training_recording_inside_labelled_files_is_refused(tmp_path: Path) -> None:
    _write(tmp_path / "anomaly-free" / "anomaly-free.csv", 100, 50, False, 0)
    _write(tmp_path / "g" / "1.csv", 0, 300, True, 1)
    with pytest.raises(ValueError, match="every row overlaps a labelled file"):
        skab_data.training_recording(tmp_path)


def test_floors_and_study_files_never_use_the_overlapping_rows(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(skab_select, "N", 100)
    monkeypatch.setattr(skab_select, "GRID", {"wstat": {"window": (5,), "param": (1,),
                                                        "holdout": (0.0,), "factor": (1.0,)}})
    seen: list[np.ndarray] = []
    real = skab_floors.floors_at

    def spy(normal: np.ndarray, frac: float) -> tuple[np.ndarray, dict[int, np.ndarray]]:
        seen.append(normal)
        return real(normal, frac)

    monkeypatch.setattr(skab_floors, "floors_at", spy)
    files, floor, _ = skab_floors.load(root)
    skab_floors.load_floors(root, ["wstat"])
    assert len(seen) == 2 and all(n.shape == (900, 2) for n in seen)
    full = skab_data.read_skab(skab_data.anomaly_free_file(root)).values
    np.testing.assert_allclose(floor, 0.1 * full[:900].std(0))
    assert not np.allclose(floor, 0.1 * full.std(0))
    assert set(files) == {"g/1", "g/2", "g/3", "g/4", "h/1"}


def test_files_that_share_rows_are_one_session(root: Path) -> None:
    files = [skab_data.read_skab(p) for p in skab_data.labelled_files(root)]
    groups = [[f"{f.path.parent.name}/{f.path.stem}" for f in s]
              for s in skab_data.sessions(files)]
    assert groups == [["g/1"], ["g/2", "g/3"], ["g/4"], ["h/1"]]
    assert skab_floors.load_sessions(root) == {"g/1": 0, "g/2": 1, "g/3": 1, "g/4": 2, "h/1": 3}


def test_a_session_is_held_out_as_a_whole() -> None:
    """Leave-files-out folds follow sessions: files that share rows are never split between a
    fold and the files its candidate is chosen on."""
    names = [f"g/{i}" for i in range(6)] + ["h/0"]
    sessions = {"g/0": 0, "g/1": 1, "g/2": 1, "g/3": 1, "g/4": 2, "g/5": 3, "h/0": 4}
    study = Study.__new__(Study)
    study.files = dict.fromkeys(names, (np.zeros((1, 1)), np.zeros(1)))
    study.sessions = sessions
    fold = study.fold_of(2)
    assert fold["g/1"] == fold["g/2"] == fold["g/3"] == 1
    assert (fold["g/0"], fold["g/4"], fold["g/5"], fold["h/0"]) == (0, 0, 1, 0)
    # without sessions, file i -> fold i mod 2 would split g/1..g/3
    study.sessions = {n: i for i, n in enumerate(names)}
    split = study.fold_of(2)
    assert len({split["g/1"], split["g/2"], split["g/3"]}) == 2
    study.sessions = {**sessions, "h/0": 1}
    with pytest.raises(ValueError, match="span several groups"):
        study.fold_of(2)


def test_a_labelled_training_recording_keeps_its_labels_row_for_row(tmp_path: Path) -> None:
    """An anomaly-free file that carries label columns: its labels are cut with its rows."""
    _write(tmp_path / "anomaly-free" / "anomaly-free.csv", 0, 1000, True, 0)
    _write(tmp_path / "g" / "1.csv", 900, 300, True, 1)
    train = skab_data.training_recording(tmp_path)
    assert train.anomaly is not None and train.times is not None
    assert train.values.shape[0] == train.anomaly.shape[0] == train.times.shape[0] == 900


def test_a_labelled_file_without_rows_overlaps_nothing(root: Path) -> None:
    (root / "g" / "empty.csv").write_text(HEADER + ";anomaly;changepoint\n", encoding="utf-8")
    train = skab_data.training_recording(root)
    assert train.values.shape == (900, 2)
    files = [skab_data.read_skab(p) for p in skab_data.labelled_files(root)]
    # g/1, g/2+3, g/4 (only touches g/3), g/empty, h/1
    assert [len(s) for s in skab_data.sessions(files)] == [1, 2, 1, 1, 1]
