"""Recipe: build the ``univariate-wstat`` one-channel INT8 window-statistics package.

    nice python models/recipes/univariate_select.py --data ../shared/datasets/skab --json uni.json
    python models/recipes/univariate_wstat.py --data ../shared/datasets/skab \
        --out models/univariate-wstat --selection uni.json --version N

``univariate-wstat@3`` was built with ``--selection models/recipes/univariate_choice_v3.json
--version 3``: the selection wrote no choice (no candidate met R1-R3) and that file names its
closest candidate, shipped because it is better than ``@2`` on every requirement
(docs/detection.md, "Univariate streams").

The window, the robust adaptive score (threshold in robust sigmas, adaptation rates, level and
scale bounds, Huber clip; :mod:`agent.pipeline.robust`) and the alert rule (k of n and the
single-window path) come from the grouped selection on univariate series (``--selection``,
written by :mod:`univariate_select`), so the shipped defaults are the ones that procedure picks.
The manifest's ``score.threshold`` is written for the schema and is not read by a package with
``univariate.threshold_sigma``.

Steps (as :mod:`skab_wstat`, with C = 1):

1. Training data: every channel of the anomaly-free SKAB recording as its own univariate series
   (normal operation only, no labels used), without the recording's rows that fall in a
   labelled file's time span (:func:`skab_data.training_recording`). ``--full-recording``
   keeps them: how ``univariate-wstat@2`` was built.
2. Emulated on-device calibrations on 400-sample segments of each channel (scaled with each
   segment's own mean and std): the per-feature std floor (``--feature-floor-frac`` × the std of
   each feature over all segments, pooled over channels; in scaled units, so it holds for a
   channel of any unit). The input scale floor in channel units cannot be known for a signal of
   any unit: the manifest's is a tiny absolute floor and the device adds the relative and
   quantum floors of :func:`agent.pipeline.univariate_detector.univariate_floor`.
3. The FP32 ONNX graph (:func:`fleet.training.wstat.build_graph` with C = 1), INT8 QDQ with
   ``quantize_static`` on the scaled windows (plus the same ×``--headroom``, so a fault several
   sigmas out is still represented; beyond it the FP32 twin scores, as for every package), and
   ``--spike-windows`` copies with 1 or 3 rows set to the sample's extreme values
   (:func:`spike_windows`): the fallback looks at the input range only, so without them a spike
   inside that range saturates the INT8 spread and roughness outputs (a 1-row 8σ spike on W 3
   scored about half its FP32 score),
   golden vectors, OpenVINO IR and TFLite INT8 (:func:`skab_wstat.other_runtimes`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from skab_data import anomaly_free_file, read_skab, training_recording
from skab_wstat import other_runtimes

from cloud_sync.calibration import FEATURES, window_features
from fleet.training.wstat import (
    artefact_entries,
    build_graph,
    int8_input_range,
    ort_version,
    quantize_int8,
    scaled_windows,
    session_runner,
)

#: The choices the package takes from the selection (``univariate_select.py --json``). There
#: are no fallback values: a package built without a selection would ship hand-picked defaults.
SELECTED = ("window", "top_k", "threshold_sigma", "adapt_rate", "scale_rate", "drift_bound",
            "clip", "scale_bound", "rule_k", "rule_n", "spike_factor")


FEATURE_FLOOR_FRAC = 0.1


def training_windows(values: np.ndarray, window: int, cal: int) -> tuple[np.ndarray, np.ndarray]:
    """Scaled windows ``(K, W, 1)`` and their features ``(K, 3)`` of emulated calibrations on
    every channel of ``values`` (``(T, C)``) alone: segments of ``cal`` + 600 rows every 100,
    each scaled with its first ``cal`` rows (:func:`fleet.training.wstat.scaled_windows`)."""
    ws, fs = [], []
    for c in range(values.shape[1]):
        col = values[:, c : c + 1]
        win, feats = scaled_windows(col, window, cal, col.std(0) * 1e-3, step=100,
                                    span=cal + 600)
        ws.append(win)
        fs.append(feats)
    return np.concatenate(ws), np.concatenate(fs)


def spike_windows(windows: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` copies ``(count, W, 1)`` of random ``windows`` with one row, or 3 consecutive
    rows (alternately), set to the windows' largest or smallest value (alternately): spikes
    inside the input range, for the INT8 output ranges."""
    lo, hi = float(windows.min()), float(windows.max())
    out = windows[rng.choice(windows.shape[0], count)].copy()
    w = out.shape[1]
    for i in range(count):
        length = 1 if i % 2 == 0 else min(3, w)
        start = int(rng.integers(0, w - length + 1))
        out[i, start : start + length, :] = hi if (i // 2) % 2 == 0 else lo
    return out


def read_selection(path: Path) -> dict[str, Any]:
    """The choices of :data:`SELECTED` from a ``univariate_select.py --json`` file.

    Raises:
        SystemExit: the file is not a JSON object or lacks one of :data:`SELECTED`.
    """
    try:
        chosen = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SystemExit(f"{path}: not a selection file: {exc}") from exc
    if not isinstance(chosen, dict):
        raise SystemExit(f"{path}: not a selection file: a JSON object is needed")
    missing = [k for k in SELECTED if k not in chosen]
    if missing:
        raise SystemExit(f"{path}: the selection lacks {', '.join(missing)}; rerun "
                         "models/recipes/univariate_select.py --json")
    return {k: chosen[k] for k in SELECTED}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="SKAB root (has anomaly-free/)")
    ap.add_argument("--out", type=Path, required=True, help="package directory to write")
    ap.add_argument("--version", type=int, default=1)
    ap.add_argument("--selection", type=Path, required=True,
                    help="univariate_select.py --json output (required: every detector and rule "
                         "default comes from the grouped selection)")
    ap.add_argument("--calibration-samples", type=int, default=400)
    ap.add_argument("--feature-floor-frac", type=float, default=FEATURE_FLOOR_FRAC)
    ap.add_argument("--gap-factor", type=float, default=5.0)
    ap.add_argument("--scale-floor-rel", type=float, default=1e-3)
    ap.add_argument("--adapt-below", type=float, default=0.5)
    ap.add_argument("--headroom", type=float, default=1.0)
    ap.add_argument("--full-recording", action="store_true",
                    help="train on every row of the anomaly-free recording, also those in a "
                         "labelled file's time span (how univariate-wstat@2 was built)")
    ap.add_argument("--quant-windows", type=int, default=4000)
    ap.add_argument("--spike-windows", type=int, default=1000,
                    help="quantization windows carrying in-range spikes (0: none, as @2)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    chosen = read_selection(args.selection)
    w = int(chosen["window"])
    rng = np.random.default_rng(args.seed)
    data = (read_skab(anomaly_free_file(args.data)) if args.full_recording
            else training_recording(args.data))
    windows, feats = training_windows(data.values, w, args.calibration_samples)
    feature_floor = args.feature_floor_frac * feats.std(0)
    print(f"training data: {data.values.shape[1]} channels of {data.path.name}, "
          f"{windows.shape[0]} emulated calibration windows, W={w}")
    args.out.mkdir(parents=True, exist_ok=True)
    fp32_path, int8_path = args.out / "model.fp32.onnx", args.out / "model.int8.onnx"
    import onnx  # noqa: PLC0415

    onnx.save(build_graph(w, 1), fp32_path)
    pick = windows[rng.choice(windows.shape[0], args.quant_windows // 2, replace=False)]
    quant_sample = np.concatenate([pick, pick * args.headroom,
                                   spike_windows(windows, args.spike_windows, rng)]
                                  ).astype(np.float32)
    quantize_int8(fp32_path, int8_path, quant_sample)
    check = windows[rng.choice(windows.shape[0], 2000, replace=False)]
    ref = window_features(check)
    f32, i8 = session_runner(fp32_path)(check), session_runner(int8_path)(check)
    int8_err = np.abs(i8 - f32)
    print(f"FP32 vs NumPy reference: max |err| = {np.abs(f32 - ref).max():.2e}; INT8 vs FP32: "
          f"max |err| = {int8_err.max():.4f}, mean = {int8_err.mean():.4f}")
    golden_x, golden_y = check[:8], f32[:8]
    atol = float(max(0.1, 2.0 * np.abs(i8[:8] - f32[:8]).max()))
    artefacts = artefact_entries(((int8_path, "int8"), (fp32_path, "fp32")),
                                 input_range=int8_input_range(int8_path, "onnxruntime"))
    runtimes = other_runtimes(args.out, int8_path, quant_sample, check, f32, atol, golden_x)
    artefacts += runtimes.pop("artefacts")
    manifest = {
        "format": 1, "name": "univariate-wstat", "version": args.version, "kind": "sensor",
        "description": "One channel of any unit at irregular intervals: window statistics "
                       "(mean, mean abs deviation, mean |diff|) against a robust baseline whose "
                       "level and scale adapt within bounds, threshold in robust sigmas; gaps "
                       "restart the window; INT8 QDQ.",
        "input": {"channels": ["value"], "units": [""], "sample_rate_hz": 1.0, "window": w,
                  "hop": 1},
        "preprocessing": {"scaler": "calibrate_on_device",
                          "calibration_samples": args.calibration_samples,
                          "scale_floor": [1e-9]},
        "score": {"kind": "feature_deviation", "features": list(FEATURES),
                  "top_k": int(chosen["top_k"]),
                  "feature_std_floor": [float(v) for v in feature_floor],
                  "threshold": {"kind": "calibration_quantile", "quantile": 1.0,
                                "factor": 1.0, "holdout": 0.0}},
        "univariate": {"gap_factor": args.gap_factor, "scale_floor_rel": args.scale_floor_rel,
                       "adapt_rate": float(chosen["adapt_rate"]),
                       "adapt_below": args.adapt_below,
                       "drift_bound": float(chosen["drift_bound"]),
                       "threshold_sigma": float(chosen["threshold_sigma"]),
                       "scale_rate": float(chosen["scale_rate"]),
                       "clip": float(chosen["clip"]),
                       "scale_bound": float(chosen["scale_bound"]),
                       "rule_k": int(chosen["rule_k"]), "rule_n": int(chosen["rule_n"]),
                       "rule_spike": (None if chosen["spike_factor"] is None
                                      else float(chosen["spike_factor"]))},
        "artefacts": artefacts,
        "golden": {"inputs": golden_x.round(6).tolist(), "outputs": golden_y.round(6).tolist(),
                   "atol": round(atol, 4)},
        "latency_budget_ms_p99": 5.0,
        "lineage": {
            "recipe": "models/recipes/univariate_wstat.py",
            "selection": chosen,
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                     if k not in ("data", "out")},
            "training_data": {"dataset": "SKAB (github.com/waico/SKAB @ b2c0d46)",
                              "file": "anomaly-free/anomaly-free.csv, each channel alone",
                              "rows": int(data.values.shape[0])},
            "quantization": {"tool": f"onnxruntime.quantization {ort_version()}",
                             "format": "QDQ", "activations": "QInt8", "weights": "QInt8",
                             "calibration": "minmax", "headroom": args.headroom,
                             "calibration_windows": int(quant_sample.shape[0])},
            "fp32_int8_agreement": {"windows": int(check.shape[0]),
                                    "max_abs_err": round(float(int8_err.max()), 5),
                                    "mean_abs_err": round(float(int8_err.mean()), 5)},
            "runtimes": runtimes,
            "built_at": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
        "signature": None,
    }
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"wrote {args.out}/manifest.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
