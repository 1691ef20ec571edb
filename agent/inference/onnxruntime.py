"""ONNX Runtime backend (CPU execution provider): runs the FP32 and the QDQ INT8 ONNX artefacts.

ONNX Runtime is a core dependency (``install_requires``); the other runtimes are extras.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agent.errors import BackendUnavailable, ModelError
from agent.inference.base import install_hint
from agent.records import Float32Array

KIND = "onnxruntime"


@dataclass(frozen=True, slots=True)
class OnnxRuntimeConfig:
    """Settings of the ONNX Runtime backend.

    Attributes:
        threads: Threads inside one operator (``intra_op_num_threads``); 1 suits small models on
            a busy gateway. ``inter_op_num_threads`` is always 1 (the graphs are sequential).
    """

    threads: int = 1


class OnnxRuntimeBackend:
    """Run an ONNX artefact with ONNX Runtime on the CPU.

    Args:
        path: The ``.onnx`` file.
        precision: ``int8`` or ``fp32`` (as the manifest says).
        config: Thread settings.

    Raises:
        BackendUnavailable: onnxruntime is not installed.
        ModelError: the file cannot be loaded.
    """

    name = KIND

    def __init__(
        self, path: Path, precision: str, config: OnnxRuntimeConfig | None = None
    ) -> None:
        cfg = config or OnnxRuntimeConfig()
        try:
            import onnxruntime as ort  # noqa: PLC0415 - lazy: a runtime loads only when used
        except ImportError as exc:
            raise BackendUnavailable(
                f"onnxruntime is not installed: {install_hint(KIND)}", path=path
            ) from exc
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = cfg.threads
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
        self.threads = cfg.threads

    def run(self, windows: Float32Array) -> Float32Array:
        """Run on ``windows`` (``(B, W, C)`` or ``(B, H, W, Ch)`` float32); ``(B, F)`` float32.

        Thread-safe (ONNX Runtime sessions may run concurrently).
        """
        try:
            out = self._session.run([self._output], {self._input: windows})[0]
        except Exception as exc:
            raise ModelError(f"inference failed: {exc}", path=self.path) from exc
        return np.asarray(out, dtype=np.float32)
