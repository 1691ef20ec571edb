"""ONNX Runtime backend (CPU execution provider)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from agent.errors import BackendUnavailable, ModelError
from agent.records import Float32Array

KIND = "onnxruntime"


class OnnxRuntimeBackend:
    """Run an ONNX artefact with ONNX Runtime on the CPU.

    Args:
        path: The ``.onnx`` file.
        precision: ``int8`` or ``fp32`` (as the manifest says).
        intra_op_threads: Threads inside one operator; 1 suits small models on a busy gateway.

    Raises:
        BackendUnavailable: onnxruntime is not installed.
        ModelError: the file cannot be loaded.
    """

    name = KIND

    def __init__(self, path: Path, precision: str, intra_op_threads: int = 1) -> None:
        try:
            import onnxruntime as ort  # noqa: PLC0415 - lazy: a runtime loads only when used
        except ImportError as exc:
            raise BackendUnavailable(
                "onnxruntime is not installed: pip install onnxruntime", path=path
            ) from exc
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = intra_op_threads
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        try:
            self._session = ort.InferenceSession(
                str(path), sess_options=opts, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # onnxruntime raises its own untyped errors
            raise ModelError(f"cannot load ONNX model: {exc}", path=path) from exc
        self._input = self._session.get_inputs()[0].name
        self._output = self._session.get_outputs()[0].name
        self.precision = precision
        self.path = path

    def run(self, windows: Float32Array) -> Float32Array:
        """Run on ``windows`` (``(B, W, C)`` float32) and return ``(B, F)`` float32."""
        try:
            out = self._session.run([self._output], {self._input: windows})[0]
        except Exception as exc:
            raise ModelError(f"inference failed: {exc}", path=self.path) from exc
        return np.asarray(out, dtype=np.float32)
