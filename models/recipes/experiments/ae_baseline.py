"""Experiment: autoencoders vs window statistics on SKAB (why the shipped model is not an AE).

    python models/recipes/experiments/ae_baseline.py --data ../shared/datasets/skab

Needs the ``train`` extra (torch). Trains on the anomaly-free recording only (segments scaled the
way the device calibrates: per 400-row segment, std floored at 0.1 × the recording's std), then
follows SKAB's per-file protocol (calibrate on the first 400 rows, score the rest, pool all
files) with the same score as the agent: per-feature z against the calibration windows, mean of
the top 2 |z|, threshold = 1.5 × the calibration maximum. Compared:

* ``window-stats``: no learning; the features themselves (what ``models/skab-wstat`` computes);
* ``feature-ae``: a dense autoencoder over those features; the score uses its residuals;
* ``dense-ae``: a dense autoencoder over the flattened (W, C) window; residual mean and std per
  channel are the features.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from skab_data import anomaly_free_file, labelled_files, read_skab

N, W, FLOOR, TOP_K, FACTOR = 400, 10, 0.1, 2, 1.5


def windows(x: np.ndarray) -> np.ndarray:
    idx = np.arange(x.shape[0] - W + 1)[:, None] + np.arange(W)[None, :]
    return x[idx].astype(np.float32)


def stats(w: np.ndarray) -> np.ndarray:
    mad = np.abs(w - w.mean(1, keepdims=True)).mean(1)
    return np.concatenate([w.mean(1), mad, np.abs(np.diff(w, axis=1)).mean(1)], 1)


def scale(x: np.ndarray, gsd: np.ndarray) -> np.ndarray:
    mu, sd = x[:N].mean(0), np.maximum(x[:N].std(0), FLOOR * gsd)
    return (x - mu) / sd


def train(model: torch.nn.Module, data: np.ndarray, epochs: int) -> None:
    t = torch.tensor(data, dtype=torch.float32)
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    for ep in range(epochs):
        perm = torch.randperm(len(t))
        for i in range(0, len(t), 256):
            b = t[perm[i : i + 256]]
            loss = ((model(b) - b) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        print(f"  epoch {ep + 1}/{epochs} loss {loss.item():.4f}", flush=True)


def mlp(d: int, hidden: int, code: int) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(d, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, code),
        torch.nn.ReLU(), torch.nn.Linear(code, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, d),
    )


def evaluate(files: list, residuals) -> tuple[float, float, float]:  # type: ignore[no-untyped-def]
    tp = fp = fn = tn = 0
    for x, y in files:
        r = residuals(x)
        cal = r[: N - W + 1]
        z = np.abs((r - cal.mean(0)) / (cal.std(0) + 1e-9))
        s = np.sort(z, 1)[:, -TOP_K:].mean(1)
        pred = s[N - W + 1 :] > s[: N - W + 1].max() * FACTOR
        lab = y[N:] == 1
        tp += int((pred & lab).sum())
        fp += int((pred & ~lab).sum())
        fn += int((~pred & lab).sum())
        tn += int((~pred & ~lab).sum())
    return tp / (tp + (fp + fn) / 2), 100 * fp / (fp + tn), 100 * fn / (fn + tp)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--epochs", type=int, default=10)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    af = read_skab(anomaly_free_file(args.data)).values
    gsd = af.std(0)
    segs = [scale(af[s : s + N + 600], gsd) for s in range(0, len(af) - N - 600, 50)]
    win = np.concatenate([windows(s) for s in segs])
    feats = stats(win)
    fmu, fsd = feats.mean(0), feats.std(0) + 1e-6
    files = []
    for p in labelled_files(args.data):
        f = read_skab(p)
        files.append((f.values, f.anomaly))
    c = af.shape[1]

    print("feature-ae: training")
    fae = mlp(3 * c, 32, 8)
    train(fae, (feats - fmu) / fsd, args.epochs)
    print("dense-ae: training")
    dense = torch.nn.Sequential(
        torch.nn.Flatten(), mlp(W * c, 64, 8), torch.nn.Unflatten(1, (W, c))
    )
    train(dense, np.clip(win, -10, 10), args.epochs)

    def r_stats(x: np.ndarray) -> np.ndarray:
        return stats(windows(scale(x, gsd)))

    def r_fae(x: np.ndarray) -> np.ndarray:
        f = (stats(windows(scale(x, gsd))) - fmu) / fsd
        with torch.no_grad():
            return f - fae(torch.tensor(f, dtype=torch.float32)).numpy()

    def r_dense(x: np.ndarray) -> np.ndarray:
        w = windows(scale(x, gsd))
        with torch.no_grad():
            e = w - dense(torch.tensor(w)).numpy()
        return np.concatenate([e.mean(1), e.std(1)], 1)

    print(f"{'model':<14}{'F1':>7}{'FAR %':>8}{'MAR %':>8}")
    for name, fn in (("window-stats", r_stats), ("feature-ae", r_fae), ("dense-ae", r_dense)):
        f1, far, mar = evaluate(files, fn)
        print(f"{name:<14}{f1:>7.3f}{far:>8.2f}{mar:>8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
