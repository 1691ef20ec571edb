"""Grouped model selection for the univariate package, on univariate series derived from SKAB.

    python models/recipes/univariate_select.py --data ../shared/datasets/skab [--json OUT]

Series: every channel of every labelled SKAB file, alone, with its file's labels (8 × 23 = 184
series), in two groups by file, ``valve1`` and ``other``. Each series runs as the benchmark runs
a file (:func:`benchmarks.univariate.score_series`: the agent's univariate pipeline and alert
rules, calibration length :func:`benchmarks.univariate.calibration_length`), with the FP32 NumPy
reference of the window-statistics model (the shipped artefacts compute the same features).
Timestamps are the row numbers (SKAB is sampled at 1 s). Labels are used only to rate.

A channel that does not respond to its file's fault cannot detect it, whatever the parameters:
recall is low for every candidate alike, and the objective is dominated by what matters on a new
plant: false alarms on normal rows and early detection of sustained change.

* **Events.** A labelled run of anomalous rows is an event; it is *detected* when an alarm is
  raised on one of its rows; an alarm on a normal row is a *false alarm*. Events that end inside
  the calibration are not counted.
* **Objective** on a set of series (pooled counts): J = F0.5 − 0.25·D, with precision = alarms
  inside events / all alarms, recall = detected events / events, F0.5 = 1.25·P·R / (0.25·P + R)
  (precision weighted above recall: a detector that cries wolf is switched off), and D the
  mean detection delay of the detected events as a fraction of their length.
* **Smoothing, worst group, leave one group out, the neighbourhood spread**: as
  :mod:`skab_select` (a candidate is rated by the mean J over itself and its neighbours one grid
  step away along each axis; with both groups, the worst group's rating; each group is
  reported with the candidate chosen on the other).

The grid (:data:`GRID`) is declared once, before any scoring. Fixed, not searched: the threshold
base (held-out 25 %, the house choice), the gap factor, the relative floor and ``adapt_below``
(SKAB has no gaps or flat channels to choose them on; documented in docs/detection.md).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from skab_data import anomaly_free_file, labelled_files, read_skab
from univariate import calibration_length, score_series
from univariate_wstat import FEATURE_FLOOR_FRAC, training_windows

from agent.pipeline.detector import DetectorSpec
from agent.pipeline.rules import AlertRules, RuleParams
from agent.pipeline.univariate import UnivariateParams
from cloud_sync.calibration import FEATURES, window_features

N = 400
FRACTION = 0.15
HOLDOUT = 0.25
BLOCK = 50
#: Axis -> values (ordered; neighbours are adjacent values). ``rule`` is (k, n).
GRID: dict[str, tuple[object, ...]] = {
    "window": (10, 20),
    "top_k": (2, 3),
    "factor": (1.0, 1.25, 1.5, 2.0),
    "adapt": ((0.005, 3.0), (0.01, 3.0), (0.01, 6.0)),
    "rule": ((3, 5), (5, 10), (7, 10), (8, 10)),
}
#: The first, wider grid (W 5, top-k 1 and no adaptation as well). Neither group chose W 5 or
#: top-k 1; adaptation off was chosen, because SKAB's series (about 1,000 rows) hold no slow
#: drift to rate it on. Bounded adaptation is a requirement of a stream without labels, so the
#: shipped grid keeps it on (docs/detection.md gives both runs' figures).
WIDE_GRID: dict[str, tuple[object, ...]] = {
    "window": (5, 10, 20),
    "top_k": (1, 2, 3),
    "factor": (1.0, 1.25, 1.5, 2.0),
    "adapt": ((0.0, 0.0), (0.005, 3.0), (0.01, 3.0), (0.01, 6.0)),
    "rule": ((3, 5), (5, 10), (7, 10), (8, 10)),
}
AXES = tuple(GRID)


class NumpyBackend:
    """The window-statistics model as NumPy (:func:`window_features`), FP32."""

    name = "numpy"
    precision = "fp32"

    def run(self, x: np.ndarray) -> np.ndarray:
        return window_features(x.astype(np.float32))


@dataclass(frozen=True)
class Rated:
    """Pooled event counts: alarms, alarms inside events, events, detected, delay sum."""

    alarms: int
    hits: int
    events: int
    detected: int
    delay: float

    def __add__(self, o: Rated) -> Rated:
        return Rated(self.alarms + o.alarms, self.hits + o.hits, self.events + o.events,
                     self.detected + o.detected, self.delay + o.delay)

    @property
    def precision(self) -> float:
        return self.hits / self.alarms if self.alarms else 1.0

    @property
    def recall(self) -> float:
        return self.detected / self.events if self.events else 0.0

    @property
    def mean_delay(self) -> float:
        return self.delay / self.detected if self.detected else 1.0

    @property
    def objective(self) -> float:
        p, r = self.precision, self.recall
        f = 1.25 * p * r / (0.25 * p + r) if p + r else 0.0
        return f - 0.25 * self.mean_delay

    def text(self) -> str:
        return (f"J={self.objective:.3f} P={self.precision:.3f} R={self.recall:.3f} "
                f"delay={self.mean_delay:.3f} false_alarms={self.alarms - self.hits}")


ZERO = Rated(0, 0, 0, 0, 0.0)


def events(labels: np.ndarray) -> list[tuple[int, int]]:
    """``[start, end)`` row ranges of the runs of 1 in ``labels``."""
    d = np.diff(np.concatenate([[0], labels.astype(np.int8), [0]]))
    return list(zip(np.flatnonzero(d == 1).tolist(), np.flatnonzero(d == -1).tolist(),
                    strict=True))


def rate(alarms: np.ndarray, labels: np.ndarray, scored_from: int) -> Rated:
    """Counts of one series (module docstring)."""
    rows = np.flatnonzero(alarms)
    ev = [(a, b) for a, b in events(labels) if b > scored_from]
    hits = int(labels[rows].sum()) if rows.size else 0
    detected, delay = 0, 0.0
    for a, b in ev:
        inside = rows[(rows >= a) & (rows < b)]
        if inside.size:
            detected += 1
            delay += (inside[0] - a) / (b - a)
    return Rated(int(rows.size), hits, len(ev), detected, delay)


def replay_rules(scores: np.ndarray, threshold: float, rule: tuple[int, int]) -> np.ndarray:
    """Alarms ``(T,)`` of :class:`AlertRules` (k of n, other parameters the defaults) fed the
    scored rows in order (NaN rows are not windows)."""
    r = AlertRules(RuleParams(k=rule[0], n=rule[1]))
    out = np.zeros(scores.shape[0], np.int8)
    for i in np.flatnonzero(~np.isnan(scores)).tolist():
        out[i] = r.update(float(scores[i]), threshold, float(i))
    return out


class Study:
    """Every grid point on every series.

    Args:
        series: ``{name: (values (T,), labels (T,))}``; group = the name's first part.
        feature_floors: W -> ``(3,)`` feature std floor, as the package recipe fits it.
    """

    def __init__(self, series: dict[str, tuple[np.ndarray, np.ndarray]],
                 feature_floors: dict[int, np.ndarray]) -> None:
        self.series = series
        self.groups = sorted({k.split("/")[0] for k in series})
        self._rated: dict[tuple[object, ...], dict[str, Rated]] = {}
        backend = NumpyBackend()
        for w, k, f, ad in itertools.product(GRID["window"], GRID["top_k"], GRID["factor"],
                                             GRID["adapt"]):
            per_rule: dict[tuple[int, int], dict[str, Rated]] = {r: {} for r in GRID["rule"]}
            for name, (values, labels) in series.items():
                n_cal = calibration_length(values.shape[0], N, FRACTION, w, HOLDOUT)
                spec = DetectorSpec(("value",), w, 1, n_cal, np.array([1e-9]), len(FEATURES),
                                    k, feature_floors[w], 1.0, f, HOLDOUT)
                params = UnivariateParams(adapt_rate=ad[0], drift_bound=ad[1])
                ts = np.arange(values.shape[0], dtype=np.float64)
                scores, _, thr = score_series(ts, values, spec, backend, RuleParams(),
                                              params, BLOCK)
                for rule in GRID["rule"]:
                    alarms = replay_rules(scores, thr, rule)
                    per_rule[rule][name] = rate(alarms, labels, n_cal)
            for rule, rated in per_rule.items():
                self._rated[(w, k, f, ad, rule)] = rated
        self.candidates = list(self._rated)

    def evaluate(self, c: tuple[object, ...], names: Iterable[str]) -> Rated:
        rated = self._rated[c]
        return sum((rated[n] for n in names), ZERO)

    def neighbours(self, c: tuple[object, ...]) -> list[tuple[object, ...]]:
        out = [c]
        for i, axis in enumerate(AXES):
            vals = GRID[axis]
            j = vals.index(c[i])
            for m in (j - 1, j + 1):
                if 0 <= m < len(vals):
                    out.append((*c[:i], vals[m], *c[i + 1:]))
        return out

    def by_group(self, names: Iterable[str]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for n in sorted(names):
            out.setdefault(n.split("/")[0], []).append(n)
        return out

    def rating(self, c: tuple[object, ...], groups: dict[str, list[str]]) -> float:
        hood = self.neighbours(c)
        return min(float(np.mean([self.evaluate(x, names).objective for x in hood]))
                   for names in groups.values())

    def choose(self, names: Iterable[str]) -> tuple[object, ...]:
        groups = self.by_group(names)
        return max(self.candidates, key=lambda c: self.rating(c, groups))


def describe(c: tuple[object, ...]) -> str:
    w, k, f, ad, rule = c
    assert isinstance(ad, tuple) and isinstance(rule, tuple)
    return (f"W={w} top_k={k} factor={f} adapt_rate={ad[0]} drift_bound={ad[1]} "
            f"rule={rule[0]}/{rule[1]}")


def load(root: Path) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], dict[int, np.ndarray]]:
    """Every channel of every labelled SKAB file as a univariate series, and the feature
    floors per W (from the anomaly-free recording, :func:`univariate_wstat.training_windows`)."""
    af = read_skab(anomaly_free_file(root))
    floors = {int(w): FEATURE_FLOOR_FRAC * training_windows(af.values, int(w), N)[1].std(0)
              for w in GRID["window"]}  # type: ignore[call-overload]
    out = {}
    for p in labelled_files(root):
        f = read_skab(p)
        assert f.anomaly is not None
        for c, ch in enumerate(f.channels):
            out[f"{p.parent.name}/{p.stem}/{ch}"] = (f.values[:, c].copy(), f.anomaly)
    return out, floors


def report(study: Study, log: Callable[[str], None] = print) -> tuple[object, ...]:
    """Print leave-one-group-out, pooled and neighbourhood figures; return the choice."""
    names = sorted(study.series)
    for g in study.groups:
        train = [n for n in names if not n.startswith(g + "/")]
        test = [n for n in names if n.startswith(g + "/")]
        c = study.choose(train)
        log(f"held-out group {g:<7} {study.evaluate(c, test).text()}   chosen on the other: "
            f"{describe(c)}")
    choice = study.choose(names)
    log(f"pooled, chosen on all  {study.evaluate(choice, names).text()}   {describe(choice)}")
    for g, members in study.by_group(names).items():
        log(f"  group {g:<7} (same choice) {study.evaluate(choice, members).text()}")
    figs = [study.evaluate(x, names) for x in study.neighbours(choice)]
    log(f"neighbourhood ({len(figs)} points) pooled J {min(f.objective for f in figs):.3f}.."
        f"{max(f.objective for f in figs):.3f} P {min(f.precision for f in figs):.3f}.."
        f"{max(f.precision for f in figs):.3f} R {min(f.recall for f in figs):.3f}.."
        f"{max(f.recall for f in figs):.3f}")
    return choice


def export(series: dict[str, tuple[np.ndarray, np.ndarray]], out: Path) -> None:
    """Write each series as ``out/<group>/<file>/<channel>.csv`` (``timestamp,value``, epoch
    seconds one per row), the input of ``benchmarks/univariate.py``; labels are not written."""
    for name, (values, _) in series.items():
        path = out / f"{name.replace(' ', '_')}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = [f"{1_600_000_000 + i},{float(v)!r}" for i, v in enumerate(values)]
        path.write_text("timestamp,value\n" + "\n".join(lines) + "\n", encoding="utf-8")


def rate_outputs(series: dict[str, tuple[np.ndarray, np.ndarray]], out: Path,
                 log: Callable[[str], None] = print) -> None:
    """Rate ``benchmarks/univariate.py`` outputs of :func:`export`'s files against the labels
    (per group and pooled; calibration rows = the rows with an empty score at the start)."""
    by_group: dict[str, Rated] = {}
    for name, (_, labels) in sorted(series.items()):
        path = out / f"{name.replace(' ', '_')}.csv"
        rows = path.read_text(encoding="utf-8").splitlines()[1:]
        fields = [r.split(",") for r in rows]
        alarms = np.array([int(f[3]) for f in fields], np.int8)
        scored_from = next((i for i, f in enumerate(fields) if f[2]), len(fields))
        g = name.split("/")[0]
        by_group[g] = by_group.get(g, ZERO) + rate(alarms, labels, scored_from)
    for g, r in by_group.items():
        log(f"benchmark output, group {g:<7} {r.text()}")
    log(f"benchmark output, pooled        {sum(by_group.values(), ZERO).text()}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="grouped selection of the univariate defaults")
    ap.add_argument("--data", type=Path, required=True, help="SKAB root directory")
    ap.add_argument("--json", type=Path, help="write the choice here (univariate_wstat.py "
                    "--selection)")
    ap.add_argument("--limit", type=int, default=0, help="only the first N series (tests)")
    ap.add_argument("--wide", action="store_true", help="the first, wider grid (WIDE_GRID)")
    ap.add_argument("--export", type=Path, help="write the series as timestamp,value CSVs "
                    "here and stop")
    ap.add_argument("--rate", type=Path, help="rate benchmarks/univariate.py's output folder "
                    "of the exported series and stop")
    args = ap.parse_args(argv)
    global GRID, AXES
    if args.wide:
        GRID, AXES = WIDE_GRID, tuple(WIDE_GRID)
    series, floors = load(args.data)
    if args.export:
        export(series, args.export)
        return 0
    if args.rate:
        rate_outputs(series, args.rate)
        return 0
    if args.limit:
        keep = sorted(series)[: args.limit]
        series = {k: series[k] for k in keep}
    study = Study(series, floors)
    choice = report(study)
    if args.json:
        w, k, f, ad, rule = choice
        assert isinstance(ad, tuple) and isinstance(rule, tuple)
        args.json.write_text(json.dumps(
            {"window": w, "top_k": k, "factor": f, "holdout": HOLDOUT, "adapt_rate": ad[0],
             "drift_bound": ad[1], "rule_k": rule[0], "rule_n": rule[1]}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
