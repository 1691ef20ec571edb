"""The patch-score map read from the package's OpenVINO IR, for a stream scored by OpenVINO.

:class:`agent.inference.patch_map.PatchMapModel` opens the package's ONNX artefact in ONNX
Runtime. A stream whose score already runs on OpenVINO would load a second runtime for its
heatmaps: about 64 MB of resident memory for `mtd-patchcore` (the ``onnxruntime`` library, the
FP32 graph and its buffers; measured with ``VmRSS``), where a second compiled OpenVINO model of
the INT8 IR costs about 27 MB. :class:`OpenVinoPatchMap` reads the IR (verified with the
package), exposes the same tensors as extra outputs (``ov.Model.add_outputs``) and compiles it
once, for one inference thread, on the first alert of the package's streams.

The tensors are found as in :func:`agent.inference.patch_map.map_outputs`, walking back from
the ``score`` result through element-wise nodes to the final ``ReduceMax`` (or, for a
student-teacher discrepancy, ``TopK``), and for a coarse-to-fine search taking ``TopK``'s input
and indices. The map is the INT8 model's: the cells of the patch that raised the score agree
with the score the alert carries, which the FP32 map of the ONNX path does only approximately.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from agent.errors import BackendUnavailable, ModelError
from agent.inference.image_package import ImagePackage
from agent.inference.patch_map import AGGREGATIONS, KNN_AGGREGATIONS, assemble_map
from agent.records import Float32Array

#: Nodes walked through from the score result back to the map's reduction (element-wise).
_PASS_THROUGH = ("Sqrt", "Clamp", "Convert", "Reshape", "Squeeze", "Unsqueeze", "Multiply",
                 "Add", "Result", "Relu", "Maximum", "Minimum", "FakeQuantize")
#: How many nodes the walk may pass before giving up.
_MAX_HOPS = 16


def _ir_paths(package: ImagePackage) -> tuple[str, str]:
    """``(xml, bin)`` paths of the package's OpenVINO IR.

    Raises:
        ModelError: the package has no OpenVINO IR.
    """
    arts = [a for a in package.manifest.artefacts if a.runtime == "openvino"]
    xml = [a for a in arts if a.path.endswith(".xml")]
    weights = [a for a in arts if a.path.endswith(".bin")]
    if not xml:
        raise ModelError("the package has no OpenVINO IR to read the patch map from",
                         model=package.label)
    xml_path = package.path / xml[0].path
    bin_path = (package.path / weights[0].path if weights
                else xml_path.with_suffix(".bin"))
    return str(xml_path), str(bin_path)


def map_nodes(model: Any, discrepancy: bool = False) -> list[Any]:
    """The output ports holding the patch map: ``[all patches]`` or ``[coarse d² of all
    patches, shortlist indices, shortlisted exact d²]`` (as
    :func:`agent.inference.patch_map.map_outputs`, on an ``openvino.Model``).

    Raises:
        ModelError: the score is not a ``ReduceMax`` (or ``TopK`` with ``discrepancy``) over a
            patch map.
    """
    ends = ("ReduceMax", "TopK") if discrepancy else ("ReduceMax",)
    node = model.outputs[0].get_node()
    hops = 0
    while node.get_type_name() not in ends and hops < _MAX_HOPS:
        if node.get_type_name() not in _PASS_THROUGH or node.get_input_size() == 0:
            break
        node = node.input(0).get_source_output().get_node()
        hops += 1
    if node.get_type_name() not in ends:
        raise ModelError("the model's score is not a ReduceMax over patch distances")
    exact = node.input(0).get_source_output()
    if discrepancy:
        return [exact]
    topk = [op for op in model.get_ordered_ops() if op.get_type_name() == "TopK"]
    if not topk:
        return [exact]
    return [topk[0].input(0).get_source_output(), topk[0].output(1), exact]


class OpenVinoPatchMap:
    """The package's OpenVINO IR with its patch-score map as extra outputs.

    Args:
        package: A verified image package with an OpenVINO IR artefact.
        threads: OpenVINO inference threads (CPU).

    Raises:
        BackendUnavailable: ``openvino`` is not installed.
        ModelError: no IR, a score not of a known aggregation, or a graph whose map cannot be
            found or compiled.
    """

    def __init__(self, package: ImagePackage, threads: int = 1) -> None:
        score = package.manifest.score
        if score.aggregation not in AGGREGATIONS:
            raise ModelError(f"no patch map for score aggregation {score.aggregation!r}",
                             model=package.label)
        try:
            import openvino as ov  # noqa: PLC0415 - only where the stream runs on OpenVINO
        except ImportError as exc:
            raise BackendUnavailable("the OpenVINO heatmap needs openvino",
                                     model=package.label) from exc
        xml, weights = _ir_paths(package)
        self._root = score.aggregation in KNN_AGGREGATIONS
        try:
            core = ov.Core()
            model = core.read_model(xml, weights)
            ports = map_nodes(model, discrepancy=not self._root)
            model.add_outputs(ports)
            self._compiled = core.compile_model(
                model, "CPU", {"INFERENCE_NUM_THREADS": max(1, threads),
                               "INFERENCE_PRECISION_HINT": "f32", "NUM_STREAMS": 1})
        except ModelError:
            raise
        except Exception as exc:  # OpenVINO raises its own untyped errors
            raise ModelError(f"cannot load the OpenVINO patch-map model: {exc}",
                             model=package.label) from exc
        del model
        self._request = self._compiled.create_infer_request()
        self.grid = (int(score.grid[0]), int(score.grid[1]))
        self.label = package.label

    def run(self, x: Float32Array) -> tuple[float, Float32Array]:
        """Score one normalised image and return its patch map.

        Args:
            x: ``float32`` ``(1, C, H, W)`` (:func:`agent.pipeline.image.normalise`).

        Returns:
            ``(score, map)``: the INT8 model's score and the ``float32`` map of shape ``grid``
            (score units).

        Raises:
            ModelError: the runtime failed, or the map does not have ``rows x cols`` patches.
        """
        try:
            res = self._request.infer({0: x})
            outs = [np.array(res[o]) for o in self._compiled.outputs]
        except Exception as exc:
            raise ModelError(f"patch-map inference failed: {exc}", model=self.label) from exc
        return float(outs[0].reshape(-1)[0]), assemble_map(outs[1:], self.grid, root=self._root)
