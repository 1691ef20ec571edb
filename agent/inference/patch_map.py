"""The patch-score map of a PatchCore-style image model, for the heatmap of a snapshot.

An image package's model (``score.aggregation = "max_patch_knn_distance"``, e.g.
``models/mtd-patchcore``) computes, for every feature patch ``p`` of the ``grid`` (rows x cols),
the squared distance to its nearest memory-bank vector and reduces that map to one number, the
image score ``sqrt(max_p d²(p))`` (``models/recipes/mtd_patchcore.py``, ``full_model``; PatchCore:
Roth et al., "Towards Total Recall in Industrial Anomaly Detection", CVPR 2022). The score
artefact only outputs the score. :class:`PatchMapModel` opens the package's verified ONNX
artefact a second time with the map's tensors exposed as extra outputs, and runs it only for
alerting frames (the snapshot worker's thread): the score path, whatever runtime it chose, is
untouched and pays nothing.

Which tensors (found by walking the graph back from the ``score`` output, no names assumed):

* exact search: the input of the final ``ReduceMax`` is ``d²`` of every patch, ``(B, P)``;
* coarse-to-fine search (``TopK`` present): ``TopK``'s input is the coarse ``d²_c`` of every
  patch (nearest of the bank's first vectors: an upper bound of the exact distance), its
  indices output the shortlisted patches and the ``ReduceMax`` input their exact ``d²``; the
  map is ``d²_c`` with the shortlisted patches replaced by their exact value.

The map returned is ``sqrt(max(d², 0))`` (score units, like the threshold), ``float32`` of shape
``grid``. The graph is edited in memory (:mod:`agent.inference.onnx_wire`, without the ``onnx``
package); the file on disk is never changed.

Memory: the session runs without ONNX Runtime's CPU arena and memory patterns (both keep
their peak buffers for the life of the session; the map's outputs are the same bit for bit),
the edited graph is dropped once the session holds it, and the C heap's free pages are given
back to the system (:func:`release_free_heap`) after loading and after each map.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from agent.errors import BackendUnavailable, ModelError
from agent.inference import onnx_wire
from agent.inference.image_package import ImagePackage
from agent.records import Float32Array

#: The score aggregations whose map this module knows how to read: PatchCore-style distances
#: (the map is ``sqrt(max(d², 0))``) and student-teacher discrepancies (``models/mtd-student``:
#: the graph's normalised discrepancy map, already in score units, reduced by ``ReduceMax`` or
#: by the mean of a ``TopK``).
KNN_AGGREGATIONS = ("max_patch_knn_distance",)
DISCREPANCY_AGGREGATIONS = ("max_patch_student_teacher_discrepancy",
                            "topk_mean_student_teacher_discrepancy")
AGGREGATIONS = KNN_AGGREGATIONS + DISCREPANCY_AGGREGATIONS


class PatchMap(Protocol):
    """A model that scores one image and returns its patch map (:class:`PatchMapModel`,
    :class:`agent.inference.patch_map_openvino.OpenVinoPatchMap`)."""

    grid: tuple[int, int]
    label: str

    def run(self, x: Float32Array) -> tuple[float, Float32Array]:
        """``(score, map)`` of one normalised ``float32`` ``(1, C, H, W)`` image."""
        ...


def release_free_heap() -> bool:
    """Give the C heap's free pages back to the system (glibc ``malloc_trim(0)``).

    ONNX Runtime and protobuf free their buffers to glibc's heap, which keeps them mapped: the
    resident size would stay at the peak of loading and of each run.

    Returns:
        True when it was called; False where there is no glibc (nothing done).
    """
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim
    except (OSError, AttributeError, TypeError):
        return False
    trim(0)
    return True


def session_options(ort: Any, threads: int) -> Any:
    """ONNX Runtime ``SessionOptions`` of the patch-map session: ``threads`` intra-op threads,
    one inter-op thread, no CPU memory arena, no memory patterns, warnings off."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    opts.enable_cpu_mem_arena = False
    opts.enable_mem_pattern = False
    return opts


def _onnx_artefact(package: ImagePackage, precision: str) -> Path:
    """The package's ONNX artefact of ``precision`` (else any ONNX artefact)."""
    arts = [a for a in package.manifest.artefacts if a.runtime == "onnxruntime"]
    arts.sort(key=lambda a: a.precision != precision)
    if not arts:
        raise ModelError("the package has no ONNX artefact to read the patch map from",
                         model=package.label)
    return package.path / arts[0].path


def map_outputs(graph: Any, discrepancy: bool = False) -> tuple[str, str | None, str | None]:
    """Names of the tensors holding the patch map: ``(all patches, shortlist indices,
    shortlisted exact)``; the last two are None for an exact search (module docstring) and for
    a student-teacher discrepancy (``discrepancy``: the input of the final ``ReduceMax`` or of
    the ``TopK`` whose values the score averages).

    Raises:
        ModelError: the graph does not end in ``ReduceMax`` (or, with ``discrepancy``, ``TopK``)
            over the patch map.
    """
    producer = {out: node for node in graph.node for out in node.output}
    node = producer.get(graph.output[0].name)
    ends = ("ReduceMax", "TopK") if discrepancy else ("ReduceMax",)
    hops = 0
    while node is not None and node.op_type not in ends and hops < 16:
        node = producer.get(node.input[0]) if node.input else None
        hops += 1
    if node is None or node.op_type not in ends:
        raise ModelError("the model's score is not a ReduceMax over patch distances")
    exact = node.input[0]
    if discrepancy:
        return exact, None, None
    topk = [n for n in graph.node if n.op_type == "TopK"]
    if not topk:
        return exact, None, None
    return topk[0].input[0], topk[0].output[1], exact


