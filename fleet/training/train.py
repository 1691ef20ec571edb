"""Train one device's INT8 window-statistics package from its own samples, behind a gate.

:func:`train_wstat` (pure computation plus files in ``out_dir``; no database, no network):

1. Take the base package's input spec, floors, score and threshold definition; reorder the
   device's channels to the base package's order.
2. Fit the device's input scaler on its training rows and build the FP32 graph
   (:mod:`fleet.training.wstat`).
3. Quantize to INT8 QDQ with calibration windows drawn from THAT device's data: its scaled
   training windows, plus the same windows amplified by ``headroom``. Every op of the graph is
   positively homogeneous (mean, |x − mean|, |Δ| all scale with the input), so amplifying the
   windows by g multiplies every tensor's MinMax range by g: with the device's normal windows
   alone (|z| ≲ 3) a fault of 10 σ would clip at the calibration maximum and could never cross
   the threshold; with ``headroom`` 4 the int8 range reaches about ±12 σ, the range of the
   shipped ``skab-wstat`` package.
4. Fit the device's calibration (scaler, feature statistics, threshold) on ALL its calibration
   samples with the INT8 artefact: exactly what the device's
   :meth:`agent.pipeline.detector.FeatureDeviationDetector.calibrate` would compute
   (:func:`cloud_sync.calibration.fit_calibration`, the same code).
5. Gate, on held-out windows (``heldout`` if given, else the reservoir windows, else the last
   ``holdout_frac`` of the calibration samples, which are then left out of steps 2-3 and of the
   gate's own calibration fit): FP32 vs INT8 max |Δ feature| ≤ ``max_abs_err``; the same
   above-threshold decision (each precision with its own calibration) on ≥
   ``min_decision_agreement`` of the windows; INT8 false-alarm rate (held-out windows above the
   threshold; they are normal operation) ≤ ``max_false_alarm_rate``.
   **Not worse than the base model**: on the device's held-out time range (``heldout`` if
   given, else the calibration tail, which then is left out of quantization too) the retrained
   INT8 model and the base package's INT8 artefact are each calibrated on the same rows before
   it, by the base package's rule, and the retrained model's false-alarm rate must not exceed
   the base model's by more than ``max_far_excess``. The reservoir is not used for this: the
   device's running base model chose those windows as normal, which favours the base. A failed
   gate raises :class:`GateFailed` with the report (both rates): nothing is signed or
   published.

   Every other choice (window, top-k, threshold base and factor, floors) is the base package's,
   i.e. what the grouped selection (``models/recipes/skab_select.py``) chose for it; with no
   labels on a device there is nothing to choose them on per device.
6. Write golden vectors (held-out windows, FP32 outputs), artefact hashes and the manifest with
   the fitted calibration and lineage. Signing and publishing: :mod:`fleet.training.retrain`.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from cloud_sync.calibration import (
    CalibrationFit,
    FeatureFn,
    deviation_scores,
    fit_calibration,
    fit_scaler,
    sliding_windows,
)
from cloud_sync.manifest import Manifest
from fleet.errors import FleetError
from fleet.training.wstat import (
    artefact_entries,
    build_graph,
    int8_input_range,
    ort_version,
    quantize_int8,
    session_runner,
)

FloatArray = npt.NDArray[np.float64]

#: Steps reported to ``on_step`` (the CLI draws a progress bar over them).
STEPS = ("prepare", "fp32 graph", "int8 quantization", "device calibration", "gate", "manifest")


@dataclass(frozen=True)
class TrainOptions:
    """Knobs of :func:`train_wstat` (defaults measured on SKAB; see fleet/README or the
    benchmark ``benchmarks/skab_loop.py``).

    Attributes:
        holdout_frac: Share of the calibration samples held out for the gate when there are no
            reservoir or explicit held-out windows.
        headroom: Gain applied to a copy of the quantization windows (int8 range headroom).
        quant_method: ``minmax``, ``percentile`` or ``entropy``.
        max_abs_err: Gate: largest FP32-vs-INT8 feature difference (scaled units).
        min_decision_agreement: Gate: share of held-out windows with the same decision.
        max_false_alarm_rate: Gate: share of held-out (normal) windows above the threshold.
        max_far_excess: Gate: how much the retrained model's false-alarm rate on the held-out
            time range may exceed the base model's (0: not worse).
        golden: Golden vectors written.
    """

    holdout_frac: float = 0.25
    headroom: float = 4.0
    quant_method: str = "minmax"
    max_abs_err: float = 0.5
    min_decision_agreement: float = 0.99
    max_false_alarm_rate: float = 0.25
    max_far_excess: float = 0.0
    golden: int = 8


@dataclass(frozen=True)
class GateReport:
    """What the gate measured (stored in the manifest's lineage).

    ``compare_*`` are the not-worse-than-the-base check's: its held-out source (``heldout`` or
    ``calibration tail``), window count, and the false-alarm rates (shares of those windows
    above the threshold) of the retrained and of the base model.
    """

    passed: bool
    reasons: tuple[str, ...]
    heldout_source: str
    heldout_windows: int
    max_abs_err: float
    mean_abs_err: float
    decision_agreement: float
    false_alarm_rate: float
    fp32_false_alarm_rate: float
    compare_source: str = ""
    compare_windows: int = 0
    retrained_false_alarm_rate: float = 0.0
    base_false_alarm_rate: float = 0.0


class GateFailed(FleetError):
    """The trained model failed its gate; nothing was published.

    Attributes:
        report: The measurements and the reasons.
    """

    def __init__(self, report: GateReport) -> None:
        super().__init__("gate failed: " + "; ".join(report.reasons))
        self.report = report


@dataclass(frozen=True)
class DeviceData:
    """One device stream's training data.

    Attributes:
        device_id: The device.
        stream: Its stream.
        channels: Channel names of the last axis of every array.
        samples: Shape ``(N, C)``: the stream's calibration samples (first N raw readings).
        reservoir: Shape ``(K, W, C)``: raw windows the device classified normal, or None.
        heldout: Shape ``(K, W, C)``: explicit held-out windows for the gate, or None; none
            of their rows may be a row of ``samples`` (:func:`check_disjoint`).
        units: Unit per channel ('' = take the base package's).
        sample_rate_hz: Device sample rate (None = the base package's).
        data_start: Epoch s of the first sample, when known.
        data_end: Epoch s of the last sample, when known.
    """

    device_id: str
    stream: str
    channels: Sequence[str]
    samples: FloatArray
    reservoir: FloatArray | None = None
    heldout: FloatArray | None = None
    units: Sequence[str] = field(default_factory=tuple)
    sample_rate_hz: float | None = None
    data_start: float | None = None
    data_end: float | None = None


@dataclass(frozen=True)
class TrainResult:
    """A trained, gated, unsigned package directory."""

    package_dir: Path
    manifest: dict[str, Any]
    gate: GateReport
    calibration: CalibrationFit


def check_disjoint(samples: FloatArray, heldout: FloatArray) -> None:
    """Check that no held-out window ``(K, W, C)`` holds a row of the calibration samples
    ``(N, C)`` (rows compared exactly): the gate's figure is held out only if the fit never
    saw its rows.

    Raises:
        ValueError: some held-out rows equal calibration rows (the count is named).
    """
    seen = {row.tobytes() for row in np.ascontiguousarray(samples, np.float64)}
    rows = np.ascontiguousarray(heldout, np.float64).reshape(-1, heldout.shape[-1])
    shared = sum(row.tobytes() in seen for row in rows)
    if shared:
        raise ValueError(f"heldout windows hold {shared} row(s) that are also calibration "
                         "samples: held-out windows must come from other rows")


def _reorder(arr: FloatArray | None, order: list[int]) -> FloatArray | None:
    return None if arr is None else np.asarray(arr, np.float64)[..., order]


def _runner(fn: Callable[[npt.NDArray[np.float32]], npt.NDArray[np.float32]]) -> FeatureFn:
    return fn


def train_wstat(
    data: DeviceData,
    base_package_dir: Path,
    out_dir: Path,
    *,
    name: str,
    version: int,
    options: TrainOptions | None = None,
    on_step: Callable[[str], None] | None = None,
    on_quant_batch: Callable[[], None] | None = None,
    clock: Callable[[], float] | None = None,
) -> TrainResult:
    """Train, quantize, calibrate and gate one device's package into ``out_dir``.

    Args:
        data: The device's samples (see :class:`DeviceData`).
        base_package_dir: The package whose input spec, floors and score it follows.
        out_dir: Package directory to write (created).
        name: Package name.
        version: Package version (the registry's next).
        options: Gate and quantization knobs.
        on_step: Called with each name of :data:`STEPS` when it starts.
        on_quant_batch: Called per quantization calibration batch.
        clock: Epoch seconds for ``built_at`` (default: now).

    Returns:
        The unsigned package and its gate report.

    Raises:
        ValueError: channels missing from the base package, too few samples, bad shapes,
            held-out windows that share rows with the samples.
        GateFailed: the gate refused the model (the directory is left for inspection).
    """
    opt = options or TrainOptions()
    step = on_step or (lambda _name: None)
    step("prepare")
    base = Manifest.model_validate(json.loads((base_package_dir / "manifest.json").read_text()))
    chans = list(base.input.channels)
    missing = sorted(set(chans) - set(data.channels))
    if missing:
        raise ValueError(f"device data lacks the base model's channels {missing}")
    order = [list(data.channels).index(ch) for ch in chans]
    samples = _reorder(data.samples, order)
    assert samples is not None
    w, c = base.input.window, len(chans)
    least = min_samples(w, base.score.threshold.holdout, opt.holdout_frac)
    if samples.ndim != 2 or samples.shape[0] < least:
        raise ValueError(f"need at least {least} calibration samples, got {samples.shape}")
    reservoir, heldout = _reorder(data.reservoir, order), _reorder(data.heldout, order)
    for what, arr in (("reservoir", reservoir), ("heldout", heldout)):
        if arr is not None and (arr.ndim != 3 or arr.shape[1:] != (w, c)):
            raise ValueError(f"{what} windows must be (K, {w}, {c}), got {arr.shape}")
    n_hold = max(w + 1, round(opt.holdout_frac * samples.shape[0]))
    if heldout is not None and len(heldout):
        check_disjoint(samples, heldout)
        source, fit_rows, held = "heldout", samples, heldout
        train_rows, cmp_source, cmp_held = samples, "heldout", heldout
    else:
        # the calibration tail is the time range the base comparison holds out: never trained on
        train_rows, cmp_source = samples[:-n_hold], "calibration tail"
        cmp_held = sliding_windows(samples[-n_hold:], w)
        if reservoir is not None and len(reservoir):
            source, fit_rows, held = "reservoir", samples, reservoir
        else:
            source, fit_rows, held = "calibration tail", train_rows, cmp_held
    floor = np.asarray(base.preprocessing.scale_floor, np.float64)
    ffloor = np.asarray(base.score.feature_std_floor, np.float64)
    thr = base.score.threshold

    def calibrate(rows: FloatArray, model: FeatureFn) -> CalibrationFit:
        return fit_calibration(rows, model, window=w, scale_floor=floor, feature_std_floor=ffloor,
                               top_k=base.score.top_k, quantile=thr.quantile, factor=thr.factor,
                               holdout=thr.holdout)

    step("fp32 graph")
    import onnx  # noqa: PLC0415 - training only

    out_dir.mkdir(parents=True, exist_ok=True)
    fp32_path, int8_path = out_dir / "model.fp32.onnx", out_dir / "model.int8.onnx"
    onnx.save(build_graph(w, c), fp32_path)

    step("int8 quantization")
    scaler = fit_scaler(train_rows, floor)
    z = scaler.apply(sliding_windows(train_rows, w))
    quant = np.concatenate([z, (z * opt.headroom).astype(np.float32)])
    quantize_int8(fp32_path, int8_path, quant, method=opt.quant_method, on_batch=on_quant_batch)
    fp32, int8 = _runner(session_runner(fp32_path)), _runner(session_runner(int8_path))

    step("device calibration")
    final = calibrate(samples, int8)

    step("gate")
    gate = _gate(opt, source, held, calibrate(fit_rows, int8), calibrate(fit_rows, fp32),
                 int8, fp32, base.score.top_k)
    base_int8 = _runner(session_runner(_base_int8(base, base_package_dir)))
    gate = _compare_with_base(opt, gate, cmp_source, cmp_held, calibrate(train_rows, int8),
                              calibrate(train_rows, base_int8), int8, base_int8,
                              base.score.top_k)
    if not gate.passed:
        raise GateFailed(gate)

    step("manifest")
    golden_x = final.scaler.apply(held[: opt.golden])
    golden_y, golden_i8 = np.asarray(fp32(golden_x)), np.asarray(int8(golden_x))
    atol = float(max(0.05, 1.5 * np.abs(golden_i8 - golden_y).max()))
    given = list(data.units)
    units = [given[i] for i in order] if given and all(given) else list(base.input.units)
    now = (clock or (lambda: dt.datetime.now(dt.timezone.utc).timestamp()))()
    manifest: dict[str, Any] = {
        "format": 1, "name": name, "version": version, "kind": "sensor",
        "description": f"{base.name} retrained for {data.device_id}/{data.stream}: window "
                       "statistics, INT8 QDQ quantized on that device's data, calibration "
                       "fitted in the cloud.",
        "input": {**base.input.model_dump(), "units": units,
                  "sample_rate_hz": data.sample_rate_hz or base.input.sample_rate_hz},
        "preprocessing": base.preprocessing.model_dump(),
        "score": base.score.model_dump(),
        "artefacts": artefact_entries(((int8_path, "int8"), (fp32_path, "fp32")),
                                      input_range=int8_input_range(int8_path, "onnxruntime")),
        "golden": {"inputs": golden_x.round(6).tolist(), "outputs": golden_y.round(6).tolist(),
                   "atol": round(atol, 4)},
        "latency_budget_ms_p99": base.latency_budget_ms_p99,
        "lineage": {
            "recipe": "fleet.training.train.train_wstat",
            "base": f"{base.name}@{base.version}",
            "training_data": {"device_id": data.device_id, "stream": data.stream,
                              "calibration_samples": int(samples.shape[0]),
                              "quantization_rows": int(train_rows.shape[0]),
                              "reservoir_windows": 0 if reservoir is None else len(reservoir),
                              "data_start": data.data_start, "data_end": data.data_end},
            "quantization": {"tool": f"onnxruntime.quantization {ort_version()}",
                             "format": "QDQ", "activations": "QInt8", "weights": "QInt8",
                             "calibration": opt.quant_method, "headroom": opt.headroom,
                             "calibration_windows": int(quant.shape[0])},
            "fp32_int8_agreement": {"windows": gate.heldout_windows,
                                    "max_abs_err": round(gate.max_abs_err, 5),
                                    "mean_abs_err": round(gate.mean_abs_err, 5),
                                    "decision_agreement": round(gate.decision_agreement, 5)},
            "gate": {**asdict(gate), "reasons": list(gate.reasons),
                     "options": asdict(opt)},
            "built_at": dt.datetime.fromtimestamp(now, dt.timezone.utc).strftime(
                "%Y-%m-%dT%H:%M:%SZ"),
        },
        "calibration": {
            "mean": final.scaler.mean.tolist(), "scale": final.scaler.scale.tolist(),
            "feature_mean": final.features.mean.tolist(),
            "feature_std": final.features.std.tolist(), "threshold": final.threshold,
            "fitted_on": {"device_id": data.device_id, "stream": data.stream,
                          "samples": int(samples.shape[0]), "data_start": data.data_start,
                          "data_end": data.data_end},
        },
        "signature": None,
    }
    Manifest.model_validate(manifest)
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return TrainResult(out_dir, manifest, gate, final)


def _gate(
    opt: TrainOptions, source: str, held: FloatArray, cal_i8: CalibrationFit,
    cal_f32: CalibrationFit, int8: FeatureFn, fp32: FeatureFn, top_k: int,
) -> GateReport:
    x = held.astype(np.float32)
    f_i8 = np.asarray(int8(cal_i8.scaler.apply(x)), np.float64)
    f_ref = np.asarray(fp32(cal_i8.scaler.apply(x)), np.float64)
    err = np.abs(f_i8 - f_ref)
    f_f32 = np.asarray(fp32(cal_f32.scaler.apply(x)), np.float64)
    s_i8 = deviation_scores(f_i8, cal_i8.features, top_k)[0]
    s_f32 = deviation_scores(f_f32, cal_f32.features, top_k)[0]
    d_i8, d_f32 = s_i8 > cal_i8.threshold, s_f32 > cal_f32.threshold
    agree = float(np.mean(d_i8 == d_f32))
    far, far32 = float(np.mean(d_i8)), float(np.mean(d_f32))
    reasons = []
    if float(err.max()) > opt.max_abs_err:
        reasons.append(f"FP32-vs-INT8 max |delta| {err.max():.4f} > {opt.max_abs_err}")
    if agree < opt.min_decision_agreement:
        reasons.append(f"FP32/INT8 decisions agree on {agree:.2%} of held-out windows "
                       f"< {opt.min_decision_agreement:.0%}")
    if far > opt.max_false_alarm_rate:
        reasons.append(f"held-out false-alarm rate {far:.2%} > {opt.max_false_alarm_rate:.0%} "
                       f"({source}, {len(held)} windows)")
    return GateReport(
        passed=not reasons, reasons=tuple(reasons), heldout_source=source,
        heldout_windows=len(held), max_abs_err=float(err.max()),
        mean_abs_err=float(err.mean()), decision_agreement=agree, false_alarm_rate=far,
        fp32_false_alarm_rate=far32,
    )


def min_samples(window: int, threshold_holdout: float, holdout_frac: float) -> int:
    """The fewest calibration samples :func:`train_wstat` can use: at least 2·(W + 1), and
    they, and the same rows less the held-out tail (``holdout_frac``), must each be a
    calibration: W + 1 rows, and with a threshold hold-out
    (:func:`cloud_sync.calibration.holdout_scores`) at least 2·W fit and W held-out rows.

    >>> min_samples(5, 0.25, 0.25), min_samples(10, 0.0, 0.25)
    (25, 22)
    """

    def fits(n: int) -> bool:
        if n < window + 1:
            return False
        if threshold_holdout <= 0:
            return True
        fit = round(n * (1.0 - threshold_holdout))
        return fit >= 2 * window and n - fit >= window

    n = 2 * (window + 1)
    while not (fits(n) and fits(n - max(window + 1, round(holdout_frac * n)))):
        n += 1
    return n


def _base_int8(base: Manifest, base_dir: Path) -> Path:
    """The base package's ONNX Runtime INT8 artefact (what the device runs before retraining).

    Raises:
        ValueError: the base package has none.
    """
    for art in base.artefacts:
        if art.runtime == "onnxruntime" and art.precision == "int8":
            return base_dir / art.path
    raise ValueError(f"base package {base.name}@{base.version} has no onnxruntime INT8 artefact")


def _false_alarm_rate(held: FloatArray, cal: CalibrationFit, model: FeatureFn,
                      top_k: int) -> float:
    """Share of the held-out (normal) raw windows ``(K, W, C)`` scored above the threshold."""
    feats = np.asarray(model(cal.scaler.apply(held.astype(np.float32))), np.float64)
    return float(np.mean(deviation_scores(feats, cal.features, top_k)[0] > cal.threshold))


def _compare_with_base(
    opt: TrainOptions, gate: GateReport, source: str, held: FloatArray, cal_new: CalibrationFit,
    cal_base: CalibrationFit, new: FeatureFn, base: FeatureFn, top_k: int,
) -> GateReport:
    """``gate`` plus the not-worse-than-the-base check (module docstring, step 5)."""
    far_new = _false_alarm_rate(held, cal_new, new, top_k)
    far_base = _false_alarm_rate(held, cal_base, base, top_k)
    reasons = list(gate.reasons)
    if far_new > far_base + opt.max_far_excess:
        reasons.append(f"worse than the base model on {len(held)} held-out windows ({source}): "
                       f"false-alarm rate {far_new:.2%} retrained vs {far_base:.2%} base")
    return replace(gate, passed=not reasons, reasons=tuple(reasons), compare_source=source,
                   compare_windows=len(held), retrained_false_alarm_rate=far_new,
                   base_false_alarm_rate=far_base)
