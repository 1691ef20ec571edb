"""Data for the ``mtd-student`` recipe: augmentation, synthetic flaws and the trunk targets.

The synthetic flaws (dark or bright blobs, thin dark cracks, pasted and turned patches) stand in
for surface defects on held-out good images: they are what model choices may look at (the MTD
test split never is), and, on copies of the fit images, what teaches the teacher network how
the trunk responds to a flaw. They are drawn by hand-written rules (OpenCV), not learned from
any defect image.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # models/recipes
sys.path.insert(0, str(Path(__file__).resolve().parent))

from mtd_padim import runner
from mtd_patchcore import Features


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


def teacher_set(fit8: np.ndarray, copies: int, flaw_fraction: float, rng: np.random.Generator
                ) -> tuple[np.ndarray, np.ndarray]:
    """``(images, clean)``, both uint8 ``(N * (1 + copies), H, W)``: the fit images, then
    ``copies`` augmented copies of each (flips, turns, gain/offset: :func:`augment`),
    ``flaw_fraction`` of the copies with one synthetic flaw (:func:`synth_flaws`); ``clean``:
    the same images before the flaws were drawn."""
    out, clean = [fit8], [fit8]
    for _ in range(copies):
        a = augment(fit8, rng, photometric=True)
        clean.append(a.copy())
        flawed = rng.random(len(a)) < flaw_fraction
        a[flawed] = synth_flaws(a[flawed], rng)
        out.append(a)
    return np.concatenate(out), np.concatenate(clean)
