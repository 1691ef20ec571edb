"""MTD image anomaly benchmark: image-level AUROC of the INT8 and FP32 models, per defect class.

    python3 benchmarks/mtd.py --data ../shared/datasets/mtd               # the shipped package
    python3 benchmarks/mtd.py --data ../shared/datasets/mtd --train       # train, then score

By default the shipped package ``models/mtd-patchcore`` is scored; ``--package`` (or ``--model``,
e.g. ``--model models/mtd-student``) names another,
``--train`` builds one first with the recipe (``models/recipes/mtd_patchcore.py``, ``train`` and
``openvino`` extras plus nncf) from the good ``train`` rows of ``DATA/splits/split.csv``. The
``test`` rows (good + every defect class in the file) are preprocessed like the agent's camera
source and scored by every artefact: ``int8`` = the OpenVINO INT8 IR (what auto-selection picks
where OpenVINO is installed), ``int8-ort`` = the ONNX Runtime INT8 QDQ fallback, ``fp32`` = the
ONNX FP32 twin. Per class the AUROC is over that class's images plus every good test image.
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

import mtd_patchcore as recipe  # noqa: E402
from mtd_padim import runner  # noqa: E402


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
    runs = {"int8": lambda: recipe.ov_runner(package / "model.int8.xml"),
            "int8-ort": lambda: runner(package / "model.int8.onnx"),
            "fp32": lambda: runner(package / "model.fp32.onnx")}
    for prec, make in runs.items():
        if prec == "int8" and not (package / "model.int8.xml").is_file():
            continue
        t0 = time.perf_counter()
        scores = make()(x)
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
    ap.add_argument("--package", "--model", dest="package", type=Path,
                    default=ROOT / "models" / "mtd-patchcore",
                    help="package to score (default: the shipped mtd-patchcore; "
                         "models/mtd-student: the distilled student)")
    ap.add_argument("--train", action="store_true", help="build a package with the recipe first")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        package = args.package
        if args.train:
            package = Path(tmp) / "pkg"
            recipe.build(args.data, package)
        size = {p.name: p.stat().st_size for p in package.glob("model.*")}
        res = evaluate(args.data, package)
    ir = size.get("model.int8.xml", 0) + size.get("model.int8.bin", 0)
    fp32 = size["model.fp32.onnx"]
    print(f"package: {package}  fp32 {fp32 / 1e6:.2f} MB; int8 IR (xml+bin) {ir / 1e6:.2f} MB "
          f"= {ir / fp32:.2f}x; int8 ONNX {size['model.int8.onnx'] / 1e6:.2f} MB = "
          f"{size['model.int8.onnx'] / fp32:.2f}x")
    keys = [k for k in res["int8"] if k not in ("overall",)]
    print(f"{'':9} {'overall':>8} " + " ".join(f"{k:>10.10}" for k in keys))
    for prec, r in res.items():
        print(f"{prec:9} {r['overall']:8.4f} " + " ".join(f"{r[k]:10.4f}" for k in keys))
    print(f"INT8 - FP32 overall AUROC: {res['int8']['overall'] - res['fp32']['overall']:+.4f}")
    print(f"AUROC={res['int8']['overall']:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
