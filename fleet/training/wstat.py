"""The window-statistics model: ONNX graph, INT8 static quantization, reference check.

Shared by the recipe of the shipped package (``models/recipes/skab_wstat.py``) and the fleet's
per-device retraining (:mod:`fleet.training.train`). Needs ``onnx`` and ``onnxruntime``.

Graph (FP32, opset 17): input ``window`` ``(B, W, C)`` float32 (scaled) → ``features``
``(B, 3C)`` float32, the per-channel window mean, mean absolute deviation and mean absolute first
difference as MatMul/Sub/Abs ops; the NumPy reference is :func:`cloud_sync.calibration.
window_features`. The mean absolute deviation replaces the std because squares need a far wider
int8 range (with the std the INT8 model lost 0.05 F1 against FP32 on SKAB, see models/README.md).

Quantization: ``onnxruntime.quantization.quantize_static`` to QDQ, per-tensor QInt8 activations
and weights, MinMax calibration by default, over scaled windows of the training data (Jacob et
al., "Quantization and Training of Neural Networks for Efficient Integer-Arithmetic-Only
Inference", CVPR 2018, for the affine int8 scheme; ONNX Runtime's "Quantize ONNX models" docs for
the QDQ format).
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper

from cloud_sync.calibration import sliding_windows, window_features

Float32Array = npt.NDArray[np.float32]

#: Calibration methods of ``onnxruntime.quantization`` by CLI name.
METHODS = ("minmax", "percentile", "entropy")
DEFAULT_OP_TYPES = ("MatMul", "Sub", "Abs")
_RUN_BATCH = 512


def build_graph(window: int, channels: int) -> onnx.ModelProto:
    """FP32 ONNX graph: input ``window`` (B, W, C) float32 → ``features`` (B, 3C) float32.

    Raises:
        onnx.checker.ValidationError: the graph is invalid (a bug).
    """
    w, c = window, channels
    avg = numpy_helper.from_array(np.full((1, w), 1.0 / w, np.float32), "avg_w")
    avg_d = numpy_helper.from_array(np.full((1, w - 1), 1.0 / (w - 1), np.float32), "avg_d")
    diff = np.zeros((w - 1, w), np.float32)
    diff[np.arange(w - 1), np.arange(w - 1)] = -1.0
    diff[np.arange(w - 1), np.arange(1, w)] = 1.0
    diff_t = numpy_helper.from_array(diff, "diff")
    shape = numpy_helper.from_array(np.array([-1, 3 * c], np.int64), "out_shape")
    nodes = [
        helper.make_node("MatMul", ["avg_w", "window"], ["mean"]),  # (B,1,C)
        helper.make_node("Sub", ["window", "mean"], ["centered"]),
        helper.make_node("Abs", ["centered"], ["abs_centered"]),
        helper.make_node("MatMul", ["avg_w", "abs_centered"], ["mean_abs_dev"]),
        helper.make_node("MatMul", ["diff", "window"], ["delta"]),  # (B,W-1,C)
        helper.make_node("Abs", ["delta"], ["abs_delta"]),
        helper.make_node("MatMul", ["avg_d", "abs_delta"], ["mad"]),
        helper.make_node("Concat", ["mean", "mean_abs_dev", "mad"], ["feat3"], axis=2),
        helper.make_node("Reshape", ["feat3", "out_shape"], ["features"]),
    ]
    graph = helper.make_graph(
        nodes,
        "window_statistics",
        [helper.make_tensor_value_info("window", TensorProto.FLOAT, ["batch", w, c])],
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 3 * c])],
        initializer=[avg, avg_d, diff_t, shape],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def scaled_windows(
    values: npt.NDArray[np.float64], window: int, cal: int, floor: npt.NDArray[np.float64],
    step: int, span: int,
) -> tuple[Float32Array, Float32Array]:
    """Scaled windows of many emulated device calibrations over ``values``.

    Each segment ``values[start : start + span]`` (starts every ``step`` rows) is scaled with the
    mean and floored std of its first ``cal`` rows, as a device calibrating there would.

    Args:
        values: Shape ``(N, C)``, raw, channel units.
        window: W.
        cal: Calibration rows per emulated device.
        floor: Shape ``(C,)``, the scale floor.
        step: Rows between segment starts.
        span: Rows per segment (≥ ``cal``).

    Returns:
        (windows ``(K, W, C)`` float32 scaled, features ``(K, 3C)`` float32); K = 0 when
        ``values`` is not longer than ``span``.
    """
    ws, fs = [], []
    for start in range(0, values.shape[0] - span, step):
        seg = values[start : start + span]
        mu, sd = seg[:cal].mean(0), np.maximum(seg[:cal].std(0), floor)
        z = ((seg - mu) / sd).astype(np.float32)
        win = sliding_windows(z, window)
        ws.append(win)
        fs.append(window_features(win))
    c = values.shape[1]
    if not ws:
        return np.zeros((0, window, c), np.float32), np.zeros((0, 3 * c), np.float32)
    return np.concatenate(ws), np.concatenate(fs)


def _reader(windows: Float32Array, batch: int, on_batch: Callable[[], None] | None) -> Any:
    from onnxruntime.quantization import CalibrationDataReader  # noqa: PLC0415

    class _Reader(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self._it = iter(windows[i : i + batch] for i in range(0, len(windows), batch))

        def get_next(self) -> dict[str, Float32Array] | None:
            nxt = next(self._it, None)
            if nxt is None:
                return None
            if on_batch is not None:
                on_batch()
            return {"window": nxt}

    return _Reader()


def quantize_int8(
    fp32_path: Path,
    int8_path: Path,
    calibration_windows: Float32Array,
    *,
    method: str = "minmax",
    percentile: float = 99.99,
    op_types: Iterable[str] = DEFAULT_OP_TYPES,
    batch: int = 50,
    on_batch: Callable[[], None] | None = None,
) -> None:
    """Static INT8 QDQ quantization of ``fp32_path`` into ``int8_path``.

    Args:
        fp32_path: The FP32 model.
        int8_path: Where the INT8 QDQ model is written.
        calibration_windows: Shape ``(K, W, C)`` float32, scaled windows whose activation
            ranges set the int8 scales (fed in batches of ``batch``).
        method: ``minmax``, ``percentile`` or ``entropy``.
        percentile: For ``percentile``: the clipping percentile.
        op_types: Op types quantized (others stay FP32).
        batch: Windows per calibration batch.
        on_batch: Called for each calibration batch fed (progress bars).

    Raises:
        ValueError: unknown method or no calibration windows.
    """
    from onnxruntime.quantization import (  # noqa: PLC0415 - heavy, only when training
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process  # noqa: PLC0415

    methods = {"minmax": CalibrationMethod.MinMax, "percentile": CalibrationMethod.Percentile,
               "entropy": CalibrationMethod.Entropy}
    if method not in methods:
        raise ValueError(f"unknown calibration method {method!r} (one of {METHODS})")
    if len(calibration_windows) == 0:
        raise ValueError("quantization needs calibration windows")
    with tempfile.TemporaryDirectory() as tmp:
        pre = Path(tmp) / "pre.onnx"
        quant_pre_process(str(fp32_path), str(pre), skip_symbolic_shape=True)
        quantize_static(
            str(pre),
            str(int8_path),
            _reader(calibration_windows, batch, on_batch),
            quant_format=QuantFormat.QDQ,
            activation_type=QuantType.QInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=methods[method],
            per_channel=False,
            op_types_to_quantize=list(op_types),
            extra_options={"CalibPercentile": percentile},
        )


def session_runner(path: Path) -> Callable[[Float32Array], Float32Array]:
    """An ONNX Runtime CPU session of ``path`` as a function ``(B, W, C) -> (B, F)`` float32
    (batches of 512)."""
    import onnxruntime as ort  # noqa: PLC0415

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])

    def run(x: Float32Array) -> Float32Array:
        outs = [np.asarray(sess.run(None, {"window": x[i : i + _RUN_BATCH]})[0], np.float32)
                for i in range(0, len(x), _RUN_BATCH)]
        if not outs:
            return np.zeros((0, 0), np.float32)
        return np.concatenate(outs)

    return run


def sha256(path: Path) -> str:
    """Hex sha256 of a file."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def artefact_entries(
    paths: Iterable[tuple[Path, str]],
    runtime: str = "onnxruntime",
    input_range: tuple[float, float] | None = None,
) -> list[dict[str, Any]]:
    """Manifest ``artefacts`` entries for ``(path, precision)`` pairs of one ``runtime``;
    ``input_range`` goes on the int8 entries (see :func:`int8_input_range`)."""
    entries: list[dict[str, Any]] = []
    for p, prec in paths:
        entry: dict[str, Any] = {"runtime": runtime, "precision": prec, "path": p.name,
                                 "sha256": sha256(p), "size_bytes": p.stat().st_size}
        if prec == "int8" and input_range is not None:
            entry["input_range"] = [round(input_range[0], 6), round(input_range[1], 6)]
        entries.append(entry)
    return entries


