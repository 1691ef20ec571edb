"""The INT8 window-statistics model of one (W, floor) point, built exactly as the package is.

Shared by the package recipe (:mod:`skab_wstat`) and the grouped selection (:mod:`skab_select`),
so the selection rates the detector the agent runs: the INT8 QDQ graph, the feature floors the
package ships, and the FP32 fallback for windows outside the INT8 input range
(:class:`agent.pipeline.detector.FeatureDeviationDetector`).

Steps (normal operation only, no labels):

1. Emulate on-device calibration on many 400-sample segments of the anomaly-free recording
   (:func:`fleet.training.wstat.scaled_windows`: start every 100 rows, 1,000 rows each).
2. Input scale floor = ``floor_frac`` × the recording's std per channel; feature std floor =
   ``feature_floor_frac`` × each feature's std over those segments.
3. FP32 graph (:func:`fleet.training.wstat.build_graph`), INT8 QDQ quantization on
   ``quant_windows`` of those windows drawn with ``seed`` (MinMax, per tensor).
4. The shipped feature floor is max(step 2's, the feature's INT8 output step)
   (:func:`fleet.training.wstat.quantization_floor`): one per-tensor scale covers all 8
   channels' mean absolute deviations, and a feature whose normal spread is a few steps would
   otherwise be a different detector in INT8 than in FP32.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cloud_sync.calibration import window_features
from fleet.training.wstat import (
    DEFAULT_OP_TYPES,
    build_graph,
    feature_steps,
    int8_input_range,
    quantization_floor,
    quantize_int8,
    scaled_windows,
    session_runner,
)

FloatArray = npt.NDArray[np.float64]
Float32Array = npt.NDArray[np.float32]
#: Scaled windows ``(B, W, C)`` float32 -> features ``(B, 3·C)``.
FeatureFn = Callable[[Float32Array], npt.NDArray[np.floating]]


@dataclass(frozen=True)
class Int8Build:
    """One built model.

    Attributes:
        fp32_path, int8_path: The ONNX graphs.
        floor: ``(C,)`` input scale floor, channel units.
        fraction_floor: ``(3·C,)`` feature std floor of step 2 (scaled units).
        steps: ``(3·C,)`` INT8 output step per feature.
        feature_floor: ``(3·C,)`` the shipped feature std floor (step 4).
        windows: ``(K, W, C)`` float32, the emulated calibrations' scaled windows.
        quant_sample: ``(quant_windows, W, C)`` the quantization windows.
        rng: The generator after drawing ``quant_sample`` (the recipe draws its check windows
            from it).
    """

    fp32_path: Path
    int8_path: Path
    floor: FloatArray
    fraction_floor: FloatArray
    steps: FloatArray
    feature_floor: FloatArray
    windows: Float32Array
    quant_sample: Float32Array
    rng: np.random.Generator


def build_int8(normal: FloatArray, window: int, floor_frac: float, feature_floor_frac: float,
               out_dir: Path, *, calibration_samples: int = 400, quant_windows: int = 4000,
               seed: int = 0, method: str = "minmax", percentile: float = 99.99,
               op_types: Sequence[str] = DEFAULT_OP_TYPES) -> Int8Build:
    """Steps 1-4 of the module docstring for ``normal`` ``(T, C)`` (channel units).

    Writes ``model.fp32.onnx`` and ``model.int8.onnx`` into ``out_dir`` (created).

    Raises:
        ValueError: too few rows for ``quant_windows`` windows, or a bad quantization method.
    """
    floor = floor_frac * normal.std(0)
    windows, feats = scaled_windows(normal, window, calibration_samples, floor, step=100,
                                    span=calibration_samples + 600)
    if windows.shape[0] < quant_windows:
        raise ValueError(f"{windows.shape[0]} emulated windows < {quant_windows} needed")
    fraction_floor = feature_floor_frac * feats.std(0).astype(np.float64)
    out_dir.mkdir(parents=True, exist_ok=True)
    fp32_path, int8_path = out_dir / "model.fp32.onnx", out_dir / "model.int8.onnx"
    import onnx  # noqa: PLC0415 - the train extra

    onnx.save(build_graph(window, normal.shape[1]), fp32_path)
    rng = np.random.default_rng(seed)
    quant_sample = windows[rng.choice(windows.shape[0], quant_windows, replace=False)]
    quantize_int8(fp32_path, int8_path, quant_sample, method=method, percentile=percentile,
                  op_types=op_types)
    steps = feature_steps(int8_path, normal.shape[1])
    return Int8Build(fp32_path, int8_path, floor, fraction_floor, steps,
                     quantization_floor(fraction_floor, steps), windows, quant_sample, rng)


def int8_features(build: Int8Build) -> FeatureFn:
    """The agent's INT8 path as a function: the INT8 graph, and the FP32 graph for a window
    holding a value outside the INT8 input range (as the detector's saturation fallback)."""
    int8, fp32 = session_runner(build.int8_path), session_runner(build.fp32_path)
    rng = int8_input_range(build.int8_path, "onnxruntime")

    def run(x: Float32Array) -> FloatArray:
        feats = np.asarray(int8(x), np.float64)
        if rng is not None and len(x):
            outside = ((x < rng[0]) | (x > rng[1])).any(axis=(1, 2))
            if outside.any():
                feats[outside] = np.asarray(fp32(x[outside]), np.float64)
        return feats

    return run


def fp32_features(x: Float32Array) -> Float32Array:
    """The FP32 reference (:func:`cloud_sync.calibration.window_features`)."""
    return window_features(x)
