"""SKAB benchmark of the agent's own detector, with the published protocol.

    python benchmarks/skab.py --data ../shared/datasets/skab [--model models/skab-wstat]
        [--families wstat,wstat-drift,pca,mset] [--group valve1|other]

For EACH labelled file separately: calibrate (scaler, feature statistics, threshold) on the first
400 rows with no labels, score every later row (the window ending at that row), then pool all
scored rows of all files and report F1 = TP/(TP+(FP+FN)/2), FAR % = FP/(FP+TN)·100 and
MAR % = FN/(FN+TP)·100 (Katser & Kozitsin, SKAB, 2020), for the INT8 model and its FP32 twin,
beside the published outlier-detection rows, per group (valve1, other) and pooled.

Then the grouped model selection (:mod:`skab_select`, FP32 NumPy references of every candidate
family side by side: window statistics with the in-sample and the held-out threshold base and
with the max × factor and the peaks-over-threshold threshold rules, their drift variants
(``wstat-drift``: robust statistics, bounded level adaptation), lagged-window PCA T²+Q,
MSET): each group scored with the parameters chosen on the other group, leave-files-out within
each group, the pooled figure with parameters chosen on all files, and the spread over the
chosen point's neighbourhood; it says whether the package's defaults are the ones the procedure
picks. The last line is the shipped INT8 result, pooled:
``F1=<0..1> FAR=<percent> MAR=<percent>``.

It uses the same classes as the daemon: ``load_package`` → ``open_backend`` →
``StreamPipeline`` (windowing, calibration, detector), fed the file through ``ReplaySource``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
import time
from pathlib import Path

# The selection's small matrix products and SVDs (PCA, MSET) run several times faster on one
# BLAS thread than on threads competing for a shared machine's cores; set before NumPy loads.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "models" / "recipes"))

from skab_data import labelled_files  # noqa: E402

from agent.errors import RecordError, SourceExhausted  # noqa: E402
from agent.inference.package import (  # noqa: E402
    load_package,
    open_backend,
    saturation_fallback,
)
from agent.pipeline.detector import FeatureDeviationDetector  # noqa: E402
from agent.pipeline.rules import RuleParams  # noqa: E402
from agent.pipeline.stream import StreamPipeline  # noqa: E402
from agent.records import Reading  # noqa: E402
from agent.sources.replay import ReplayConfig, ReplaySource  # noqa: E402

PUBLISHED = [
    ("Conv-AE", 0.78, 13.55, 28.02),
    ("MSET", 0.78, 39.73, 14.13),
    ("T2+Q (PCA)", 0.76, 26.62, 24.92),
    ("LSTM-AE", 0.74, 29.96, 25.92),
    ("Isolation forest", 0.29, 2.56, 82.89),
]

#: Printed above the per-group INT8 rows: they are scored with the package's own defaults, so
#: they are held-out figures only for a package chosen without those files (the shipped package
#: was chosen on all of them; the held-out figures are the grouped selection's).
GROUP_NOTE = ("per group, this package's defaults (not held out: chosen with these files in "
              "view unless the package was built without them)")


def confusion(pred: np.ndarray, label: np.ndarray) -> tuple[int, int, int, int]:
    """(TP, FP, FN, TN) of 0/1 arrays."""
    return (
        int(((pred == 1) & (label == 1)).sum()),
        int(((pred == 1) & (label == 0)).sum()),
        int(((pred == 0) & (label == 1)).sum()),
        int(((pred == 0) & (label == 0)).sum()),
    )


def rates(tp: int, fp: int, fn: int, tn: int) -> tuple[float, float, float]:
    """SKAB's F1, FAR % and MAR %."""
    f1 = tp / (tp + (fp + fn) / 2) if tp + fp + fn else 1.0
    far = 100.0 * fp / (fp + tn) if fp + tn else 0.0
    mar = 100.0 * fn / (fn + tp) if fn + tp else 0.0
    return f1, far, mar


def read_file(path: Path) -> tuple[list[Reading], tuple[str, ...], np.ndarray]:
    """Replay ``path`` with the agent's ReplaySource; returns readings, channels, labels."""
    source = ReplaySource(ReplayConfig(path=str(path), speed=0.0), stream=path.stem)
    readings: list[Reading] = []
    rejected: list[RecordError] = []
    with contextlib.suppress(SourceExhausted):
        source.run(readings.append, rejected.append, threading.Event())
    if rejected:
        raise SystemExit(f"{path}: {len(rejected)} rows rejected: {rejected[0]}")
    labels = np.loadtxt(path, delimiter=";", skiprows=1, usecols=_label_col(path))
    return readings, source.channels, labels.astype(np.int8)


def _label_col(path: Path) -> int:
    header = path.open(encoding="utf-8").readline().strip().split(";")
    return header.index("anomaly")


