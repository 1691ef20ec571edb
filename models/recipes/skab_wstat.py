"""Recipe: build the ``skab-wstat`` INT8 window-statistics model package from SKAB data.

    python models/recipes/skab_select.py --data ../shared/datasets/skab --json selection.json
    python models/recipes/skab_wstat.py --data ../shared/datasets/skab --out models/skab-wstat \
        --selection selection.json --version 2

The window, top_k, threshold factor, hold-out, floors and the bounded level adaptation come from
the grouped model selection (``--selection``, written by :mod:`skab_select`; it must have chosen
the ``wstat`` family, or ``wstat-drift`` with level adaptation and without robust statistics),
so the shipped defaults are the ones that procedure picks. The adaptation (α, B) goes into the
manifest's ``score.adaptation``; the agent applies it (:mod:`agent.pipeline.drift`).

Steps (re-runnable; needs the ``train`` extra for ``onnx``):

1. Read the anomaly-free SKAB recording (training data: normal operation only, no labels used)
   without its rows that fall in a labelled file's time span (its last 572 rows repeat
   ``other/5.csv``; :func:`skab_data.training_recording`), so a package built for a held-out
   figure has never seen a row it is scored on. ``--full-recording`` keeps every row: how the
   shipped ``skab-wstat@2`` was built (chosen on all files, so every file is training data).
2. Emulate on-device calibration on many 400-sample segments of it to fit the package constants:
   the per-channel input scale floor (``--floor-frac`` × the recording's std) and the
   per-feature std floor (``--feature-floor-frac`` × the std of each feature over all segments).
3. Build the FP32 ONNX graph of the window-statistics model (mean, mean absolute deviation,
   mean |Δ| per channel as MatMul/Sub/Abs ops; see :mod:`fleet.training.wstat`, whose graph
   builder and quantization the fleet's per-device retraining reuses). The mean
   absolute deviation replaces the std because squares need a far wider int8 range: with the std
   the INT8 model lost 0.05 F1 against FP32 on SKAB, with the mean absolute deviation none.
4. Quantize it to INT8 QDQ with ``onnxruntime.quantization.quantize_static`` using scaled windows
   of the training data as calibration data (MinMax, per-tensor, QInt8 activations and weights;
   MatMul, Sub and Abs quantized).
5. Check FP32 vs INT8 agreement and write golden vectors, sha256 and the manifest.
6. The same model for the other runtimes (:mod:`fleet.training.runtimes`): OpenVINO IR converted
   from the INT8 QDQ ONNX (needs the ``openvino`` extra) and a TFLite full-integer INT8 file
   quantized on the same calibration windows (needs TensorFlow, extra ``tflite``); each shipped
   only when it reproduces the golden outputs, and skipped with a note when its library is
   missing. The ONNX artefacts are unchanged by this step.

Why window statistics and not an autoencoder: on the SKAB protocol (calibrate on each file's first
400 rows) dense and feature autoencoders trained on the anomaly-free recording scored worse (they
learn to reconstruct level shifts, which is what a valve fault looks like); see models/README.md.
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

from cloud_sync.calibration import FEATURES, window_features
from fleet.training.runtimes import (
    export_openvino_ir,
    export_tflite_int8,
    ov_version,
    tf_version,
)
from fleet.training.wstat import (
    METHODS,
    artefact_entries,
    build_graph,
    int8_input_range,
    ort_version,
    quantize_int8,
    scaled_windows,
    session_runner,
)

UNITS = {
    "Accelerometer1RMS": "g",
    "Accelerometer2RMS": "g",
    "Current": "A",
    "Pressure": "bar",
    "Temperature": "degC",
    "Thermocouple": "degC",
    "Voltage": "V",
    "Volume Flow RateRMS": "l/min",
}


#: A runtime's INT8 artefact whose golden error exceeds this many times the ONNX Runtime INT8
#: artefact's is not the same INT8 model and is not shipped.
SAME_MODEL_FACTOR = 2.0


def golden_atol(errors: list[float]) -> float:
    """The golden tolerance: 1.5 × the largest |INT8 − FP32| golden error of any shipped INT8
    artefact (what INT8 measurably does on normal windows, as for ``mtd-patchcore``), at least
    0.05.

    >>> golden_atol([0.06, 0.08])
    0.12
    """
    return float(round(max(0.05, 1.5 * max(errors)), 6))


def other_runtimes(
    out: Path, int8_onnx: Path, quant_sample: np.ndarray, check: np.ndarray, f32: np.ndarray,
    ort_golden_err: float, golden_x: np.ndarray,
) -> dict[str, Any]:
    """Step 6: the OpenVINO IR (from the QDQ INT8 ONNX) and the TFLite INT8 artefact (from the
    same model in TensorFlow, quantized on the same calibration windows), each only when its
    library is installed and its golden error is at most :data:`SAME_MODEL_FACTOR` × the ONNX
    Runtime INT8 artefact's ``ort_golden_err``.

    Returns:
        ``artefacts`` (manifest entries), ``golden_errors`` (of the shipped ones) and
        per-runtime lineage (tool, agreement or note).
    """
    from agent.inference.registry import build_backend  # noqa: PLC0415

    info: dict[str, Any] = {"artefacts": [], "golden_errors": []}
    limit = SAME_MODEL_FACTOR * max(ort_golden_err, 1e-3)
    w, c = check.shape[1], check.shape[2]
    try:
        xml, weights = export_openvino_ir(int8_onnx, out / "model.int8.xml")
        built: tuple[str, Path, list[tuple[Path, str]], str] | None = (
            "openvino", xml, [(xml, "int8"), (weights, "int8")],
            f"openvino.convert_model {ov_version()} of {int8_onnx.name}")
    except ImportError:
        built = None
        info["openvino"] = {"note": "openvino not installed: no IR artefact"}
    candidates = [built] if built else []
    try:
        tfl = export_tflite_int8(w, c, quant_sample, out / "model.int8.tflite")
        candidates.append(("litert", tfl, [(tfl, "int8")],
                           f"tensorflow {tf_version()} TFLiteConverter, full-integer PTQ "
                           f"on the {quant_sample.shape[0]} calibration windows"))
    except ImportError:
        info["litert"] = {"note": "TensorFlow not installed (extra 'tflite'): no TFLite "
                                  "artefact"}
    for runtime, path, files, tool in candidates:
        backend = build_backend(runtime, path, "int8")
        err = np.abs(backend.run(check) - f32)
        golden_err = float(np.abs(backend.run(golden_x) - f32[:8]).max())
        entry = {"tool": tool, "fp32_agreement": {
            "windows": int(check.shape[0]), "max_abs_err": round(float(err.max()), 5),
            "mean_abs_err": round(float(err.mean()), 5), "golden_max_abs_err":
            round(golden_err, 5)}}
        if golden_err > limit:
            entry["note"] = (f"not shipped: golden error {golden_err:.4f} > "
                             f"{SAME_MODEL_FACTOR:g} x ONNX Runtime INT8's {ort_golden_err:.4f}")
            for p, _ in files:
                p.unlink()
        else:
            info["golden_errors"].append(golden_err)
            info["artefacts"] += artefact_entries(files, runtime=runtime, input_range=(
                int8_input_range(int8_onnx if runtime == "openvino" else path, runtime)))
        info[runtime] = entry
        print(f"{runtime}: {path.name} INT8 vs FP32 max |err| = {err.max():.4f}, golden "
              f"{golden_err:.4f} (limit {limit:.4f}){' NOT SHIPPED' if 'note' in entry else ''}")
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="SKAB root (has anomaly-free/)")
    ap.add_argument("--out", type=Path, required=True, help="package directory to write")
    ap.add_argument("--version", type=int, default=1)
    ap.add_argument("--window", type=int, default=10)
    ap.add_argument("--hop", type=int, default=1)
    ap.add_argument("--calibration-samples", type=int, default=400)
    ap.add_argument("--floor-frac", type=float, default=0.1)
    ap.add_argument("--feature-floor-frac", type=float, default=0.1)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--threshold-factor", type=float, default=1.5)
    ap.add_argument("--holdout", type=float, default=0.0,
                    help="fraction of the calibration samples held out for the threshold base")
    ap.add_argument("--selection", type=Path,
                    help="skab_select.py --json output: sets window, top-k, factor, hold-out, "
                         "floors")
    ap.add_argument("--full-recording", action="store_true",
                    help="train on every row of the anomaly-free recording, also those in a "
                         "labelled file's time span (how skab-wstat@2 was built)")
    ap.add_argument("--adapt-rate", type=float, default=0.0,
                    help="bounded level adaptation rate alpha (0: off)")
    ap.add_argument("--drift-bound", type=float, default=0.0,
                    help="bound B of the level adaptation, calibration sigmas")
    ap.add_argument("--quant-windows", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--calibration-method", choices=list(METHODS), default="minmax")
    ap.add_argument("--percentile", type=float, default=99.99)
    ap.add_argument("--op-types", default="MatMul,Sub,Abs",
                    help="comma-separated op types to quantize (others stay FP32)")
    args = ap.parse_args(argv)
    if args.selection is not None:
        chosen = json.loads(args.selection.read_text())
        if chosen["detector"] not in ("wstat", "wstat-drift"):
            raise SystemExit(f"{args.selection}: the selection chose {chosen['detector']!r}; "
                             "this recipe builds the window-statistics package only")
        if chosen.get("rule", "max") != "max":
            raise SystemExit(f"{args.selection}: the selection chose the {chosen['rule']!r} "
                             "threshold rule; the agent's calibration implements max x factor "
                             "only (calibration_quantile)")
        if chosen.get("robust"):
            raise SystemExit(f"{args.selection}: the selection chose robust statistics, which "
                             "the agent's multichannel calibration does not implement")
        args.adapt_rate = float(chosen.get("adapt_rate", 0.0))
        args.drift_bound = float(chosen.get("drift_bound", 0.0))
        args.window, args.top_k = int(chosen["window"]), int(chosen["param"])
        args.threshold_factor, args.holdout = float(chosen["factor"]), float(chosen["holdout"])
        if "floor" in chosen:  # one fraction for both floors (skab_select.GRID)
            args.floor_frac = args.feature_floor_frac = float(chosen["floor"])
        # the choice itself goes into the lineage, not the path of a file that may be gone
        args.selection = {"procedure": "models/recipes/skab_select.py", "chosen": chosen}
    if args.adapt_rate < 0 or (args.adapt_rate > 0 and args.drift_bound <= 0):
        raise SystemExit("level adaptation needs --adapt-rate > 0 and --drift-bound > 0")
    rng = np.random.default_rng(args.seed)

    src = anomaly_free_file(args.data)
    data = read_skab(src) if args.full_recording else training_recording(args.data)
    channels = list(data.channels)
    c, w = len(channels), args.window
    floor = args.floor_frac * data.values.std(0)
    print(f"training data: {src} ({data.values.shape[0]} rows, {c} channels)")
    windows, feats = scaled_windows(
        data.values, w, args.calibration_samples, floor, step=100,
        span=args.calibration_samples + 600,
    )
    feature_floor = args.feature_floor_frac * feats.std(0)
    print(f"emulated calibrations: {windows.shape[0]} windows")

    args.out.mkdir(parents=True, exist_ok=True)
    fp32_path = args.out / "model.fp32.onnx"
    int8_path = args.out / "model.int8.onnx"
    import onnx  # noqa: PLC0415

    onnx.save(build_graph(w, c), fp32_path)
    quant_sample = windows[rng.choice(windows.shape[0], args.quant_windows, replace=False)]
    quantize_int8(fp32_path, int8_path, quant_sample, method=args.calibration_method,
                  percentile=args.percentile, op_types=args.op_types.split(","))

    def run(path: Path, x: np.ndarray) -> np.ndarray:
        return session_runner(path)(x)

    check = windows[rng.choice(windows.shape[0], 2000, replace=False)]
    ref, f32, i8 = window_features(check), run(fp32_path, check), run(int8_path, check)
    fp32_err = float(np.abs(f32 - ref).max())
    int8_err = np.abs(i8 - f32)
    rel = float((int8_err / feature_floor.clip(1e-6)).max())
    print(f"FP32 vs NumPy reference: max |err| = {fp32_err:.2e}")
    print(f"INT8 vs FP32: max |err| = {int8_err.max():.4f}, mean = {int8_err.mean():.4f}, "
          f"max in units of the feature floor = {rel:.2f}")
    golden_x = check[:8]
    golden_y = f32[:8]
    ort_golden_err = float(np.abs(i8[:8] - f32[:8]).max())
    artefacts = artefact_entries(((int8_path, "int8"), (fp32_path, "fp32")),
                                 input_range=int8_input_range(int8_path, "onnxruntime"))
    runtimes = other_runtimes(args.out, int8_path, quant_sample, check, f32, ort_golden_err,
                              golden_x)
    atol = golden_atol([ort_golden_err, *runtimes.pop("golden_errors")])
    print(f"golden atol {atol:.4f} (1.5 x the largest golden error of a shipped INT8 artefact)")
    artefacts += runtimes.pop("artefacts")
    manifest = {
        "format": 1,
        "name": "skab-wstat",
        "version": args.version,
        "kind": "sensor",
        "description": "SKAB pump: window statistics (mean, std, mean |diff|) per channel, "
                       "calibrated on device; INT8 QDQ.",
        "input": {"channels": channels, "units": [UNITS.get(ch, "") for ch in channels],
                  "sample_rate_hz": 1.0, "window": w, "hop": args.hop},
        "preprocessing": {"scaler": "calibrate_on_device",
                          "calibration_samples": args.calibration_samples,
                          "scale_floor": [float(v) for v in floor]},
        "score": {"kind": "feature_deviation", "features": list(FEATURES), "top_k": args.top_k,
                  "feature_std_floor": [float(v) for v in feature_floor],
                  "threshold": {"kind": "calibration_quantile", "quantile": 1.0,
                                "factor": args.threshold_factor, "holdout": args.holdout},
                  **({"adaptation": {"rate": args.adapt_rate, "bound": args.drift_bound}}
                     if args.adapt_rate > 0 else {})},
        "artefacts": artefacts,
        "golden": {"inputs": golden_x.round(6).tolist(), "outputs": golden_y.round(6).tolist(),
                   "atol": round(atol, 4)},
        "latency_budget_ms_p99": 5.0,
        "lineage": {
            "recipe": "models/recipes/skab_wstat.py",
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                     if k not in ("data", "out")},
            "training_data": {"dataset": "SKAB (github.com/waico/SKAB @ b2c0d46)",
                              "file": "anomaly-free/anomaly-free.csv",
                              "rows": int(data.values.shape[0])},
            "quantization": {"tool": f"onnxruntime.quantization {ort_version()}",
                             "format": "QDQ", "activations": "QInt8", "weights": "QInt8",
                             "calibration": args.calibration_method,
                             "percentile": args.percentile, "op_types": args.op_types,
                             "calibration_windows": args.quant_windows},
            "fp32_int8_agreement": {"windows": int(check.shape[0]),
                                    "max_abs_err": round(float(int8_err.max()), 5),
                                    "mean_abs_err": round(float(int8_err.mean()), 5)},
            "runtimes": runtimes,
            "built_at": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
        "signature": None,
    }
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"wrote {args.out}/manifest.json; int8 {int8_path.stat().st_size} B, "
          f"fp32 {fp32_path.stat().st_size} B")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
