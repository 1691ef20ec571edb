"""MTD image anomaly benchmark: image-level AUROC of the INT8 and FP32 models, per defect class.

    python3 benchmarks/mtd.py --data ../shared/datasets/mtd                      # train, then score
    python3 benchmarks/mtd.py --data ../shared/datasets/mtd --package models/mtd-padim

Without ``--package`` the recipe (``models/recipes/mtd_padim.py``, ``train`` extra) trains on the
``train`` rows of ``DATA/splits/split.csv`` into a temporary package first. The ``test`` rows
(good + Blowhole, Break, Crack) are preprocessed like the agent's camera source and scored with
both artefacts; per class the AUROC is over that class's images plus every good test image.
The last line is ``AUROC=<overall INT8 AUROC>``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "models" / "recipes"))
sys.path.insert(0, str(ROOT))

import mtd_padim as recipe  # noqa: E402


def evaluate(data: Path, package: Path) -> dict[str, dict[str, float]]:
    """Score the test rows with both artefacts; returns {precision: {class|overall: AUROC}}."""
    manifest = json.loads((package / "manifest.json").read_text())
    size = int(manifest["input"]["height"])
    rows = [r for r in recipe.read_split(data) if r.split == "test"]
    x = recipe.normalise(np.stack([recipe.load_gray(data / r.image, size) for r in rows]))
    labels = np.array([r.label for r in rows])
    classes = np.array([r.cls for r in rows])
    good = labels == 0
    result: dict[str, dict[str, float]] = {}
    for prec in ("int8", "fp32"):
        t0 = time.perf_counter()
        scores = recipe.runner(package / f"model.{prec}.onnx")(x)
        ms = 1e3 * (time.perf_counter() - t0) / len(x)
        res = {"overall": recipe.auroc(labels, scores)}
        for cls in sorted(set(classes[~good])):
            sel = good | (classes == cls)
            res[cls] = recipe.auroc(labels[sel], scores[sel])
        thr = float(manifest["score"]["threshold"]["value"])
        res["good_above_threshold"] = float((scores[good] > thr).mean())
        res["defect_above_threshold"] = float((scores[~good] > thr).mean())
        res["ms_per_image"] = ms
        result[prec] = res
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="MTD root (has splits/split.csv)")
    ap.add_argument("--package", type=Path, help="score this package instead of training one")
    ap.add_argument("--size", type=int, default=192)
    ap.add_argument("--dim", type=int, default=48)
    ap.add_argument("--skip", type=int, default=0)
    ap.add_argument("--eps", type=float, default=0.01)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        package = args.package
        if package is None:
            package = Path(tmp) / "pkg"
            recipe.build(args.data, package, size=args.size, dim=args.dim, skip=args.skip,
                         eps=args.eps)
        sizes = {p: (package / f"model.{p}.onnx").stat().st_size for p in ("int8", "fp32")}
        res = evaluate(args.data, package)
    print(f"package: {package}  int8 {sizes['int8'] / 1e6:.2f} MB, fp32 {sizes['fp32'] / 1e6:.2f}"
          f" MB, ratio {sizes['int8'] / sizes['fp32']:.2f}")
    keys = [k for k in res["int8"] if k not in ("overall",)]
    print(f"{'':6} {'overall':>8} " + " ".join(f"{k:>10.10}" for k in keys))
    for prec, r in res.items():
        print(f"{prec:6} {r['overall']:8.4f} " + " ".join(f"{r[k]:10.4f}" for k in keys))
    print(f"INT8 - FP32 overall AUROC: {res['int8']['overall'] - res['fp32']['overall']:+.4f}")
    print(f"AUROC={res['int8']['overall']:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
