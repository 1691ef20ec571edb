"""ONNX Runtime INT8 is exact where the AVX2 U8S8 kernel would saturate (no VNNI).

A one-MatMul QDQ graph whose u8 activations (255) times s8 weights (127) overflow the int16
pair sums of ``vpmaddubsw``: without ``session.x64quantprecision`` an AVX2 CPU without VNNI
returned 32.5 instead of 64 (the shipped image model failed its golden check that way).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from agent.inference.onnxruntime import OnnxRuntimeBackend

onnx = pytest.importorskip("onnx")

K, N = 64, 8


def _qdq_matmul(path: Path) -> None:
    from onnx import TensorProto, helper, numpy_helper  # noqa: PLC0415

    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
        helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"]),
        helper.make_node("MatMul", ["xd", "wd"], ["y"]),
        helper.make_node("QuantizeLinear", ["y", "ys", "yz"], ["yq"]),
        helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["out"]),
    ]
    inits = [
        numpy_helper.from_array(np.array(1 / 255, np.float32), "xs"),
        numpy_helper.from_array(np.array(0, np.uint8), "xz"),
        numpy_helper.from_array(np.full((K, N), 127, np.int8), "wq"),
        numpy_helper.from_array(np.array(1 / 127, np.float32), "ws"),
        numpy_helper.from_array(np.array(0, np.int8), "wz"),
        numpy_helper.from_array(np.array(0.5, np.float32), "ys"),
        numpy_helper.from_array(np.array(0, np.uint8), "yz"),
    ]
    graph = helper.make_graph(
        nodes, "qdq_matmul", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, K])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, N])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))


def test_int8_matmul_does_not_saturate(tmp_path: Path) -> None:
    path = tmp_path / "q.onnx"
    _qdq_matmul(path)
    backend = OnnxRuntimeBackend(path, "int8")
    out = backend.run(np.ones((1, K), np.float32))
    # x = 1.0 -> 255 (u8), w = 127 (s8) -> 1.0: the exact sum is K = 64
    np.testing.assert_allclose(out, np.full((1, N), float(K)), atol=0.5)


def test_a_graph_refused_with_the_exact_kernels_still_loads() -> None:
    # ONNX Runtime 1.32 refuses the shipped skab-wstat INT8 graph with
    # session.x64quantprecision on an AVX2 CPU without VNNI ("Attempt to replace the existing
    # tensor"); the backend loads it with the default kernels and the golden check decides
    from agent.inference.package import check_golden, load_package  # noqa: PLC0415

    pkg = load_package(Path(__file__).resolve().parents[2] / "models" / "skab-wstat")
    art = next(a for a in pkg.manifest.artefacts
               if a.runtime == "onnxruntime" and a.precision == "int8")
    check_golden(pkg, OnnxRuntimeBackend(pkg.path / art.path, "int8"))