def predict(readings: list[Reading], channels: tuple[str, ...], package, backend) -> np.ndarray:
    """Row predictions (1 = anomalous) for rows after calibration, using StreamPipeline."""
    spec = package.detector_spec()
    if channels != spec.channels:
        raise SystemExit(f"file channels {channels} differ from the model's {spec.channels}")
    fallback, input_range = saturation_fallback(
        package, package.artefact("onnxruntime", backend.precision))
    detector = FeatureDeviationDetector(spec, backend, fallback=fallback, input_range=input_range,
                                        adaptation=package.adaptation())
    pipe = StreamPipeline("bench", "bench", spec, detector, RuleParams())
    values = np.stack([r.values for r in readings])
    ts = np.array([r.ts for r in readings])
    out = pipe.process_block(values, ts)
    n = spec.calibration_samples
    pred = np.zeros(len(readings) - n, dtype=np.int8)
    scored = out.end_index >= n
    pred[out.end_index[scored] - n] = (out.scores[scored] > out.threshold).astype(np.int8)
    return pred


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="SKAB benchmark (published protocol)")
    ap.add_argument("--data", type=Path, required=True, help="SKAB root directory")
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "skab-wstat")
    ap.add_argument("--families", default="wstat,wstat-drift,pca,mset",
                    help="candidate families of the grouped selection ('' = skip it)")
    ap.add_argument("--group", help="score only this group's files (valve1, other): a package "
                                    "built with the choice made on the other group gives that "
                                    "group's held-out INT8 figure")
    args = ap.parse_args(argv)
    files = [p for p in labelled_files(args.data) if args.group in (None, p.parent.name)]
    if not files:
        raise SystemExit(f"no labelled SKAB files under {args.data}"
                         + (f" in group {args.group!r}" if args.group else ""))
    package = load_package(args.model)
    n = package.manifest.preprocessing.calibration_samples
    t0 = time.perf_counter()
    print(f"model {package.label}; {len(files)} files; calibrate on the first {n} rows of each")
    print(f"{'file':<22}{'rows':>6}  {'INT8 F1/FAR/MAR':>22}  {'FP32 F1/FAR/MAR':>22}")
    backends = {p: open_backend(package, p) for p in ("int8", "fp32")}
    totals = {p: np.zeros(4, dtype=np.int64) for p in backends}
    groups: dict[str, np.ndarray] = {}
    for path in files:
        readings, channels, labels = read_file(path)
        row = f"{path.relative_to(args.data)!s:<22}{len(readings):>6}"
        for prec, backend in backends.items():
            pred = predict(readings, channels, package, backend)
            c = confusion(pred, labels[n:])
            totals[prec] += c
            if prec == "int8":
                groups.setdefault(path.parent.name, np.zeros(4, dtype=np.int64))
                groups[path.parent.name] += c
            f1, far, mar = rates(*c)
            row += f"  {f1:>6.3f} {far:>6.2f} {mar:>6.2f}   "
        print(row)
    print(f"\nscored {sum(int(t[:].sum()) for t in totals.values()) // 2} rows in "
          f"{time.perf_counter() - t0:.1f} s")
    print(f"{'detector':<26}{'F1':>6}{'FAR %':>8}{'MAR %':>8}")
    for name, f1, far, mar in PUBLISHED:
        print(f"{'published ' + name:<26}{f1:>6.2f}{far:>8.2f}{mar:>8.2f}")
    res = {}
    for prec in ("fp32", "int8"):
        res[prec] = rates(*(int(v) for v in totals[prec]))
        f1, far, mar = res[prec]
        print(f"{'this agent ' + prec.upper():<26}{f1:>6.3f}{far:>8.2f}{mar:>8.2f}")
    print(f"INT8 - FP32 F1 difference: {res['int8'][0] - res['fp32'][0]:+.4f}")
    print(GROUP_NOTE)
    for g, c in sorted(groups.items()):
        gf1, gfar, gmar = rates(*(int(v) for v in c))
        print(f"{'this agent INT8 ' + g:<26}{gf1:>6.3f}{gfar:>8.2f}{gmar:>8.2f}")
    fams = [f for f in args.families.split(",") if f]
    if fams:
        grouped(args.data, fams, package)
    f1, far, mar = res["int8"]
    print(f"F1={f1:.3f} FAR={far:.2f} MAR={mar:.2f}")
    return 0


def grouped(data: Path, families: list[str], package) -> None:
    """Print the grouped selection report and whether the package's defaults are its choice."""
    from skab_floors import load, load_floors, load_sessions  # noqa: PLC0415
    from skab_report import describe, report  # noqa: PLC0415
    from skab_select import FLOOR_FRAC, Candidate  # noqa: PLC0415
    from skab_study import Study  # noqa: PLC0415

    print("\ngrouped model selection (models/recipes/skab_select.py; FP32 NumPy references; "
          "F1 / FAR % / MAR %)")
    files, floor, ffloors = load(data)
    choice = report(Study(files, floor, ffloors, families, load_floors(data, families),
                          load_sessions(data)), families)
    m = package.manifest
    args = (m.lineage or {}).get("args") or {}
    # the recipe's --floor-frac (= --feature-floor-frac when the selection set it)
    frac = float(args.get("floor_frac", FLOOR_FRAC))
    adapt = m.score.adaptation
    shipped = Candidate("wstat-drift" if adapt else "wstat", m.input.window,
                        float(m.score.top_k), m.score.threshold.holdout,
                        m.score.threshold.factor, frac,
                        adapt_rate=adapt.rate if adapt else 0.0,
                        drift_bound=adapt.bound if adapt else 0.0)
    same = (shipped.detector, shipped.window, shipped.param, shipped.holdout,
            shipped.factor, shipped.floor, shipped.rule, shipped.variant) == (
                choice.detector, choice.window, float(choice.param), choice.holdout,
                choice.factor, choice.floor, choice.rule, choice.variant)
    verdict = "the procedure's choice" if same else "NOT the procedure's choice"
    print(f"package {package.label}: {describe(shipped)}: {verdict}")


if __name__ == "__main__":
    raise SystemExit(main())
