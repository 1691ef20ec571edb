"""Artefacts of the ``mtd-student`` recipe: FP32 ONNX, ONNX Runtime INT8 QDQ, OpenVINO INT8 IR,
TFLite INT8, and the package's torch module for the inference benchmark.

Every artefact computes the same graph (:func:`mtd_student_nets.student_model`): the teacher
and student networks, the channel mean of their squared difference per cell, the affine map
normalisation and the top-k mean (or maximum) of the map. The convolutions run int8; the
discrepancy arithmetic after them stays float in every INT8 artefact (the differences that
score are small against the features' range: an int8 difference would round most of them away).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # models/recipes
sys.path.insert(0, str(Path(__file__).resolve().parent))

#: Ops of the TFLite graph kept float (named in :func:`tflite_int8`).
TFLITE_FLOAT = ("t_head", "s_head", "t_minus_s", "d2", "cell_mean", "cells", "map_c", "map",
                "top_k", "Identity")


def export(model: Any, size: int, path: Path) -> None:
    """FP32 ONNX (opset 17): input ``image`` (B, 1, S, S) float32, output ``score`` (B,)."""
    import torch  # noqa: PLC0415

    torch.onnx.export(model, (torch.zeros(2, 1, size, size),), str(path), input_names=["image"],
                      output_names=["score"],
                      dynamic_axes={"image": {0: "batch"}, "score": {0: "batch"}},
                      opset_version=17, dynamo=False)


def quantize_ort(fp32: Path, int8: Path, calib: np.ndarray) -> None:
    """ONNX Runtime QDQ INT8: every Conv, per-channel 7-bit weights (``reduce_range``, as
    ``mtd-patchcore``), MinMax activation ranges on ``calib``.

    Tried and not kept (candidate 3's networks, 100 held-out good images, scores median 0.45):
    the two 1x1 projections left float moved |INT8 - FP32| from mean 0.075 / max 0.48 to
    0.069 / 0.49 and the ONNX INT8 file from 0.27 x to 0.32 x the FP32 one."""
    from mtd_padim import quantize  # noqa: PLC0415

    quantize(fp32, int8, calib, head=False, op_types=("Conv",), reduce_range=True)


def openvino_ir(int8_onnx: Path, xml: Path) -> dict[str, str]:
    """OpenVINO INT8 IR: the ONNX Runtime QDQ model converted by ``openvino.convert_model``
    (its Q/DQ pairs become FakeQuantize: the same int8 convolutions, the same calibration)."""
    import openvino as ov  # noqa: PLC0415

    ov.save_model(ov.convert_model(str(int8_onnx)), str(xml), compress_to_fp16=False)
    return {"openvino": ov.__version__,
            "method": "the ONNX Runtime QDQ model converted by openvino.convert_model "
                      "(Q/DQ -> FakeQuantize)"}


def ov_runner(xml: Path, threads: int = 2) -> Any:
    """An OpenVINO session of ``xml`` as a function ``(N, 1, S, S) -> (N,)``."""
    from mtd_patchcore import ov_runner as run  # noqa: PLC0415

    return run(xml, threads)


def torch_model(package_dir: Path) -> Any:
    """The package's FP32 model as a torch module, weights from the FP32 ONNX initializers
    (the inference benchmark's eager baseline)."""
    import onnx  # noqa: PLC0415
    import torch  # noqa: PLC0415
    from mtd_student_nets import pdn, student_model  # noqa: PLC0415
    from onnx import numpy_helper  # noqa: PLC0415

    manifest = json.loads((package_dir / "manifest.json").read_text())
    args = manifest["lineage"]["args"]
    chans = tuple(int(c) for c in args["channels"])
    init = {i.name: numpy_helper.to_array(i) for i in
            onnx.load(str(package_dir / "model.fp32.onnx")).graph.initializer}
    model = student_model(pdn(chans), pdn(chans), 0.0, 1.0, int(args["top_k"]))
    state = {k: torch.from_numpy(np.array(init[k])) for k in model.state_dict()}
    model.load_state_dict(state)
    return model.eval()


def _tf_net(tf: Any, net: Any, name: str) -> Any:
    """``x (B, S, S, 1)`` NHWC -> the PDN's output NHWC, in ``tf.nn`` ops from torch weights;
    the 1x1 projection is named ``name`` (kept float: :data:`TFLITE_FLOAT`)."""

    def conv_list(seq: Any) -> list[tuple[Any, Any, int, int]]:
        return [(tf.constant(c.weight.detach().numpy().transpose(2, 3, 1, 0)),
                 tf.constant(c.bias.detach().numpy()), int(c.stride[0]), int(c.padding[0]))
                for c in seq if hasattr(c, "weight")]

    f16, f32 = conv_list(net.f16), conv_list(net.f32)
    head = conv_list([net.head])[0]

    def run(layers: list[tuple[Any, Any, int, int]], x: Any) -> Any:
        for w, b, st, pad in layers:
            if pad:
                x = tf.pad(x, [[0, 0], [pad, pad], [pad, pad], [0, 0]])
            x = tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(x, w, st, "VALID"), b))
        return x

    def forward(x: Any) -> Any:
        f = run(f16, x)
        g = run(f32, f)
        g = tf.repeat(tf.repeat(g, 2, axis=1), 2, axis=2)  # nearest upsampling x2
        return tf.nn.bias_add(tf.nn.conv2d(tf.concat([f, g], 3), head[0], 1, "VALID"),
                              head[1], name=name)

    return forward


