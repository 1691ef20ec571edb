"""The grouped SKAB selection's mechanics (:mod:`skab_select` declares the grid and the rules):
the scores of every grid point on every file, and the choice, rating, neighbourhood, leave one
group out and leave files out over them. Grid and constants are read from :mod:`skab_select`
when used (tests shrink its ``GRID``).
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import skab_select as sel
from skab_detectors import FeatureCache, FileScores, file_scores
from skab_pot import pot_threshold
from skab_select import Candidate, Figures, Floors, Pick, figures


def _matches(value: str, want: str | tuple[str, ...] | None) -> bool:
    return want is None or (value == want if isinstance(want, str) else value in want)



class Study:
    """Scores of every grid point on every file, and the selection rules over them.

    Args:
        files: ``{name: (values (T, C), labels (T,))}``; the group is the name's first part
            (``valve1/3`` → ``valve1``).
        floor: Input scale floor ``(C,)``; feature_floors: W -> ``(3·C,)`` feature std floor:
            the floors at :data:`skab_select.FLOOR_FRAC`.
        families: The detector families to study.
        floors: The floors of every fraction of a ``floor`` axis (:func:`load_floors`); None:
            only ``floor``/``feature_floors``, at :data:`skab_select.FLOOR_FRAC`.
        sessions: name -> recording session id (:func:`load_sessions`); files of one session
            are held out together. None: every file is its own session.

    Raises:
        KeyError: a family's floor fraction has no floors.
    """

    def __init__(self, files: dict[str, tuple[np.ndarray, np.ndarray]], floor: np.ndarray,
                 feature_floors: dict[int, np.ndarray], families: Sequence[str],
                 floors: Floors | None = None, sessions: dict[str, int] | None = None
                 ) -> None:
        self.files = files
        self.sessions = sessions if sessions is not None else {n: i for i, n in
                                                               enumerate(sorted(files))}
        self.labels = {k: v[1][sel.N:] == 1 for k, v in files.items()}
        self.groups = sorted({k.split("/")[0] for k in files})
        self.candidates: list[Candidate] = []
        self._scores: dict[tuple[str, int, float, float, float, str, tuple[float, float, float]],
                           FileScores] = {}
        by_frac = floors if floors is not None else {sel.FLOOR_FRAC: (floor, feature_floors)}
        for fam in families:
            g = sel.GRID[fam]
            # scored per (W, base, floor), every top-k and variant of it sharing the features
            for w, h, fl in itertools.product(g["window"], g["holdout"],
                                              sel.axis_values(fam, "floor")):
                inp, feat = by_frac[fl]
                caches: dict[str, FeatureCache] = {name: {} for name in files}
                for p, var in itertools.product(g["param"], sel.variants(fam)):
                    for name, (values, _) in files.items():
                        self._scores[(fam, int(w), p, h, fl, name, var)] = file_scores(
                            sel.detector_of(fam), values, sel.N, int(w), p, h, inp,
                            feat.get(int(w), inp), robust=bool(var[0]), adapt_rate=var[1],
                            drift_bound=var[2], cache=caches[name])
            # the candidates in grid order (ties go to the earlier grid point)
            grid = itertools.product(g["window"], g["param"], g["holdout"],
                                     sel.axis_values(fam, "floor"), sel.variants(fam))
            for w, p, h, fl, var in grid:
                self.candidates += [Candidate(fam, int(w), p, h, f, fl, "max", 0.0, 0.0, *var)
                                    for f in g["factor"]]
                if "q" in g and "init" in g and not any(var):
                    self.candidates += [Candidate(fam, int(w), p, h, 1.0, fl, "pot", q, i)
                                        for q, i in itertools.product(g["q"], g["init"])]
        self._counts: dict[tuple[Candidate, str], np.ndarray] = {}
        self._pot: dict[tuple[object, ...], float] = {}

    def threshold(self, c: Candidate, name: str) -> float:
        """The threshold of candidate ``c`` on one file, from its base scores only."""
        key = (c.detector, c.window, c.param, c.holdout, c.floor, name, c.variant)
        base = self._scores[key].base
        if c.rule == "max":
            return float(base.max()) * c.factor
        if c.rule == "pot":
            pk = (*key, c.init, c.q)
            if pk not in self._pot:
                self._pot[pk] = pot_threshold(base, c.init, c.q)
            return self._pot[pk]
        raise ValueError(f"unknown threshold rule {c.rule!r}")

    def counts(self, c: Candidate, name: str) -> np.ndarray:
        """(TP, FP, FN, TN) of candidate ``c`` on one file."""
        key = (c, name)
        if key not in self._counts:
            s = self._scores[(c.detector, c.window, c.param, c.holdout, c.floor, name,
                              c.variant)]
            pred = s.test > self.threshold(c, name)
            lab = self.labels[name]
            self._counts[key] = np.array([(pred & lab).sum(), (pred & ~lab).sum(),
                                          (~pred & lab).sum(), (~pred & ~lab).sum()])
        return self._counts[key]

    def evaluate(self, c: Candidate, names: Iterable[str]) -> Figures:
        """Pooled figures of ``c`` on ``names``."""
        return figures(sum((self.counts(c, n) for n in names), np.zeros(4)))

    def neighbours(self, c: Candidate) -> list[Candidate]:
        """``c`` and the candidates one grid step from it along one of its rule's
        :data:`skab_select.RULE_AXES` (same family, threshold base and rule)."""
        out = [c]
        for axis in sel.RULE_AXES[c.rule] + (sel.ADAPT_AXES if c.adapt_rate > 0 else ()):
            vals = sel.axis_values(c.detector, axis)
            if axis == "adapt_rate":
                vals = tuple(v for v in vals if v > 0)
            i = vals.index(getattr(c, axis))
            for j in (i - 1, i + 1):
                if 0 <= j < len(vals):
                    step: dict[str, Any] = {axis: int(vals[j]) if axis == "window"
                                            else vals[j]}
                    out.append(replace(c, **step))
        return out

    def rating(self, c: Candidate, groups: dict[str, list[str]]) -> float:
        """Worst group's neighbourhood-mean J."""
        hood = self.neighbours(c)
        return min(float(np.mean([self.evaluate(x, names).objective for x in hood]))
                   for names in groups.values())

    def group_files(self, names: Iterable[str]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for n in sorted(names):
            out.setdefault(n.split("/")[0], []).append(n)
        return out

    def choose(self, names: Iterable[str], family: Pick = None, rule: Pick = None
               ) -> Candidate:
        """The best-rated candidate on ``names`` (ties: the earlier grid point), among
        ``family``'s candidates whose :attr:`Candidate.kind` is ``rule`` (each a name, a tuple
        of names or None: any; ``max`` is the unchanged window statistics with max × factor).

        Raises:
            ValueError: no candidate is of that family and kind.
        """
        groups = self.group_files(names)
        pool = [c for c in self.candidates if _matches(c.detector, family)
                and _matches(c.kind, rule)]
        if not pool:
            raise ValueError(f"no candidate of family {family} and kind {rule}")
        return max(pool, key=lambda c: self.rating(c, groups))

    def spread(self, c: Candidate, names: Sequence[str]) -> tuple[Figures, Figures]:
        """(worst, best) of each figure over the neighbourhood of ``c`` on ``names``."""
        figs = [self.evaluate(x, names) for x in self.neighbours(c)]
        return (Figures(min(f.f1 for f in figs), max(f.far for f in figs),
                        max(f.mar for f in figs)),
                Figures(max(f.f1 for f in figs), min(f.far for f in figs),
                        min(f.mar for f in figs)))

    def leave_group_out(self, family: Pick = None, rule: Pick = None
                        ) -> dict[str, tuple[Candidate, Figures]]:
        """Per group: the candidate chosen on the other groups and its figures on this one."""
        out = {}
        for g in self.groups:
            train = [n for n in self.files if not n.startswith(g + "/")]
            test = [n for n in self.files if n.startswith(g + "/")]
            c = self.choose(train, family, rule)
            out[g] = (c, self.evaluate(c, test))
        return out

    def fold_of(self, folds: int) -> dict[str, int]:
        """name -> fold: within each group the sessions, ordered by their first file name,
        go to fold i mod ``folds``; every file of a session lands in its session's fold.

        Raises:
            ValueError: a session spans two groups (it could not be held out with either).
        """
        out: dict[str, int] = {}
        for names in self.group_files(self.files).values():
            order: list[int] = []
            for n in names:
                if self.sessions[n] not in order:
                    order.append(self.sessions[n])
            for n in names:
                out[n] = order.index(self.sessions[n]) % folds
        groups_of: dict[int, set[str]] = {}
        for n in self.files:
            groups_of.setdefault(self.sessions[n], set()).add(n.split("/")[0])
        mixed = [s for s, gs in groups_of.items() if len(gs) > 1]
        if mixed:
            raise ValueError(f"recording sessions {mixed} span several groups")
        return out

    def leave_files_out(self, folds: int = 4, family: Pick = None,
                        rule: Pick = None) -> dict[str, Figures]:
        """Per group: pooled figures of its folds, each scored with the candidate chosen on
        every file outside the fold (:meth:`fold_of`). A fold with no file outside it (a group
        of one session) has nothing to choose on: it is not scored, and a group none of whose
        folds was scored has no figures."""
        total: dict[str, np.ndarray] = {}
        fold_of = self.fold_of(folds)
        for fold in range(folds):
            held = {n for n, f in fold_of.items() if f == fold}
            train = [n for n in self.files if n not in held]
            if not held or not train:
                continue
            c = self.choose(train, family, rule)
            for n in held:
                g = n.split("/")[0]
                total[g] = total.get(g, np.zeros(4)) + self.counts(c, n)
        return {g: figures(total[g]) for g in self.groups if g in total}
