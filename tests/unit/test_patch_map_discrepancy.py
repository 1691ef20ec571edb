"""The patch map of a student-teacher discrepancy model (``models/mtd-student``'s score graph):
found before the final ``ReduceMax`` or ``TopK`` + ``ReduceMean``, returned in score units."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent.errors import ModelError
from agent.inference.patch_map import AGGREGATIONS, assemble_map, map_outputs

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
helper = onnx.helper


def _graph(reduce: str) -> Any:
    """``image (B, 1, 4, 4)`` -> map ``(image - 0.5) * 2`` flattened to ``(B, 16)`` -> score:
    the map's maximum, or the mean of its 3 largest cells (``topk``)."""
    nodes = [helper.make_node("Flatten", ["image"], ["flat"], axis=1),
             helper.make_node("Sub", ["flat", "qa"], ["map_c"]),
             helper.make_node("Mul", ["map_c", "inv"], ["map"])]
    inits = [helper.make_tensor("qa", onnx.TensorProto.FLOAT, [], [0.5]),
             helper.make_tensor("inv", onnx.TensorProto.FLOAT, [], [2.0])]
    if reduce == "max":
        nodes.append(helper.make_node("ReduceMax", ["map"], ["score"], axes=[1], keepdims=0))
    else:
        inits.append(helper.make_tensor("k", onnx.TensorProto.INT64, [1], [3]))
        nodes += [helper.make_node("TopK", ["map", "k"], ["vals", "idx"], axis=1),
                  helper.make_node("ReduceMean", ["vals"], ["score"], axes=[1], keepdims=0)]
    g = helper.make_graph(
        nodes, "st", [helper.make_tensor_value_info("image", onnx.TensorProto.FLOAT,
                                                    ["B", 1, 4, 4])],
        [helper.make_tensor_value_info("score", onnx.TensorProto.FLOAT, ["B"])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # opset 17 needs IR 8; onnxruntime on Python 3.10 reads up to 11
    return model


@pytest.mark.parametrize("reduce", ["max", "topk"])
def test_discrepancy_map_is_the_reduced_tensor_in_score_units(reduce: str,
                                                              tmp_path: Path) -> None:
    model = _graph(reduce)
    names = map_outputs(model.graph, discrepancy=True)
    assert names == ("map", None, None)
    model.graph.output.append(helper.make_empty_tensor_value_info("map"))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.linspace(0.0, 1.0, 16, dtype=np.float32).reshape(1, 1, 4, 4)
    score, cells = sess.run(["score", "map"], {"image": x})
    m = assemble_map([cells], (4, 4), root=False)
    assert m.shape == (4, 4) and m.dtype == np.float32
    assert float(m.min()) == pytest.approx(-1.0)  # negative cells kept, no square root
    want = m.max() if reduce == "max" else np.sort(m.ravel())[-3:].mean()
    assert float(score[0]) == pytest.approx(float(want), abs=1e-6)


def test_knn_reading_refuses_a_topk_mean_score() -> None:
    with pytest.raises(ModelError, match="ReduceMax"):
        map_outputs(_graph("topk").graph)


def test_both_discrepancy_aggregations_are_known() -> None:
    assert {"max_patch_student_teacher_discrepancy",
            "topk_mean_student_teacher_discrepancy"} <= set(AGGREGATIONS)
