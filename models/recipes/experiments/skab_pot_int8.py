"""The POT threshold rule (:mod:`skab_pot`) on the agent's own INT8 and FP32 scores.

    python3 models/recipes/experiments/skab_pot_int8.py --data ../shared/datasets/skab \
        --model /tmp/pkg --init 0.98 --q 1e-5 [--group valve1|other]

The agent's calibration implements max × factor only, so a POT choice of the grouped selection
(``skab_select.py``, rule ``pot``) has no package. This scores it anyway: a package built with the
choice's W, top-k and floors (threshold factor irrelevant) runs every labelled file through the
agent's ``StreamPipeline`` (as ``benchmarks/skab.py`` does); the POT threshold is then fitted on
that stream's own calibration scores (``pipe.calibration.scores``: in-sample, the chosen
hold-out 0) and every later row is predicted with it. Labels are used for the figures only.
Prints ``<precision> F1 / FAR % / MAR %`` pooled over the files.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "models" / "recipes"))

from skab import confusion, rates, read_file  # noqa: E402
from skab_data import labelled_files  # noqa: E402
from skab_pot import pot_threshold  # noqa: E402

from agent.inference.package import load_package, open_backend, saturation_fallback  # noqa: E402
from agent.pipeline.detector import FeatureDeviationDetector  # noqa: E402
from agent.pipeline.rules import RuleParams  # noqa: E402
from agent.pipeline.stream import StreamPipeline  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--init", type=float, required=True)
    ap.add_argument("--q", type=float, required=True)
    ap.add_argument("--group")
    args = ap.parse_args(argv)
    package = load_package(args.model)
    spec = package.detector_spec()
    if spec.threshold_holdout:
        raise SystemExit("this experiment fits POT on in-sample calibration scores only")
    n = spec.calibration_samples
    totals = {p: np.zeros(4, dtype=np.int64) for p in ("int8", "fp32")}
    files = [p for p in labelled_files(args.data) if args.group in (None, p.parent.name)]
    for path in files:
        readings, _, labels = read_file(path)
        values = np.stack([r.values for r in readings])
        ts = np.array([r.ts for r in readings])
        row = f"{path.relative_to(args.data)!s:<22}"
        for prec in totals:
            backend = open_backend(package, prec)
            fallback, input_range = saturation_fallback(
                package, package.artefact("onnxruntime", backend.precision))
            det = FeatureDeviationDetector(spec, backend, fallback=fallback,
                                           input_range=input_range)
            pipe = StreamPipeline("pot", "pot", spec, det, RuleParams())
            out = pipe.process_block(values, ts)
            assert pipe.calibration is not None
            thr = pot_threshold(pipe.calibration.scores, args.init, args.q)
            pred = np.zeros(len(readings) - n, dtype=np.int8)
            scored = out.end_index >= n
            pred[out.end_index[scored] - n] = (out.scores[scored] > thr).astype(np.int8)
            c = confusion(pred, labels[n:])
            totals[prec] += c
            f1, far, mar = rates(*c)
            row += f"  {prec} {f1:.3f} {far:6.2f} {mar:6.2f}"
        print(row)
    for prec, t in totals.items():
        f1, far, mar = rates(*(int(v) for v in t))
        print(f"{prec} POT init={args.init:g} q={args.q:g} {args.group or 'all'}: "
              f"F1={f1:.3f} FAR={far:.2f} MAR={mar:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
