"""Inputs of the grouped SKAB selection (:mod:`skab_select`): the labelled files, their recording
sessions and the floors, all read from the SKAB root.

The floors come from the anomaly-free recording without its rows that overlap a labelled file
in time (:func:`skab_data.training_recording`), as the package recipe (``skab_wstat.py``) fits
them, so no row of a scored file enters a floor.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import skab_select as sel
from skab_data import labelled_files, read_skab, sessions, training_recording

from fleet.training.wstat import scaled_windows


def load(root: Path) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], np.ndarray,
                              dict[int, np.ndarray]]:
    """Labelled files, the input scale floor and the feature floors per W, from the SKAB root
    (floors from the anomaly-free recording without the rows that overlap a labelled file,
    :func:`skab_data.training_recording`, as the package recipe fits them).

    Raises:
        ValueError: the training rows overlap a labelled file (:func:`skab_data.assert_disjoint`).
    """
    af = training_recording(root)
    floor = sel.FLOOR_FRAC * af.values.std(0)
    files = {}
    for p in labelled_files(root):
        f = read_skab(p)
        assert f.anomaly is not None
        files[f"{p.parent.name}/{p.stem}"] = (f.values, f.anomaly)
    return files, floor, floors_at(af.values, sel.FLOOR_FRAC)[1]


def load_sessions(root: Path) -> dict[str, int]:
    """Labelled file name (as :func:`load` names it) -> recording session id
    (:func:`skab_data.sessions`: files whose time spans overlap)."""
    files = [read_skab(p) for p in labelled_files(root)]
    return {f"{f.path.parent.name}/{f.path.stem}": i
            for i, members in enumerate(sessions(files)) for f in members}


def floors_at(normal: np.ndarray, frac: float) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """Input floor ``frac`` × std ``(C,)`` of the normal recording ``(T, C)``, and per W of
    :data:`skab_select.GRID` the feature floors ``frac`` × each feature's std over emulated
    calibrations of it (as ``skab_wstat.py`` fits them)."""
    floor = frac * normal.std(0)
    ffloors = {}
    for w in sorted({int(w) for g in sel.GRID.values() for w in g["window"] if w > 1}):
        _, feats = scaled_windows(normal, w, sel.N, floor, step=100, span=sel.N + 600)
        ffloors[w] = frac * feats.std(0)
    return floor, ffloors


def load_floors(root: Path, families: Sequence[str]) -> sel.Floors:
    """:func:`floors_at` for every floor fraction of ``families``' grids, on the anomaly-free
    recording without its rows in a labelled file's time span
    (:func:`skab_data.training_recording`): no row of a labelled file."""
    normal = training_recording(root).values
    fracs = sorted({f for fam in families for f in sel.axis_values(fam, "floor")})
    return {f: floors_at(normal, f) for f in fracs}
