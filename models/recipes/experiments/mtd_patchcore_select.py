"""Choose the mtd-patchcore configuration WITHOUT the test split's defects.

    python3 models/recipes/experiments/mtd_patchcore_select.py --data ../shared/datasets/mtd

Selection data: the recipe's 100 held-out good ``train`` images (same seed) and synthetic
defects drawn on copies of them (:func:`synth`: thin dark cracks, small dark/bright pits, a
chipped edge, a low-contrast smudge: generic surface flaws, not MTD's test images). Each
configuration is fitted on the 661 remaining good images (FP32 torch features) and scored by
AUROC of held-out good vs synthetic defects. ``--sanity`` also prints the test-split AUROC of
the chosen configurations (a sanity check, not used to choose).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mtd_patchcore as pc


def synth(img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One synthetic surface flaw on a uint8 grayscale image (kind drawn at random)."""
    import cv2  # noqa: PLC0415

    out = img.copy()
    h, w = img.shape
    base = float(np.median(img))
    kind = rng.integers(4)
    if kind == 0:  # thin crack: a jagged polyline, darker than the surface
        n = int(rng.integers(3, 6))
        p0 = rng.uniform(0.2, 0.8, 2) * (w, h)
        pts = [p0]
        for _ in range(n):
            pts.append(pts[-1] + rng.normal(0, 0.08, 2) * (w, h))
        pts_i = np.clip(np.array(pts), 0, [w - 1, h - 1]).astype(np.int32)
        cv2.polylines(out, [pts_i], False, int(base * rng.uniform(0.3, 0.7)), 1)
    elif kind == 1:  # pit / blowhole: a small dark ellipse with a bright rim
        c = (int(rng.uniform(0.15, 0.85) * w), int(rng.uniform(0.15, 0.85) * h))
        ax = (int(rng.integers(2, max(3, w // 25))), int(rng.integers(2, max(3, h // 25))))
        cv2.ellipse(out, c, (ax[0] + 1, ax[1] + 1), 0, 0, 360, int(min(255, base * 1.4)), -1)
        cv2.ellipse(out, c, ax, 0, 0, 360, int(base * rng.uniform(0.2, 0.6)), -1)
    elif kind == 2:  # chipped edge: a dark polygon cut from one side
        side = rng.integers(4)
        t = rng.uniform(0.2, 0.8)
        d = rng.uniform(0.04, 0.12)
        poly = {0: [(t - d, 0), (t + d, 0), (t, d * 1.5)],
                1: [(t - d, 1), (t + d, 1), (t, 1 - d * 1.5)],
                2: [(0, t - d), (0, t + d), (d * 1.5, t)],
                3: [(1, t - d), (1, t + d), (1 - d * 1.5, t)]}
        pts_i = (np.array(poly[int(side)]) * (w - 1, h - 1)).astype(np.int32)
        cv2.fillPoly(out, [pts_i], int(base * rng.uniform(0.1, 0.4)))
    else:  # low-contrast smudge: a blurred darker blob
        mask = np.zeros_like(img, np.float32)
        c = (int(rng.uniform(0.2, 0.8) * w), int(rng.uniform(0.2, 0.8) * h))
        cv2.circle(mask, c, int(rng.integers(w // 20, w // 10)), 1.0, -1)
        mask = cv2.GaussianBlur(mask, (0, 0), w / 60)
        out = np.clip(img * (1 - 0.35 * mask), 0, 255).astype(np.uint8)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--sanity", action="store_true", help="also print test-split AUROC")
    a = ap.parse_args(argv)
    rows = [r for r in pc.read_split(a.data) if r.split == "train" and r.label == 0]
    fit_rows, val_rows = pc.split_rows(rows, 100, 0)
    test = [r for r in pc.read_split(a.data) if r.split == "test"]
    rng = np.random.default_rng(1)
    configs = [
        # (size, taps, pool, bank)
        (192, (4, 7), 1, 2000), (256, (4, 7), 1, 2000), (256, (4, 7), 2, 2000),
        (256, (4, 10), 2, 2000), (320, (4, 7), 2, 2000), (256, (4, 7), 2, 1000),
        (256, (4, 7), 2, 4000), (256, (2, 4, 7), 2, 2000),
    ]
    for size in sorted({c[0] for c in configs}):
        fit_img = np.stack([pc.load_gray(a.data / r.image, size) for r in fit_rows])
        val_img = np.stack([pc.load_gray(a.data / r.image, size) for r in val_rows])
        bad_img = np.stack([synth(im, rng) for im in val_img for _ in range(2)])
        x_val = pc.normalise(np.concatenate([val_img, bad_img]))
        y_val = np.r_[np.zeros(len(val_img)), np.ones(len(bad_img))]
        x_test = y_test = None
        if a.sanity:
            x_test = pc.normalise(np.stack([pc.load_gray(a.data / r.image, size) for r in test]))
            y_test = np.array([r.label for r in test])
        for cfg in [c for c in configs if c[0] == size]:
            _, taps, pool, bank_n = cfg
            t0 = time.perf_counter()
            feats = pc.Features(taps, pool)
            bank = pc.coreset(pc.patches(feats, pc.normalise(fit_img)), bank_n, seed=0)
            s_val = pc.knn_scores(feats, bank, x_val)
            line = (f"size {size} taps {taps} pool {pool} bank {bank_n}: synthetic-val AUROC "
                    f"{pc.auroc(y_val, s_val):.4f}")
            if x_test is not None and y_test is not None:
                s_t = pc.knn_scores(feats, bank, x_test)
                per = {c: pc.auroc(y_test[[r.cls == c or r.label == 0 for r in test]],
                                   s_t[[r.cls == c or r.label == 0 for r in test]])
                       for c in ("Blowhole", "Break", "Crack")}
                line += f" | test {pc.auroc(y_test, s_t):.4f} " + " ".join(
                    f"{k} {v:.3f}" for k, v in per.items())
            print(line + f" ({time.perf_counter() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
