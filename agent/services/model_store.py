"""Installed model packages on the gateway: directories plus one small JSON file of state.

Layout under ``<state_dir>/models/``::

    incoming/<name>-<version>.tar.gz(.part)   downloads (resumable)
    incoming/<name>-<version>/                being extracted (manifest already verified)
    <name>-<version>/                         verified packages (active, previous, candidate)
    active.json                               per stream: active and previous package
    high_water.json                           per stream: newest version run per model name
                                              (agent.services.package_guard)

``active.json`` (written atomically: temporary file, fsync, rename, fsync of the directory)::

    {"format": 1, "streams": {"pump1": {"active": {"name": "skab-wstat", "version": 3,
      "path": "/var/lib/edge-agent/models/skab-wstat-3"}, "previous": {...} | null,
      "refused": ["skab-wstat@4"]}}}

At start the agent loads a stream's active package from here instead of the configured one, but
only after verifying it again (signature by a pinned key, hashes, no file the manifest does not
name): a package that fails is never loaded, and the configured package is used instead.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.errors import AgentError
from agent.inference.package import ModelPackage, load_package
from cloud_sync.archive import unlisted_files
from cloud_sync.errors import PackageError
from cloud_sync.package import TrustedKeys, verify_package_dir

STATE_FILE = "active.json"
INCOMING = "incoming"

log = logging.getLogger("agent.updater")


@dataclass(frozen=True, slots=True)
class Installed:
    """An installed package: ``name``, ``version`` and its directory."""

    name: str
    version: int
    path: str

    @property
    def label(self) -> str:
        """``name@version``."""
        return f"{self.name}@{self.version}"


class ModelStore:
    """The ``<state_dir>/models`` directory (see the module docstring).

    Args:
        root: ``<state_dir>/models`` (created).
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.incoming = root / INCOMING
        self.incoming.mkdir(parents=True, exist_ok=True)
        self._path = root / STATE_FILE

    def package_dir(self, name: str, version: int) -> Path:
        """Where ``name@version`` is installed."""
        return self.root / f"{name}-{version}"

    def install(self, unpacked: Path, name: str, version: int) -> Path:
        """Move the verified package directory ``unpacked`` to :meth:`package_dir`.

        A folder already there (the kept previous package, assigned again by a rollback, or one
        left by an interrupted update) is replaced: moved aside into ``incoming/``, the new one
        renamed into place, the old one deleted. A model already loaded from the old folder keeps
        working (its files stay open until it is closed).

        Returns:
            The package directory.

        Raises:
            OSError: a rename failed (the old folder is moved back when it can be).
        """
        final = self.package_dir(name, version)
        aside = self.incoming / f".replaced-{final.name}"
        shutil.rmtree(aside, ignore_errors=True)
        if final.exists():
            os.replace(final, aside)
        try:
            os.replace(unpacked, final)
        except OSError:
            if aside.exists() and not final.exists():
                os.replace(aside, final)
            raise
        shutil.rmtree(aside, ignore_errors=True)
        return final

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self._path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {"format": 1, "streams": {}}
        except (OSError, ValueError) as exc:
            log.error("%s is unreadable (%s); starting from the configured models", self._path, exc)
            return {"format": 1, "streams": {}}
        if not isinstance(data, dict) or not isinstance(data.get("streams"), dict):
            return {"format": 1, "streams": {}}
        return data

    def _write(self, data: dict[str, Any]) -> None:
        tmp = self._path.with_name(f".{STATE_FILE}.tmp")
        with tmp.open("w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self._path)
        fd = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def active(self, stream: str) -> Installed | None:
        """The recorded active package of ``stream``, if any."""
        entry = self._read()["streams"].get(stream) or {}
        a = entry.get("active")
        try:
            return Installed(str(a["name"]), int(a["version"]), str(a["path"])) if a else None
        except (KeyError, TypeError, ValueError):
            return None

    def refused(self, stream: str) -> set[str]:
        """``name@version`` labels rolled back on ``stream`` (never installed again)."""
        entry = self._read()["streams"].get(stream) or {}
        return {str(x) for x in entry.get("refused", [])}

    def set_active(
        self, stream: str, active: Installed | None, previous: Installed | None,
        refuse: str | None = None,
    ) -> None:
        """Record ``active`` (None = the configured package) and ``previous`` for ``stream``.

        Args:
            stream: Stream name.
            active: The package in force, when it came from the fleet.
            previous: The package kept for a rollback, when it came from the fleet.
            refuse: A ``name@version`` never to install again on this stream.
        """
        data = self._read()
        entry = data["streams"].setdefault(stream, {})
        entry["active"] = _record(active)
        entry["previous"] = _record(previous)
        if refuse is not None:
            entry["refused"] = sorted({*entry.get("refused", []), refuse})[-64:]
        self._write(data)

    def drop_parts(self, keep: set[Path]) -> list[Path]:
        """Delete the partial downloads (``incoming/*.part``) not in ``keep``; returns them."""
        gone = []
        for part in self.incoming.glob("*.part"):
            if part not in keep and part.is_file():
                part.unlink(missing_ok=True)
                gone.append(part)
        return gone

    def prune(self, keep: set[Path]) -> None:
        """Delete installed package directories not in ``keep`` and not recorded for a stream."""
        data = self._read()
        for entry in data["streams"].values():
            for key in ("active", "previous"):
                if isinstance(entry.get(key), dict):
                    keep.add(Path(entry[key]["path"]))
        kept = {p.resolve() for p in keep}
        for d in self.root.iterdir():
            if d.is_dir() and d.name != INCOMING and d.resolve() not in kept:
                shutil.rmtree(d, ignore_errors=True)

    def load_active(
        self, stream: str, trusted_keys: TrustedKeys
    ) -> tuple[ModelPackage, Installed] | None:
        """Verify and load the recorded active package of ``stream``.

        Returns:
            The package, or None when none is recorded or it fails verification (logged).
        """
        rec = self.active(stream)
        if rec is None:
            return None
        path = Path(rec.path)
        try:
            manifest = verify_package_dir(path, trusted_keys, None)
            if (manifest.name, manifest.version) != (rec.name, rec.version):
                raise AgentError(f"{path} holds {manifest.name}@{manifest.version}")
            if extra := unlisted_files(path, manifest):
                raise AgentError(f"{path} holds files its manifest does not name: {extra[:5]}")
            return load_package(path), rec
        except (PackageError, AgentError) as exc:
            log.error(
                "stream %s: installed model %s fails verification (%s); using the configured "
                "model", stream, rec.label, exc,
            )
            return None


def _record(rec: Installed | None) -> dict[str, Any] | None:
    return None if rec is None else {"name": rec.name, "version": rec.version, "path": rec.path}