def tflite_int8(teacher: Any, student: Any, qa: float, qb: float, top_k: int, size: int,
                path: Path, calib: np.ndarray) -> dict[str, str]:
    """TFLite INT8 of the same graph, rebuilt with ``tf.nn`` ops from the torch weights (NHWC
    inside; the input stays ``(B, 1, S, S)`` float like the other artefacts). Full-integer PTQ
    (``Optimize.DEFAULT`` with the calibration images as representative dataset; per-channel
    int8 weights) of the convolutions but the two 1x1 projections (their int8 outputs would
    round away the small differences that score: measured on untrained networks, |INT8 - FP32|
    mean 1.23 on scores around 1.2 with the projections int8); the discrepancy arithmetic stays
    float
    (:data:`TFLITE_FLOAT`, TensorFlow's ``QuantizationDebugger`` deny-list: selective
    quantization as documented for TFLite).

    Raises:
        ImportError: TensorFlow is not installed.
    """
    import tensorflow as tf  # noqa: PLC0415

    t_fwd, s_fwd = _tf_net(tf, teacher, "t_head"), _tf_net(tf, student, "s_head")
    g = size // 16

    @tf.function(input_signature=[tf.TensorSpec([None, 1, size, size], tf.float32,
                                                name="image")])  # type: ignore[untyped-decorator]
    def model(image: Any) -> Any:
        x = tf.transpose(image, [0, 2, 3, 1])
        d = tf.subtract(t_fwd(x), s_fwd(x), name="t_minus_s")
        m = tf.reduce_mean(tf.multiply(d, d, name="d2"), axis=3, name="cell_mean")
        m = tf.reshape(m, [-1, g * g], name="cells")
        m = tf.multiply(tf.subtract(m, qa, name="map_c"), 1.0 / (qb - qa), name="map")
        if top_k == 1:
            return tf.reduce_max(m, axis=1)
        return tf.reduce_mean(tf.math.top_k(m, top_k, name="top_k").values, axis=1)

    x = np.ascontiguousarray(calib, dtype=np.float32)
    conv = tf.lite.TFLiteConverter.from_concrete_functions([model.get_concrete_function()],
                                                           model)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = lambda: ([x[i : i + 1]] for i in range(len(x)))
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8,
                                      tf.lite.OpsSet.TFLITE_BUILTINS]
    debugger = tf.lite.experimental.QuantizationDebugger(
        converter=conv, debug_dataset=lambda: iter([[x[:1]]]),
        debug_options=tf.lite.experimental.QuantizationDebugOptions(
            denylisted_nodes=list(TFLITE_FLOAT)))
    path.write_bytes(debugger.get_nondebug_quantized_model())
    return {"tensorflow": str(tf.__version__),
            "method": "tf.nn rebuild of T and S from the torch weights; TFLiteConverter "
                      "full-integer PTQ (per-channel int8 weights): convolutions int8, the "
                      "discrepancy arithmetic float"}
