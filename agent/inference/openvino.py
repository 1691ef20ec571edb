"""OpenVINO backend (CPU plugin): runs ONNX artefacts (FP32 or QDQ INT8) and OpenVINO IR.

OpenVINO reads an ``.onnx`` file directly or an IR (``.xml`` with its ``.bin`` beside it). A QDQ
ONNX graph runs as INT8: the CPU plugin's low-precision transformations fold each
QuantizeLinear/DequantizeLinear pair into a FakeQuantize and execute the quantized operators in
int8 (OpenVINO docs, "Low Precision Transformations"); an IR converted from that ONNX
(``ov.convert_model`` + ``ov.save_model``) or quantized by NNCF runs the same way.

Compiled models are cached in ``cache_dir`` (OpenVINO's ``CACHE_DIR`` property: the second
start skips the compilation; the agent passes ``<state_dir>/openvino-cache``). Installed with
the ``openvino`` extra: ``pip install 'edge-anomaly-agent[openvino]'``.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agent.errors import BackendUnavailable, ModelError
from agent.inference.base import check_input_shape, install_hint
from agent.records import Float32Array

KIND = "openvino"

log = logging.getLogger("agent.inference")


@dataclass(frozen=True, slots=True)
class OpenVinoConfig:
    """Settings of the OpenVINO backend.

    Attributes:
        threads: ``INFERENCE_NUM_THREADS`` of the CPU plugin.
        cache_dir: Compiled-model cache (``CACHE_DIR``); None = no cache (also when it cannot
            be created or written: :func:`usable_cache_dir`).
        device: OpenVINO device name (``CPU``; ``GPU``/``NPU`` where the gateway has one).
        hint: ``PERFORMANCE_HINT``: ``LATENCY`` (one stream, one request) suits windows that
            arrive one by one.
        pin_threads: ``ENABLE_CPU_PINNING`` of the CPU plugin. Off by default: the agent
            compiles one model per stream in one process, and with pinning on (OpenVINO's
            default on Linux) the streams' inference threads were pinned onto the same cores:
            ``benchmarks/camera.py`` (4 streams x 30 fps, 2 cores, back to back) scored 46.5
            frames/s with pinning, 108.1 without.
        streams: Inference streams of the compiled model (``NUM_STREAMS``), for streams of the
            agent sharing it (:meth:`OpenVinoBackend.share`): up to this many handles, each
            with its own infer request, run at once on ``threads`` threads each
            (``INFERENCE_NUM_THREADS`` = threads × streams). 1: one inference at a time.
    """

    threads: int = 1
    cache_dir: Path | None = None
    device: str = "CPU"
    hint: str = "LATENCY"
    pin_threads: bool = False
    streams: int = 1


class _StackT(ctypes.Structure):
    """``stack_t`` of ``sigaltstack(2)`` (Linux)."""

    _fields_ = (("ss_sp", ctypes.c_void_p), ("ss_flags", ctypes.c_int),
                ("ss_size", ctypes.c_size_t))


@contextlib.contextmanager
def keep_signal_stack() -> Iterator[None]:
    """Restore the calling thread's alternate signal stack after the block (Linux).

    OpenVINO (2026.4, CPU plugin) installs an alternate signal stack on the thread that
    compiles a model and puts back the one it replaced when the compiled model is freed. Freed
    in another order than created (a candidate failing the golden check, then another; a
    reload or a model update dropping the older model), the thread is left with the stack of a
    freed model, and the next signal handled there (Python installs its handlers with
    ``SA_ONSTACK``: SIGTERM, SIGINT, SIGHUP) killed the agent with SIGSEGV instead of a clean
    stop. Putting the previous stack back right after compiling keeps the thread's stack one
    the process owns; OpenVINO restores that same stack when the model is freed.
    """
    if not sys.platform.startswith("linux"):
        yield
        return
    libc = ctypes.CDLL(None, use_errno=True)
    before = _StackT()
    saved = libc.sigaltstack(None, ctypes.byref(before)) == 0
    try:
        yield
    finally:
        if saved:
            libc.sigaltstack(ctypes.byref(before), None)


_warned_cache_dirs: set[Path] = set()


def usable_cache_dir(cache_dir: Path | None) -> Path | None:
    """``cache_dir`` created if needed, or None (one WARNING per directory) when it cannot be
    created or written: the model then compiles without a cache, slower to start but the same.

    A cache is an optimisation: an unwritable state directory or a file in the way must not turn
    every OpenVINO candidate into a failure (nor a traceback).
    """
    if cache_dir is None:
        return None
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        if not os.access(cache_dir, os.W_OK | os.X_OK):
            raise PermissionError(f"no write permission on {cache_dir}")
    except OSError as exc:
        if cache_dir not in _warned_cache_dirs:
            _warned_cache_dirs.add(cache_dir)
            log.warning("OpenVINO model cache %s is not usable (%s); compiling without a cache",
                        cache_dir, exc)
        return None
    return cache_dir


class OpenVinoBackend:
    """Run an ONNX or IR artefact with OpenVINO.

    One compiled model serves ``config.streams`` handles (this one and those of :meth:`share`),
    each with its own infer request: the weights, the compiled kernels and the plugin's thread
    pool are held once, the intermediate buffers once per inference stream.

    Args:
        path: ``.onnx`` or ``.xml`` (IR; its ``.bin`` beside it).
        precision: ``int8`` or ``fp32`` (as the manifest says).
        config: Threads, cache directory, device, hint.

    Raises:
        BackendUnavailable: openvino is not installed (the message names the extra).
        ModelError: the file cannot be read or compiled.
    """

    name = KIND

    def __init__(self, path: Path, precision: str, config: OpenVinoConfig | None = None) -> None:
        cfg = config or OpenVinoConfig()
        try:
            import openvino as ov  # noqa: PLC0415 - lazy: a runtime loads only when used
        except ImportError as exc:
            raise BackendUnavailable(
                f"openvino is not installed: {install_hint(KIND)}", path=path
            ) from exc
        core = ov.Core()
        cache_dir = usable_cache_dir(cfg.cache_dir)
        if cache_dir is not None:
            core.set_property({"CACHE_DIR": str(cache_dir)})
        streams = max(1, cfg.streams)
        props: dict[str, Any] = {"PERFORMANCE_HINT": cfg.hint}
        if streams > 1:
            props["NUM_STREAMS"] = streams  # an explicit value overrides the hint's choice
        if cfg.device == "CPU":
            # f32 keeps FP32 artefacts exact on CPUs with bf16/fp16 units; int8 artefacts still
            # run their quantized operators in int8.
            props |= {"INFERENCE_NUM_THREADS": cfg.threads * streams,
                      "INFERENCE_PRECISION_HINT": "f32", "ENABLE_CPU_PINNING": cfg.pin_threads}
        try:
            # compiling from the path (not a read model) lets the cache key on the file
            with keep_signal_stack():
                self._compiled: Any = core.compile_model(str(path), cfg.device, props)
        except Exception as exc:  # openvino raises RuntimeError with its own text
            raise ModelError(f"cannot load model with OpenVINO: {exc}", path=path) from exc
        self._request: Any = self._compiled.create_infer_request()
        self._expected = tuple(d.get_length() if d.is_static else None
                               for d in self._compiled.input(0).get_partial_shape())
        self._lock = threading.Lock()  # an infer request serves one call at a time
        #: Handles made on the compiled model, this one included (one counter shared by all).
        self._handles = [1]
        self.streams = streams
        self.precision = precision
        self.path = path
        self.threads = cfg.threads
        self.cache_dir = cache_dir

    def share(self) -> OpenVinoBackend:
        """Another handle on this compiled model, with its own infer request (camera streams on
        one model: :func:`agent.inference.image_select.open_image_backend`).

        Handles run at once, each on its own infer request, up to ``streams`` of them in
        parallel. Closing a handle drops its request and its reference; the compiled model is
        freed with the last handle.

        Raises:
            ModelError: this handle is closed, or the compiled model already has ``streams``
                handles (one more would wait for another's inference).
        """
        with self._lock:
            compiled = self._compiled
        if compiled is None:
            raise ModelError("cannot share: the backend is closed", path=self.path)
        handles = self._handles
        if handles[0] >= self.streams:
            raise ModelError(f"cannot share: the compiled model has {self.streams} inference "
                             f"stream(s), all taken", path=self.path)
        other = object.__new__(OpenVinoBackend)
        other.__dict__.update(self.__dict__)
        try:
            other._request = compiled.create_infer_request()
        except Exception as exc:  # openvino raises RuntimeError with its own text
            raise ModelError(f"cannot share: {exc}", path=self.path) from exc
        other._lock = threading.Lock()
        handles[0] += 1
        return other

    def run(self, windows: Float32Array) -> Float32Array:
        """Run on ``windows`` (``(B, W, C)`` or ``(B, H, W, Ch)`` float32); ``(B, F)`` float32.

        Thread-safe (calls are serialised on the one infer request).
        """
        problem = check_input_shape(tuple(windows.shape), self._expected)
        if problem is not None:
            raise ModelError(f"inference failed: {problem}", path=self.path)
        try:
            with self._lock:
                if self._request is None:
                    raise ModelError("inference failed: the backend is closed", path=self.path)
                self._request.infer({0: np.ascontiguousarray(windows, dtype=np.float32)})
                out = np.array(self._request.get_output_tensor(0).data, dtype=np.float32)
        except ModelError:
            raise
        except Exception as exc:
            raise ModelError(f"inference failed: {exc}", path=self.path) from exc
        return out

    def close(self) -> None:
        """Drop the infer request and the compiled model (waits for a call in progress)."""
        with self._lock:
            self._request = None
            self._compiled = None
