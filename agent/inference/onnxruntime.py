"""ONNX Runtime backend (CPU execution provider): runs the FP32 and the QDQ INT8 ONNX artefacts.

ONNX Runtime is a core dependency (``install_requires``); the other runtimes are extras.

INT8 on x86 CPUs with AVX2 but no VNNI (many gateway CPUs): ONNX Runtime's default U8S8 kernel
multiplies with ``vpmaddubsw``, which adds two u8 x s8 products into a saturating int16, so
activations near 255 times weights near 127 overflow (``255 * 127 * 2 > 32767``) and the
result is silently wrong (the shipped ``mtd-patchcore`` INT8 file scored 23.3/34.3/21.4 instead
of about 18.4 and failed its golden check on every runtime). The session therefore sets
``session.x64quantprecision = 1`` (ONNX Runtime's ``kOrtSessionOptionsAvx2PrecisionMode``):
the exact, somewhat slower kernel on such CPUs (83 vs 66 ms per image there), no change where
VNNI exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agent.errors import BackendUnavailable, ModelError
from agent.inference.base import install_hint
from agent.records import Float32Array

KIND = "onnxruntime"
#: ONNX Runtime session option: exact (non-saturating) U8S8 MatMul/Conv kernels on AVX2 CPUs.
AVX2_PRECISION_KEY = "session.x64quantprecision"


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
        try:
            # exact U8S8 products on AVX2 without VNNI (see the module docstring); ONNX Runtime
            # 1.32 refuses some graphs with it (a weight shared by two nodes: "Attempt to
            # replace the existing tensor"), which then load with the default kernels, their
            # INT8 results still checked by the package's golden vectors
            self._session: Any = self._open(ort, path, cfg, exact_u8s8=True)
        except Exception:  # onnxruntime raises its own untyped errors
            try:
                self._session = self._open(ort, path, cfg, exact_u8s8=False)
            except Exception as exc:
                raise ModelError(f"cannot load ONNX model: {exc}", path=path) from exc
        self._input = self._session.get_inputs()[0].name
        self._output = self._session.get_outputs()[0].name
        self.precision = precision
        self.path = path
        self.threads = cfg.threads

    @staticmethod
    def _open(ort: Any, path: Path, cfg: OnnxRuntimeConfig, *, exact_u8s8: bool) -> Any:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = cfg.threads
        opts.inter_op_num_threads = 1
        # the first try is silent: its failure is retried, the retry's error is reported
        opts.log_severity_level = 4 if exact_u8s8 else 3
        if exact_u8s8:
            opts.add_session_config_entry(AVX2_PRECISION_KEY, "1")
        return ort.InferenceSession(str(path), sess_options=opts,
                                    providers=["CPUExecutionProvider"])

    def run(self, windows: Float32Array) -> Float32Array:
        """Run on ``windows`` (``(B, W, C)`` or ``(B, H, W, Ch)`` float32); ``(B, F)`` float32.

        Thread-safe (ONNX Runtime sessions may run concurrently).
        """
        session = self._session
        if session is None:
            raise ModelError("inference failed: the backend is closed", path=self.path)
        try:
            out = session.run([self._output], {self._input: windows})[0]
        except Exception as exc:
            raise ModelError(f"inference failed: {exc}", path=self.path) from exc
        return np.asarray(out, dtype=np.float32)

    def share(self) -> OnnxRuntimeBackend:
        """Another handle on this session (camera streams on one model share one session:
        :func:`agent.inference.image_select.open_image_backend`).

        ``InferenceSession.run`` may be called from several threads at once, so the handles
        need no lock. Closing a handle drops its reference only; the session is freed with
        the last one.

        Raises:
            ModelError: this handle is closed.
        """
        if self._session is None:
            raise ModelError("cannot share: the backend is closed", path=self.path)
        other = object.__new__(OnnxRuntimeBackend)
        other.__dict__.update(self.__dict__)
        return other

    def close(self) -> None:
        """Drop the session (ONNX Runtime joins its thread pool as the session is freed)."""
        self._session = None