def _int8_range(scale: float, zero_point: int) -> tuple[float, float]:
    # affine int8: real = scale * (q - zero_point), q in [-128, 127] (Jacob et al. 2018)
    return float(scale * (-128 - zero_point)), float(scale * (127 - zero_point))


def int8_input_range(path: Path, runtime: str) -> tuple[float, float] | None:
    """The model input range an INT8 artefact represents without clipping.

    Read from the quantization parameters of the op that quantizes the graph input: the
    ``QuantizeLinear`` fed by ``window`` in a QDQ ONNX model (also the source of the OpenVINO IR,
    so pass the ONNX path for ``openvino``), or the first ``QUANTIZE`` op of a TFLite model.

    Returns:
        ``(low, high)`` in scaled input units, or None when the input is not quantized.

    Raises:
        ValueError: unknown runtime.
    """
    if runtime in ("onnxruntime", "openvino"):
        model = onnx.load(str(path))
        inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
        for node in model.graph.node:
            if node.op_type == "QuantizeLinear" and node.input[0] == "window":
                zp = int(inits[node.input[2]]) if len(node.input) > 2 else 0
                return _int8_range(float(inits[node.input[1]]), zp)
        return None
    if runtime == "litert":
        from ai_edge_litert.interpreter import Interpreter  # noqa: PLC0415

        interp = Interpreter(model_path=str(path))
        first_input = interp.get_input_details()[0]["index"]
        tensors = {t["index"]: t for t in interp.get_tensor_details()}
        for op in interp._get_ops_details():  # the public API has no op list
            if op["op_name"] == "QUANTIZE" and int(op["inputs"][0]) == first_input:
                scale, zp = tensors[int(op["outputs"][0])]["quantization"]
                return _int8_range(float(scale), int(zp))
        return None
    raise ValueError(f"unknown runtime {runtime!r}")


def ort_version() -> str:
    """The installed onnxruntime version (for lineage)."""
    import onnxruntime as ort  # noqa: PLC0415

    return str(ort.__version__)
