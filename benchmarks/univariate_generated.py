"""Sanity of the univariate package on generated series, through ``benchmarks/univariate.py``.

    python benchmarks/univariate_generated.py [--model models/univariate-wstat] [--seeds 5]

No dataset: each seed writes series of one reading a minute for 10 days (14,400 rows) with the
shapes public univariate benchmarks show, and known anomalies placed in them:

* ``noise``: Gaussian noise;
* ``sine``: a daily cycle of ±3 noise sigmas plus noise;
* ``sine_trend``: the same plus a trend of 4 sigmas over the series;
* ``heavy``: Student-t noise (3 degrees of freedom, heavy tails);
* ``walk``: a slow random walk (std 0.05 per row) plus noise;
* ``irregular``: the sine with jittered intervals (0.5–1.5 min) and two 6-hour gaps.

Each series gets, from row 2,000 every 1,500 rows, alternating up and down: an 8σ spike of 1
row, an 8σ spike of 3 rows, a 4σ step of 50 rows (σ the noise std). An anomaly is *hit* when an
alarm falls on its rows or up to W rows after. Alarms elsewhere are *false*; ``in_alarm`` is the
share of the other scored rows inside an open episode. Scored through the benchmark's own
``run_file`` (the package's INT8 artefact, one row per block, the rule a stream without rule keys
runs). The last line: ``series=… hit_spike1=… hit_spike3=… hit_shift50=… false_alarms=…
false_per_10k=… in_alarm=…``.
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from univariate import DEFAULT_MODEL, run_file  # noqa: E402

from agent.inference.package import (  # noqa: E402
    load_package,
    open_backend,
    saturation_fallback,
)

ROWS = 14_400
KINDS = (("spike1", 1, 8.0), ("spike3", 3, 8.0), ("shift50", 50, 4.0))


def series(kind: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Times (epoch seconds) and clean values ``(ROWS,)`` of one generated shape; noise std 1."""
    t = np.arange(ROWS, dtype=np.float64)
    day = 3.0 * np.sin(2 * np.pi * t / 1440)
    noise = rng.normal(size=ROWS)
    values = {"noise": noise, "sine": day + noise, "sine_trend": day + noise + 4.0 * t / ROWS,
              "heavy": rng.standard_t(3, size=ROWS) / np.sqrt(3.0),
              "walk": np.cumsum(rng.normal(scale=0.05, size=ROWS)) + noise,
              "irregular": day + noise}[kind]
    ts = 1_700_000_000 + 60.0 * t
    if kind == "irregular":
        ts = 1_700_000_000 + 60.0 * np.cumsum(rng.uniform(0.5, 1.5, size=ROWS))
        ts[5000:] += 6 * 3600.0
        ts[11000:] += 6 * 3600.0
    return ts, values


def place(values: np.ndarray) -> tuple[np.ndarray, list[tuple[str, int, int]]]:
    """A copy with the anomalies (module docstring) and their (kind, first row, length)."""
    out = values.copy()
    placed = []
    for i, p in enumerate(range(2000, ROWS - 100, 1500)):
        kind, length, offset = KINDS[i % len(KINDS)]
        out[p : p + length] += (1.0 if i % 2 == 0 else -1.0) * offset
        placed.append((kind, p, length))
    return out, placed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--seeds", type=int, default=5)
    args = ap.parse_args(argv)
    package = load_package(args.model)
    backend = open_backend(package, "int8")
    fallback = saturation_fallback(package, package.artefact("onnxruntime", "int8"))
    window = package.manifest.input.window
    hits = {k: [0, 0] for k, _, _ in KINDS}
    false = normal = opened = n = 0
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seeds):
            for kind in ("noise", "sine", "sine_trend", "heavy", "walk", "irregular"):
                rng = np.random.default_rng(seed)
                ts, clean = series(kind, rng)
                values, placed = place(clean)
                src, dst = Path(tmp) / f"{kind}_{seed}.csv", Path(tmp) / f"out_{kind}_{seed}.csv"
                with src.open("w", newline="") as fh:
                    w = csv.writer(fh, lineterminator="\n")
                    w.writerow(["timestamp", "value"])
                    w.writerows((f"{a:.0f}", f"{v:.6f}") for a, v in zip(ts, values, strict=True))
                run_file(src, dst, package, backend, fallback, 1)
                with dst.open(newline="") as fh:
                    rows = list(csv.DictReader(fh))
                alarm = np.array([int(r["alarm"]) for r in rows])
                in_alarm = np.array([int(r["in_alarm"]) for r in rows])
                scored = np.array([r["score"] != "" for r in rows])
                near = np.zeros(ROWS, bool)
                got = {k: 0 for k, _, _ in KINDS}
                for k, p, length in placed:
                    near[p : p + length + window] = True
                    hit = int(alarm[p : p + length + window].any())
                    hits[k][0] += hit
                    hits[k][1] += 1
                    got[k] += hit
                f = int(alarm[~near].sum())
                other = scored & ~near
                false += f
                normal += int(other.sum())
                opened += int(in_alarm[other].sum())
                n += 1
                print(f"{kind}_{seed}: " + " ".join(f"{k}={v}" for k, v in got.items())
                      + f" false_alarms={f} in_alarm={in_alarm[other].mean():.4f}")
    rate = {k: h / max(1, t) for k, (h, t) in hits.items()}
    print(f"series={n} " + " ".join(f"hit_{k}={v:.3f}" for k, v in rate.items())
          + f" false_alarms={false} false_per_10k={1e4 * false / max(1, normal):.2f} "
          f"in_alarm={opened / max(1, normal):.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
