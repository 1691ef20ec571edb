"""Experiment: do the INT8 and FP32 window-statistics models make the same decisions? No labels.

    python models/recipes/experiments/skab_int8_fidelity.py --data ../shared/datasets/skab \
        [--window 20 --top-k 2 --factor 1.75 --floor 0.2]

On the anomaly-free SKAB recording only: the package model of one (W, floor) point is built as
the recipe builds it (:func:`skab_int8.build_int8`); every 100 rows a 1,000-row segment is
calibrated on its first 400 rows (scaler, feature statistics, threshold = max in-sample score ×
factor) once with the FP32 reference and once with the INT8 path, and the 600 later rows are
scored by both. Printed per feature-floor rule (none beyond the fraction floor, the INT8 output
step / √12, the step): the windows on which the two precisions decide differently and the range
of the INT8 / FP32 threshold ratio. The rows are normal operation, so this measures fidelity, not
detection.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from skab_data import anomaly_free_file, read_skab
from skab_detectors import wstat_scores
from skab_int8 import build_int8, int8_features

from cloud_sync.calibration import window_features

RULES = (("fraction floor only", 0.0), ("INT8 step / sqrt(12)", 1 / np.sqrt(12.0)),
         ("INT8 step", 1.0))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="SKAB root")
    ap.add_argument("--window", type=int, default=20)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--factor", type=float, default=1.75)
    ap.add_argument("--floor", type=float, default=0.2)
    args = ap.parse_args(argv)
    normal = read_skab(anomaly_free_file(args.data)).values
    w, cal = args.window, 400
    with tempfile.TemporaryDirectory() as tmp:
        b = build_int8(normal, w, args.floor, args.floor, Path(tmp))
        i8 = int8_features(b)
        for name, mult in RULES:
            ff = np.maximum(b.fraction_floor, mult * b.steps)
            differ = total = 0
            ratios = []
            for start in range(0, normal.shape[0] - 1000, 100):
                seg = normal[start:start + 1000]
                out = []
                for fn in (window_features, i8):
                    s = wstat_scores(seg, cal, w, args.top_k, b.floor, ff, fn)
                    thr = float(s[: cal - w + 1].max()) * args.factor
                    out.append((s[cal - w + 1:] > thr, thr))
                differ += int((out[0][0] != out[1][0]).sum())
                total += out[0][0].size
                ratios.append(out[1][1] / out[0][1])
            r = np.array(ratios)
            print(f"{name:<22} decisions differ on {differ} of {total} windows; INT8/FP32 "
                  f"threshold ratio {r.min():.3f}..{r.max():.3f} (median {np.median(r):.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