class PatchMapModel:
    """The package's model with its patch-score map as an output (see the module docstring).

    Args:
        package: A verified image package (:func:`agent.inference.image_package.
            load_image_package`).
        precision: Which ONNX artefact to prefer (``int8`` or ``fp32``).
        threads: ONNX Runtime intra-op threads.

    Raises:
        BackendUnavailable: ``onnxruntime`` is not installed.
        ModelError: no ONNX artefact, a score not of a known aggregation, or a graph whose map
            cannot be found or run.
    """

    def __init__(self, package: ImagePackage, precision: str = "int8", threads: int = 1) -> None:
        score = package.manifest.score
        if score.aggregation not in AGGREGATIONS:
            raise ModelError(f"no patch map for score aggregation {score.aggregation!r}",
                             model=package.label)
        try:
            import onnxruntime as ort  # noqa: PLC0415 - lazy: only for snapshots' heatmaps
        except ImportError as exc:
            raise BackendUnavailable(
                "the heatmap needs onnxruntime: pip install 'edge-anomaly-agent[camera]'",
                model=package.label) from exc

        path = _onnx_artefact(package, precision)
        try:
            graph = path.read_bytes()
        except OSError as exc:
            raise ModelError(f"cannot read {path}: {exc}", model=package.label) from exc
        self._root = score.aggregation in KNN_AGGREGATIONS
        parsed = onnx_wire.read_graph(graph)
        names = map_outputs(parsed, discrepancy=not self._root)
        self._outputs = [parsed.output[0].name] + [n for n in names if n is not None]
        del parsed
        graph = onnx_wire.with_outputs(graph, self._outputs[1:])
        try:
            self._session = ort.InferenceSession(graph, sess_options=session_options(ort, threads),
                                                 providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own untyped errors
            raise ModelError(f"cannot load the patch-map model: {exc}",
                             model=package.label) from exc
        finally:
            del graph
            release_free_heap()
        self._input = self._session.get_inputs()[0].name
        self.grid = (int(score.grid[0]), int(score.grid[1]))
        self.label = package.label

    def run(self, x: Float32Array) -> tuple[float, Float32Array]:
        """Score one normalised image and return its patch map.

        Args:
            x: ``float32`` ``(1, C, H, W)`` (:func:`agent.pipeline.image.normalise`).

        Returns:
            ``(score, map)``: the model's score and the ``float32`` map of shape ``grid``
            (score units).

        Raises:
            ModelError: the runtime failed, or the map does not have ``rows x cols`` patches.
        """
        try:
            outs = self._session.run(self._outputs, {self._input: x})
        except Exception as exc:
            raise ModelError(f"patch-map inference failed: {exc}", model=self.label) from exc
        finally:
            release_free_heap()
        return (float(np.asarray(outs[0]).reshape(-1)[0]),
                assemble_map(outs[1:], self.grid, root=self._root))


def assemble_map(outs: list[Any], grid: tuple[int, int], root: bool = True) -> Float32Array:
    """The ``grid``-shaped map from the exposed tensors (first image of the batch).

    Args:
        outs: ``[d² (B, P)]`` or ``[d²_c (B, P), indices (B, K), exact d² (B, K)]``.
        grid: ``(rows, cols)`` with ``rows x cols == P`` (a square grid is assumed if not).
        root: ``sqrt(max(map, 0))`` (squared distances); False: the map as it is (a
            student-teacher discrepancy map, already in score units).

    Raises:
        ModelError: ``P`` fits neither ``grid`` nor a square.

    >>> assemble_map([np.array([[4.0, 9.0, 1.0, 16.0]]), np.array([[3]]), np.array([[0.0]])],
    ...              (2, 2)).tolist()
    [[2.0, 3.0], [1.0, 0.0]]
    """
    full = np.array(outs[0], dtype=np.float32).reshape(np.shape(outs[0])[0], -1)[:1].copy()
    if len(outs) == 3:
        idx = np.asarray(outs[1]).astype(np.int64).reshape(full.shape[0], -1)[:1]
        exact = np.asarray(outs[2], dtype=np.float32).reshape(full.shape[0], -1)[:1]
        np.put_along_axis(full, idx, exact, axis=1)
    n = full.shape[1]
    rows, cols = grid
    if rows * cols != n:
        side = math.isqrt(n)
        if side * side != n:
            raise ModelError(f"patch map of {n} patches does not fit the grid {grid}")
        rows = cols = side
    cells = np.sqrt(np.maximum(full[0], 0.0)) if root else full[0]
    out: npt.NDArray[np.float32] = cells.reshape(rows, cols)
    return out.astype(np.float32)
