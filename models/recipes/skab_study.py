"""The grouped SKAB selection's mechanics (:mod:`skab_select` declares the grid and the rules):
the scores of every grid point on every file (:mod:`skab_scoring`), the requirement checks on
them (:mod:`skab_checks`), and the choice, rating, neighbourhood, leave one group out and leave
files out over them. Grid and constants are read from :mod:`skab_select` when used (tests
shrink its ``GRID``).
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
from skab_checks import (
    RULES,
    Checks,
    alert_counts,
    first_alerts,
    normal_rows,
    outlier_series,
    ramp_deadline,
    ramp_series,
)
from skab_detectors import FileScores
from skab_pot import pot_thresholds
from skab_scoring import Ramps, Series, score_fit
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
        #: Every scored series: the files, then their copies without one calibration row
        #: (:func:`outlier_name`).
        self.series = {name: Series(v, sel.N) for name, (v, _) in files.items()}
        self.series |= {outlier_name(name, r): Series(outlier_series(v, r), sel.N - 1)
                        for name, (v, _) in files.items() for r in sel.OUTLIER_ROWS}
        self._index = {name: i for i, name in enumerate(self.series)}
        self.ramps, self.deadlines = ramp_inputs(files, floor)
        self._scores: dict[tuple[str, int, float, float, float, str, tuple[float, float, float]],
                           FileScores] = {}
        self._ramps: dict[tuple[str, int, float, float, float, str,
                                tuple[float, float, float]], np.ndarray] = {}
        by_frac = floors if floors is not None else {sel.FLOOR_FRAC: (floor, feature_floors)}
        for fam in families:
            g = sel.GRID[fam]
            # one fit per (W, floor): every base, top-k, variant and series of it together
            for w, fl in itertools.product(g["window"], sel.axis_values(fam, "floor")):
                inp, feat = by_frac[fl]
                scores, ramps = score_fit(fam, int(w), inp, feat.get(int(w), inp),
                                          self.series, self.ramps)
                for (p, h, name, var), fs in scores.items():
                    self._scores[(fam, int(w), p, h, fl, name, var)] = fs
                for (p, h, name, var), rs in ramps.items():
                    self._ramps[(fam, int(w), p, h, fl, name, var)] = rs
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
        self._pot: dict[tuple[object, ...], tuple[float, ...]] = {}
        self._alerts: dict[Candidate, np.ndarray] = {}
        self._checks: dict[tuple[Candidate, str], Checks] = {}
        self._met: dict[tuple[Candidate, tuple[str, ...]], tuple[bool, bool]] = {}

    def threshold(self, c: Candidate, name: str) -> float:
        """The threshold of candidate ``c`` on one series, from its base scores only."""
        key = (c.detector, c.window, c.param, c.holdout, c.floor, name, c.variant)
        base = self._scores[key].base
        if c.rule == "max":
            return float(base.max()) * c.factor
        if c.rule == "pot":
            qs = tuple(sel.GRID[c.detector]["q"])
            pk = (*key, c.init)
            if pk not in self._pot:
                self._pot[pk] = pot_thresholds(base, c.init, qs)
            return self._pot[pk][qs.index(c.q)]
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
        """The best-ranked candidate on ``names`` (:meth:`rank`: the requirements it meets,
        then its rating; ties: the earlier grid point), among
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
        return max(pool, key=lambda c: self.rank(c, groups))

    def rank(self, c: Candidate, groups: dict[str, list[str]]) -> tuple[int, float]:
        """What a choice maximises (:data:`skab_select.REQUIREMENTS`): the number of
        requirements ``c`` meets on every group, then its :meth:`rating`."""
        return sum(self.met(c, groups)), self.rating(c, groups)

    def met(self, c: Candidate, groups: dict[str, list[str]]) -> tuple[bool, bool]:
        """(slow ramp, outlier in calibration): whether ``c`` meets each requirement
        (:data:`skab_select.REQUIREMENTS`) on every group of ``groups``' files."""
        out = (True, True)
        for names in groups.values():
            key = (c, tuple(names))
            if key not in self._met:
                self._met[key] = self.checks(c, names).met(sel.RAMP_HIT_RATE,
                                                           sel.OUTLIER_KEEP_RATE)
            out = (out[0] and self._met[key][0], out[1] and self._met[key][1])
        return out

    def checks(self, c: Candidate, names: Iterable[str]) -> Checks:
        """The requirement checks of ``c`` summed over the files ``names``."""
        total = Checks()
        for name in names:
            if (c, name) not in self._checks:
                self._checks[(c, name)] = self._ramp_check(c, name) + self._outlier_check(c, name)
            total = total + self._checks[(c, name)]
        return total

    def _ramp_check(self, c: Candidate, name: str) -> Checks:
        """Ramps on ``name`` hit by ``c`` (:data:`skab_select.RAMP_SLOPES`): the first alert
        no later than the reading at which the ramp reaches its reach, and before the file's
        own first alert."""
        if name not in self.ramps:
            return Checks()
        key = (c.detector, c.window, c.param, c.holdout, c.floor, name, c.variant)
        thr = self.threshold(c, name)
        ramped = self._ramps[key]
        clean = first_alerts(self._scores[key].test[None, : ramped.shape[1]] > thr)[0]
        first = first_alerts(ramped > thr)
        deadline = self.deadlines[name]
        judged = deadline <= ramped.shape[1]
        hit = judged & (first < deadline) & (first < clean)
        return Checks(ramp_hits=int(hit.sum()), ramp_judged=int(judged.sum()))

    def _outlier_check(self, c: Candidate, name: str) -> Checks:
        """Calibrations of ``name`` without one row (:data:`skab_select.OUTLIER_ROWS`) after
        which ``c`` raises as many alerts as with the untouched one."""
        counts = self.alerts(c)
        own = counts[self._index[name]]
        kept = sum(int(counts[self._index[outlier_name(name, r)]] == own)
                   for r in sel.OUTLIER_ROWS)
        return Checks(outlier_kept=kept, outlier_judged=len(sel.OUTLIER_ROWS))

    def alerts(self, c: Candidate) -> np.ndarray:
        """Alerts ``c`` raises on every series (``(len(series),)``, in :attr:`series` order),
        under the agent's default rules, one row per second (:func:`skab_checks.alert_counts`).
        Computed for every candidate of ``c``'s fit and base at once."""
        if c not in self._alerts:
            fit = (c.detector, c.window, c.floor, c.holdout)
            same = [x for x in self.candidates
                    if (x.detector, x.window, x.floor, x.holdout) == fit]
            names = list(self.series)
            k = max(self._scores[(*fit[:2], c.param, c.holdout, c.floor, n, c.variant)]
                    .test.shape[0] for n in names)
            above = np.zeros((len(same) * len(names), k), dtype=bool)
            low = np.zeros_like(above)
            length = np.empty(above.shape[0], dtype=np.int64)
            for j, n in enumerate(names):
                rows = np.arange(j, above.shape[0], len(names))
                thr = np.array([self.threshold(x, n) for x in same])
                for x, i, t in zip(same, rows, thr, strict=True):
                    s = self._scores[(x.detector, x.window, x.param, x.holdout, x.floor, n,
                                      x.variant)].test
                    above[i, : s.shape[0]] = s > t
                    low[i, : s.shape[0]] = s < RULES.clear_ratio * t
                    length[i] = s.shape[0]
            counts = alert_counts(above, low, np.arange(sel.N, sel.N + k, dtype=np.float64),
                                  length)
            for i, x in enumerate(same):
                self._alerts[x] = counts[i * len(names): (i + 1) * len(names)]
        return self._alerts[c]

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


