"""Artefacts for the other runtimes, from the same training: OpenVINO IR and TFLite INT8.

* OpenVINO IR: ``ov.convert_model`` of the QDQ INT8 ONNX file keeps its QuantizeLinear/
  DequantizeLinear pairs as FakeQuantize operations, so the IR runs as INT8 on the CPU plugin;
  ``ov.save_model(..., compress_to_fp16=False)`` writes ``.xml`` + ``.bin`` (both listed in the
  manifest so both are hash-checked). Needs the ``openvino`` extra.
* TFLite INT8: the window-statistics model written in TensorFlow (reduce_mean/abs/sub/concat,
  the same features as :func:`cloud_sync.calibration.window_features`) and converted with the
  TFLite converter's full-integer post-training quantization (``Optimize.DEFAULT``, a
  representative dataset, ``TFLITE_BUILTINS_INT8``; float32 input and output so the agent feeds
  and reads float). Needs TensorFlow (the ``tflite`` extra, about 2 GB: build machines only).

Each exporter raises ``ImportError`` when its library is missing; the recipe says so and skips.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt


def export_openvino_ir(onnx_path: Path, xml_path: Path) -> tuple[Path, Path]:
    """Convert an ONNX file to OpenVINO IR.

    Returns:
        The ``.xml`` and ``.bin`` paths written.

    Raises:
        ImportError: openvino is not installed.
    """
    import openvino as ov  # noqa: PLC0415 - optional, build time only

    model = ov.convert_model(str(onnx_path))
    ov.save_model(model, str(xml_path), compress_to_fp16=False)
    return xml_path, xml_path.with_suffix(".bin")


def export_tflite_int8(
    window: int,
    channels: int,
    calibration_windows: npt.NDArray[np.float32],
    out_path: Path,
) -> Path:
    """Build the window-statistics model in TensorFlow and write a full-integer INT8 TFLite file.

    Args:
        window: W.
        channels: C.
        calibration_windows: Shape ``(K, W, C)`` float32 scaled windows (the representative
            dataset: one window per step, as the TFLite converter documents).
        out_path: The ``.tflite`` file to write.

    Returns:
        ``out_path``. Input ``(B, W, C)`` float32, output ``(B, 3C)`` float32.

    Raises:
        ImportError: TensorFlow is not installed.
    """
    import tensorflow as tf  # noqa: PLC0415 - optional, build time only

    spec = tf.TensorSpec([None, window, channels], tf.float32, name="window")

    @tf.function(input_signature=[spec])  # type: ignore[untyped-decorator]
    def features(x: Any) -> Any:
        mean = tf.reduce_mean(x, axis=1)
        mad = tf.reduce_mean(tf.abs(x - mean[:, None, :]), axis=1)
        delta = tf.reduce_mean(tf.abs(x[:, 1:, :] - x[:, :-1, :]), axis=1)
        return tf.concat([mean, mad, delta], axis=1)

    def representative() -> Iterator[list[npt.NDArray[np.float32]]]:
        for i in range(calibration_windows.shape[0]):
            yield [calibration_windows[i : i + 1]]

    conv = tf.lite.TFLiteConverter.from_concrete_functions(
        [features.get_concrete_function()], features
    )
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = representative
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    out_path.write_bytes(conv.convert())
    return out_path


def tf_version() -> str:
    """The installed TensorFlow version (for lineage)."""
    import tensorflow as tf  # noqa: PLC0415

    return str(tf.__version__)


def ov_version() -> str:
    """The installed OpenVINO version (for lineage)."""
    import openvino as ov  # noqa: PLC0415

    return str(ov.get_version())
