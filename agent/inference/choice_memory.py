"""Remembered backend selections: a restart loads only the runtimes it chose before.

Auto-selection (:mod:`agent.inference.select`) loads every installed runtime to time it, and a
runtime's libraries stay mapped in the process once loaded (OpenVINO alone is about 45 MB of
resident library pages, whether it was chosen or not). The ranking of a selection is stored in
``<state_dir>/backend-choices.json`` under a key made of everything it depends on: the model's
name, version and artefact hashes, the ``backend`` setting, the precision, the threads, the
installed runtimes' versions (read from their distributions' metadata, without importing them)
and the CPU (model name and flags of ``/proc/cpuinfo``). A later start with the same key opens
only the candidates it keeps (each still passes its golden check), so the other runtimes are
never imported; another model, runtime upgrade or CPU makes another key and a full selection.

The file is small JSON (one entry per key, the newest :data:`MAX_ENTRIES` kept), written
atomically; an unreadable file is treated as empty (the next selection writes it again).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger("agent.inference")

#: The file, in the agent's state directory.
FILE_NAME = "backend-choices.json"
#: Entries kept (the oldest are dropped).
MAX_ENTRIES = 64
#: Distributions whose versions are part of the key.
RUNTIME_DISTRIBUTIONS = ("onnxruntime", "openvino", "ai-edge-litert", "tflite-runtime")

#: One ranked candidate: runtime, artefact path in the package, p50 seconds when selected.
Ranked = tuple[str, str, float]


class _Artefact(Protocol):
    @property
    def path(self) -> str: ...
    @property
    def sha256(self) -> str: ...
    @property
    def precision(self) -> str: ...


class _Manifest(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def version(self) -> int: ...
    @property
    def artefacts(self) -> Any: ...


class _Package(Protocol):
    @property
    def manifest(self) -> _Manifest: ...


def _runtime_versions() -> list[str]:
    found = []
    for dist in RUNTIME_DISTRIBUTIONS:
        try:
            found.append(f"{dist}=={importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def _cpu() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return ""
    keep = [line for line in text.splitlines() if line.startswith(("model name", "flags"))]
    return "\n".join(sorted(set(keep)))


def selection_key(package: _Package, backend: str, precision: str, threads: int) -> str:
    """The hex key of a selection of ``package`` (see the module docstring)."""
    m = package.manifest
    parts = [m.name, str(m.version), backend, precision, str(threads),
             *sorted(f"{a.path}:{a.sha256}" for a in m.artefacts), *_runtime_versions(), _cpu()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


class ChoiceMemory:
    """The remembered rankings in one file (thread-safe).

    Args:
        path: The JSON file (``<state_dir>/backend-choices.json``).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    @classmethod
    def in_state_dir(cls, state_dir: Path) -> ChoiceMemory:
        """The memory of the agent whose state directory is ``state_dir``."""
        return cls(state_dir / FILE_NAME)

    def _read(self) -> dict[str, list[list[Any]]]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, key: str) -> list[Ranked] | None:
        """The ranking stored under ``key`` (passing candidates, fastest first), or None."""
        with self._lock:
            entry = self._read().get(key)
        if not isinstance(entry, list) or not entry:
            return None
        try:
            return [(str(k), str(p), float(s)) for k, p, s in entry]
        except (TypeError, ValueError):
            return None

    def put(self, key: str, ranking: list[Ranked]) -> None:
        """Store ``ranking`` under ``key`` (newest last; errors are logged, not raised)."""
        with self._lock:
            data = self._read()
            data.pop(key, None)
            data[key] = [list(r) for r in ranking]
            while len(data) > MAX_ENTRIES:
                data.pop(next(iter(data)))
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._write(data)
            except OSError as exc:
                log.warning("backend choice not remembered (%s): the next start selects "
                            "again", exc)

    def forget(self, key: str) -> None:
        """Drop the ranking under ``key`` (a remembered candidate no longer loads); a failed
        write keeps the file as it was (the next start finds the candidate failing again)."""
        with self._lock:
            data = self._read()
            if data.pop(key, None) is not None:
                try:
                    self._write(data)
                except OSError:
                    return

    def _write(self, data: dict[str, list[list[Any]]]) -> None:
        """Replace the file atomically (a write failing part-way leaves the old file).

        Raises:
            OSError: the write or the rename failed (the temporary file is removed).
        """
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            tmp.write_text(json.dumps(data))
            os.replace(tmp, self.path)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