def outlier_name(name: str, row: int) -> str:
    """The series name of file ``name`` calibrated without its row ``row``."""
    return f"{name}@{row}"


def ramp_inputs(files: dict[str, tuple[np.ndarray, np.ndarray]], floor: np.ndarray
                ) -> tuple[dict[str, Ramps], dict[str, np.ndarray]]:
    """The slow-ramp requirement's series (:data:`skab_select.RAMP_SLOPES`): per file with
    normal rows after its calibration, its ramped copies (up to the longest deadline those rows
    hold) and each copy's deadline in readings ``(V,)``. σ_cal per channel: the std of the
    file's first N rows, floored at ``floor`` (the input floor at
    :data:`skab_select.FLOOR_FRAC`), the same for every candidate."""
    ramps: dict[str, Ramps] = {}
    deadlines: dict[str, np.ndarray] = {}
    due = {s: ramp_deadline(s, sel.RAMP_REACH) for s in sel.RAMP_SLOPES}
    for name, (values, labels) in files.items():
        rows = normal_rows(labels, sel.N)
        reach = max((d for d in due.values() if d <= rows), default=0)
        if not reach:
            continue
        unit = np.maximum(values[:sel.N].std(0), floor)
        copies, variants = ramp_series(values, sel.N, sel.N + reach, unit, sel.RAMP_SLOPES)
        ramps[name] = Ramps(copies, sel.N)
        deadlines[name] = np.array([due[s] for _, s in variants], dtype=np.int64)
    return ramps, deadlines
