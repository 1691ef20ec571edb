"""The TFLite step of the image recipe (models/recipes/mtd_tflite.py).

The graph helpers run everywhere (onnx is a test dependency); the conversion itself needs
TensorFlow, onnx2tf and onnxsim (extra ``tflite-image``, never installed in CI) and is skipped
without them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "models" / "recipes"))

import mtd_tflite  # noqa: E402


def _graph(shortlist: int) -> Any:
    """A tiny graph shaped like ``mtd_patchcore.full_model``'s export: a /features/ part, the
    bank tensors as initializers and the TopK size as a Constant node."""
    rng = np.random.default_rng(0)
    c, n = 3, 5
    inits = [numpy_helper.from_array(rng.normal(size=s).astype(np.float32), name)
             for name, s in (("bank_mu", (c,)), ("bank_w", (c, n)), ("bank_sq", (n,)),
                             ("coarse_w", (c, 2)), ("coarse_sq", (2,)))]
    nodes = [helper.make_node("Relu", ["image"], ["/features/a"], name="/features/Relu"),
             helper.make_node("Relu", ["/features/a"], ["/features/out"], name="/features/R2"),
             helper.make_node("Shape", ["/features/out"], ["shape"], name="/Shape"),
             helper.make_node("Constant", [], ["k"], name="/Constant",
                              value=numpy_helper.from_array(np.array([shortlist], np.int64))),
             helper.make_node("Cast", ["shape"], ["v"], name="/Cast", to=TensorProto.FLOAT),
             helper.make_node("TopK", ["v", "k"], ["vals", "idx"], name="/TopK")]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("image", TensorProto.FLOAT,
                                                                     [1, 1, 4, 4])],
                          [helper.make_tensor_value_info("vals", TensorProto.FLOAT, None)],
                          initializer=inits)
    return helper.make_model(g)


def test_features_output_is_the_tensor_leaving_features() -> None:
    assert mtd_tflite.features_output(_graph(2)) == "/features/out"


def test_features_output_refuses_a_graph_without_one() -> None:
    m = _graph(2)
    for node in m.graph.node:
        node.name = node.name.replace("/features/", "/f/")
    with pytest.raises(ValueError, match="one feature tensor"):
        mtd_tflite.features_output(m)


def test_head_constants_read_initializers_and_the_constant_topk_size() -> None:
    consts, k = mtd_tflite.head_constants(_graph(2))
    assert k == 2
    assert {n: v.shape for n, v in consts.items()} == {
        "bank_mu": (3,), "bank_w": (3, 5), "bank_sq": (5,), "coarse_w": (3, 2),
        "coarse_sq": (2,)}
    assert all(v.dtype == np.float32 for v in consts.values())


def test_head_constants_exact_search_has_no_shortlist() -> None:
    m = _graph(2)
    keep = [n for n in m.graph.node if n.op_type not in ("TopK", "Constant")]
    del m.graph.node[:]
    m.graph.node.extend(keep)
    consts, k = mtd_tflite.head_constants(m)
    assert k == 0
    assert set(consts) == {"bank_mu", "bank_w", "bank_sq"}


def test_tflite_int8_reproduces_the_golden_scores(tmp_path: Path) -> None:
    """Needs TensorFlow + onnx2tf + onnxsim + ai-edge-litert (about a minute)."""
    for mod in ("tensorflow", "onnx2tf", "onnxsim", "ai_edge_litert"):
        pytest.importorskip(mod)
    from agent.inference.litert import LiteRtBackend  # noqa: PLC0415

    package = ROOT / "models" / "mtd-patchcore"
    manifest = json.loads((package / "manifest.json").read_text())
    golden = np.load(package / "golden.npy").astype(np.float32)
    out = tmp_path / "model.int8.tflite"
    tools = mtd_tflite.tflite_int8(package, out, golden)
    assert {"tensorflow", "onnx2tf", "onnxsim"} <= set(tools)
    got = LiteRtBackend(out, "int8").run(golden).reshape(-1)  # all golden images in one call
    want = np.asarray(manifest["golden"]["outputs"])
    assert np.abs(got - want).max() <= manifest["golden"]["atol"]
