"""The backend registry: one line per runtime, the runtime library imported only when built.

Adding a runtime is one line in :data:`REGISTRY` plus its module (kind constant, config class,
implementation). The modules themselves are light (each imports its runtime library inside the
implementation's constructor), so the config classes are imported here eagerly; the
implementation is named ``"module:Class"`` and imported by :func:`build_backend`.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from agent.errors import ModelError
from agent.inference import litert, onnxruntime, openvino
from agent.inference.base import Backend
from cloud_sync.manifest import Artefact

#: kind -> (config class, "module:Class" of the implementation, the Python module it needs).
REGISTRY: dict[str, tuple[type[Any], str, tuple[str, ...]]] = {
    onnxruntime.KIND: (onnxruntime.OnnxRuntimeConfig,
                       "agent.inference.onnxruntime:OnnxRuntimeBackend", ("onnxruntime",)),
    openvino.KIND: (openvino.OpenVinoConfig,
                    "agent.inference.openvino:OpenVinoBackend", ("openvino",)),
    litert.KIND: (litert.LiteRtConfig,
                  "agent.inference.litert:LiteRtBackend", ("ai_edge_litert", "tflite_runtime")),
}

#: Which artefact runtimes each backend runs: OpenVINO also runs the ONNX artefacts.
RUNS_ARTEFACTS: dict[str, tuple[str, ...]] = {
    onnxruntime.KIND: ("onnxruntime",),
    openvino.KIND: ("openvino", "onnxruntime"),
    litert.KIND: ("litert",),
}

#: Files an IR artefact needs beside it; not loadable on their own.
WEIGHTS_SUFFIXES = (".bin",)


class _Listing(Protocol):
    @property
    def artefacts(self) -> Sequence[Artefact]: ...


class HasArtefacts(Protocol):
    """A verified package of either kind (its manifest lists the artefacts)."""

    @property
    def manifest(self) -> _Listing: ...


def artefacts_for(package: HasArtefacts, kind: str, precision: str) -> list[Artefact]:
    """The artefacts of ``precision`` that runtime ``kind`` can run, its own format first.

    IR weights files (``.bin``, listed as artefacts so their hashes are verified) are skipped.
    """
    arts = [a for a in package.manifest.artefacts
            if a.precision == precision and not a.path.endswith(WEIGHTS_SUFFIXES)]
    return [a for fmt in RUNS_ARTEFACTS.get(kind, ()) for a in arts if a.runtime == fmt]


def backend_kinds() -> tuple[str, ...]:
    """The registered runtimes, sorted.

    >>> backend_kinds()
    ('litert', 'onnxruntime', 'openvino')
    """
    return tuple(sorted(REGISTRY))


def installed(kind: str) -> bool:
    """Whether a Python module that ``kind`` needs is importable (without importing it).

    A True here can still end in :class:`~agent.errors.BackendUnavailable` when the module
    fails on import (e.g. tflite-runtime under NumPy 2).
    """
    return any(importlib.util.find_spec(m) is not None for m in REGISTRY[kind][2])


def build_backend(kind: str, path: Path, precision: str, **options: Any) -> Backend:
    """Construct the backend ``kind`` for the artefact at ``path``.

    Args:
        kind: A registered runtime.
        path: The artefact file.
        precision: ``int8`` or ``fp32``.
        **options: Fields of that runtime's config class (``threads``, ``cache_dir`` ...);
            fields the runtime does not have are ignored, so callers pass one set for all.

    Raises:
        ModelError: ``kind`` is not registered, or the artefact does not load.
        agent.errors.BackendUnavailable: the runtime is not installed (names the extra).
    """
    try:
        config_class, target, _ = REGISTRY[kind]
    except KeyError:
        raise ModelError(
            f"unknown backend {kind!r}; known: {', '.join(backend_kinds())}", path=path
        ) from None
    names = {f.name for f in dataclasses.fields(config_class)}
    config = config_class(**{k: v for k, v in options.items() if k in names})
    module_name, _, class_name = target.partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    backend: Backend = cls(path, precision, config)
    return backend
