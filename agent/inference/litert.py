"""LiteRT (TensorFlow Lite) backend: runs ``.tflite`` artefacts with the LiteRT interpreter.

The interpreter comes from ``ai-edge-litert`` (the ``litert`` extra: ``pip install
'edge-anomaly-agent[litert]'``); the older ``tflite-runtime`` package is accepted as a fallback
where it works. tflite-runtime ≤ 2.14 (its last release) was built against NumPy 1 and fails to
import under NumPy 2 (``ImportError``/``AttributeError: _ARRAY_API not found``): that case is
detected from the versions before importing and reported as
:class:`~agent.errors.BackendUnavailable` saying so.

A fully integer model (int8 input/output tensors) is fed through its input quantization
(q = round(x / scale) + zero_point) and its output dequantized (x = (q − zero_point) × scale),
so callers always pass and get float32.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from agent.errors import BackendUnavailable, ModelError
from agent.inference.base import check_input_shape, install_hint
from agent.records import Float32Array

KIND = "litert"

#: Interpreter modules tried in order.
MODULES = ("ai_edge_litert.interpreter", "tflite_runtime.interpreter")


@dataclass(frozen=True, slots=True)
class LiteRtConfig:
    """Settings of the LiteRT backend.

    Attributes:
        threads: ``num_threads`` of the interpreter (XNNPACK's thread pool).
    """

    threads: int = 1


def tflite_runtime_problem(tflite_version: str | None, numpy_version: str) -> str | None:
    """Why an installed tflite-runtime cannot work here, or None.

    >>> tflite_runtime_problem("2.14.0", "2.4.6")
    'tflite-runtime 2.14.0 was built for NumPy 1 and fails with NumPy 2.4.6'
    >>> tflite_runtime_problem("2.14.0", "1.26.4") is None
    True
    """
    if tflite_version is None:
        return None
    major = _major_minor(tflite_version)
    if int(numpy_version.split(".", maxsplit=1)[0]) >= 2 and major <= (2, 14):
        return (f"tflite-runtime {tflite_version} was built for NumPy 1 and fails with "
                f"NumPy {numpy_version}")
    return None


def _major_minor(version: str) -> tuple[int, int]:
    parts = [int("".join(ch for ch in p if ch.isdigit()) or 0) for p in version.split(".")[:2]]
    return parts[0], parts[1] if len(parts) > 1 else 0


def _installed(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def load_interpreter_class(
    importer: Callable[[str], ModuleType] = importlib.import_module,
    version_of: Callable[[str], str | None] = _installed,
) -> type[Any]:
    """Import the LiteRT ``Interpreter`` class: ai-edge-litert, else tflite-runtime.

    Args:
        importer: Imports a module by name (tests pass a fake).
        version_of: Installed version of a distribution, or None.

    Raises:
        BackendUnavailable: neither works; the message names the extra, or says that the
            installed tflite-runtime does not work with this NumPy.
    """
    problems: list[str] = []
    for name in MODULES:
        if name.startswith("tflite_runtime"):
            problem = tflite_runtime_problem(version_of("tflite-runtime"), np.__version__)
            if problem is not None:
                problems.append(problem)
                continue
        try:
            module = importer(name)
            cls: type[Any] = module.Interpreter
        except ImportError:
            continue
        except AttributeError as exc:  # a NumPy-1 extension under NumPy 2 ends up here
            problems.append(f"{name} failed to import ({exc}): built for another NumPy")
            continue
        return cls
    detail = "; ".join(problems) if problems else "neither ai-edge-litert nor tflite-runtime"
    raise BackendUnavailable(f"LiteRT is not usable: {detail}: {install_hint(KIND)}")


class LiteRtBackend:
    """Run a ``.tflite`` artefact with the LiteRT interpreter on the CPU.

    Args:
        path: The ``.tflite`` file.
        precision: ``int8`` or ``fp32`` (as the manifest says).
        config: Thread settings.
        interpreter_class: The ``Interpreter`` class (default: :func:`load_interpreter_class`).

    Raises:
        BackendUnavailable: no working LiteRT interpreter is installed.
        ModelError: the file cannot be loaded.
    """

    name = KIND

    def __init__(
        self,
        path: Path,
        precision: str,
        config: LiteRtConfig | None = None,
        interpreter_class: type[Any] | None = None,
    ) -> None:
        cfg = config or LiteRtConfig()
        cls = interpreter_class or load_interpreter_class()
        try:
            self._interp: Any = cls(model_path=str(path), num_threads=cfg.threads)
            self._interp.allocate_tensors()
        except (ValueError, RuntimeError) as exc:
            raise ModelError(f"cannot load TFLite model: {exc}", path=path) from exc
        self._in = self._interp.get_input_details()[0]
        self._out = self._interp.get_output_details()[0]
        self._shape = tuple(int(d) for d in self._in["shape"])
        self._expected = tuple(int(d) for d in self._in.get("shape_signature", self._in["shape"]))
        self._lock = threading.Lock()  # the interpreter's tensors serve one call at a time
        self.precision = precision
        self.path = path
        self.threads = cfg.threads

    def _resize(self, shape: tuple[int, ...]) -> None:
        if shape != self._shape:
            self._interp.resize_tensor_input(self._in["index"], list(shape), strict=False)
            self._interp.allocate_tensors()
            self._in = self._interp.get_input_details()[0]
            self._out = self._interp.get_output_details()[0]
            self._shape = shape

    def run(self, windows: Float32Array) -> Float32Array:
        """Run on ``windows`` (``(B, W, C)`` or ``(B, H, W, Ch)`` float32); ``(B, F)`` float32.

        Thread-safe (calls are serialised on the one interpreter).
        """
        x = np.asarray(windows, dtype=np.float32)
        problem = check_input_shape(tuple(x.shape), (None, *self._expected[1:]))
        if problem is not None:
            raise ModelError(f"inference failed: {problem}", path=self.path)
        try:
            with self._lock:
                if self._interp is None:
                    raise ModelError("inference failed: the backend is closed", path=self.path)
                self._resize(tuple(x.shape))
                self._interp.set_tensor(self._in["index"], _quantize(x, self._in))
                self._interp.invoke()
                out = _dequantize(self._interp.get_tensor(self._out["index"]), self._out)
        except (ValueError, RuntimeError) as exc:
            raise ModelError(f"inference failed: {exc}", path=self.path) from exc
        return out.reshape(x.shape[0], -1)

    def close(self) -> None:
        """Drop the interpreter (waits for a call in progress)."""
        with self._lock:
            self._interp = None


def _quantize(x: Float32Array, detail: dict[str, Any]) -> Any:
    dtype = np.dtype(detail["dtype"])
    if dtype == np.float32:
        return x
    scale, zero = detail["quantization"]
    info = np.iinfo(dtype)
    return np.clip(np.round(x / scale) + zero, info.min, info.max).astype(dtype)


def _dequantize(y: Any, detail: dict[str, Any]) -> Float32Array:
    if np.dtype(detail["dtype"]) == np.float32:
        out: Float32Array = np.array(y, dtype=np.float32)
        return out
    scale, zero = detail["quantization"]
    deq: Float32Array = ((np.asarray(y, np.float32) - zero) * scale).astype(np.float32)
    return deq
