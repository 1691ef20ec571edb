"""What the model updater checks of an assignment and its package before anything is written.

* Before the download: the announced ``archive_size`` is at most ``updater.max_archive_bytes``
  (names, stream and url were checked when the assignment was parsed,
  :class:`cloud_sync.protocol.ModelAssignment`), and anti-rollback on the assigned name and
  version, so a refused rollback costs no download.
* After the download, before anything is unpacked (the check hook of
  :func:`cloud_sync.archive.unpack_verified`, which has verified the manifest's signature): the
  archive holds the assigned ``name@version``, and anti-rollback across names
  (:mod:`cloud_sync.rollback`) against the stream's persistent high-water marks.

High-water marks: ``<state_dir>/models/high_water.json``, per stream the newest version of every
model name the stream has run (the configured package at each start, every package swapped in),
the newest rollout id of a SIGNED rollback the stream has applied, and the time (this device's
clock) it last installed a fleet package (:mod:`cloud_sync.rollback` refuses a rollback of a
rollout not newer than that mark, or issued before that install)::

    {"format": 1, "streams": {"pump": {"skab-wstat": 6, "skab-other": 1}},
     "rollbacks": {"pump": 12}, "installed_at": {"pump": 1767225600.0}}

Why only signed values raise the rollback mark: an assignment's own ``rollout_id`` is not signed.
Earlier versions kept the newest ``rollout_id`` the stream had INSTALLED from (``"rollouts"``);
a hostile fleet (or anyone on the path of a plain-HTTP URL) serving a genuine, operator-signed
newer package with ``rollout_id = 2**63 - 1`` raised that mark for good, and every genuine
rollback was then refused "as a replay". Now the mark is raised only by the ``rollout_id``
inside a rollback whose signature this device verified and which it applied; the install time
is this device's own clock. Nothing an unauthenticated peer sends can raise either beyond what
the operator's rollback key signed or the device observed. The old ``"rollouts"`` key is
ignored (it may have been raised that way).

What still stops a captured rollback from being replayed (each is signed or local):

* ``rollout_id`` must equal the assignment's, and name this device, stream, name and versions,
  ``from_version`` being the stream's current mark: once a later version of the name ran, an
  old rollback no longer matches;
* a rollback of a rollout not newer than the last applied one is refused: a rollback is applied
  at most once, and never after a newer one;
* a rollback issued (signed ``issued_at``) more than ``max_skew_s`` before the stream's last
  fleet install is refused: the stream has moved since it was signed (the fleet signs afresh at
  every poll, so a genuine abort of the package just installed is never older than that);
* it expires after ``rollback_max_age_s``.

written atomically (temporary file, fsync, rename, fsync of the directory). A file that cannot
be read is never replaced by an empty one: every fleet package is refused until an operator
repairs it (failing open would allow any rollback).
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field

from agent.config.base import StrictModel
from agent.errors import ConfigError
from cloud_sync.errors import KeyFileError, PackageError, PackageFormatError
from cloud_sync.manifest import Manifest
from cloud_sync.package import TrustedKeys, load_public_keys
from cloud_sync.protocol import MAX_ARCHIVE_BYTES, PACKAGE_NAME_PATTERN, ModelAssignment
from cloud_sync.rollback import RollbackPolicy, check_rollback, rollback_floor

if TYPE_CHECKING:  # cryptography loads with the first key (an agent without updates never)
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

HIGH_WATER_FILE = "high_water.json"
#: Most model names remembered per stream (the oldest marks are never dropped: refused instead).
MAX_NAMES = 256

log = logging.getLogger("agent.updater")


class GuardConfig(StrictModel):
    """The ``[updater]`` keys of this module (a base of
    :class:`agent.services.updater.UpdaterConfig`)."""

    rollback_keys_dir: str | None = Field(
        None, examples=["/etc/edge-agent/rollback-keys"],
        description="Directory of the Ed25519 public keys (*.pub) that may sign a rollback to "
        "an older version (the fleet's --rollback-key). A trust set separate from "
        "trusted_keys_dir: a key in both is refused. None: no rollback is accepted.",
    )
    rollback_max_age_s: float = Field(
        3600.0, gt=0.0, description="A signed rollback older than this (its issued_at, on this "
        "device's clock) is refused: it cannot be replayed later.",
    )
    max_archive_bytes: int = Field(
        256 * 1024 * 1024, ge=1024, le=MAX_ARCHIVE_BYTES,
        description="An assignment announcing a larger archive is refused before download.",
    )
    max_package_bytes: int = Field(
        512 * 1024 * 1024, ge=1024, description="Largest unpacked package (manifest plus "
        "artefacts), bytes; also bounds the bytes decompressed while reading an archive.",
    )


class HighWater:
    """Per stream, the newest version of each model name it has run (see the module docstring).

    Args:
        path: The JSON file (its directory must exist).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self.broken: str | None = None
        self._rollbacks: dict[str, int] = {}
        self._installed: dict[str, float] = {}
        self._data: dict[str, dict[str, int]] = self._load()

    def _load(self) -> dict[str, dict[str, int]]:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
            streams = raw["streams"]
            # "rollouts" (install-based, raised by unsigned rollout ids) is ignored on purpose
            self._rollbacks = {str(s): int(r) for s, r in raw.get("rollbacks", {}).items()}
            self._installed = {str(s): float(t)
                               for s, t in raw.get("installed_at", {}).items()}
            return {str(s): {str(n): int(v) for n, v in names.items()}
                    for s, names in streams.items()}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            self.broken = (f"{self.path} is unreadable ({type(exc).__name__}: {exc}); fleet "
                           "packages are refused until it is repaired")
            log.error("%s", self.broken)
            return {}

    def rollback_mark(self, stream: str) -> int | None:
        """The newest rollout id of a signed rollback ``stream`` has applied, or None."""
        with self._lock:
            return self._rollbacks.get(stream)

    def installed_at(self, stream: str) -> float | None:
        """When ``stream`` last installed a fleet package (this device's clock), or None."""
        with self._lock:
            return self._installed.get(stream)

    def marks(self, stream: str) -> dict[str, int]:
        """``{model name: newest version run}`` of ``stream``."""
        with self._lock:
            return dict(self._data.get(stream, {}))

    def ran(
        self, stream: str, name: str, version: int, *, installed_at: float | None = None,
        rollback_of: int | None = None,
    ) -> None:
        """Record that ``stream`` runs ``name@version`` (raises the marks, never lowers them).

        Args:
            installed_at: A fleet package was installed at this time (device clock); None for
                the configured package at start.
            rollback_of: The rollout id of the SIGNED rollback (verified) that allowed this
                install; never an assignment's unsigned ``rollout_id``.

        A file that cannot be written is logged (error); the mark is kept in memory and written
        with the next change.
        """
        with self._lock:
            if self.broken is not None:
                return
            names = self._data.setdefault(stream, {})
            changed = names.get(name, 0) < version or installed_at is not None
            names[name] = max(names.get(name, 0), version)
            if installed_at is not None:
                self._installed[stream] = installed_at
            if rollback_of is not None and rollback_of > self._rollbacks.get(stream, -1):
                self._rollbacks[stream] = rollback_of
                changed = True
            if not changed:
                return
            try:
                self._write()
            except OSError as exc:
                log.error("cannot write %s (%s): the model high-water mark %s@%d of stream %s "
                          "is kept in memory only", self.path, exc, name, version, stream)

    def _write(self) -> None:
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        with tmp.open("w", encoding="utf-8") as fh:
            json.dump({"format": 1, "streams": self._data, "rollbacks": self._rollbacks,
                       "installed_at": self._installed}, fh, indent=1, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
        fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class PackageGuard:
    """The updater's checks of an assignment (see the module docstring).

    Args:
        high_water: The stream's marks.
        policy: Rollback keys and ages; None = no rollback keys, every rollback refused.
        device_id: This gateway (a rollback must name it).
        max_archive_bytes: Largest announced archive, bytes.
        clock: Wall clock, epoch seconds UTC (rollback age).
    """

    def __init__(
        self, high_water: HighWater, policy: RollbackPolicy | None, device_id: str,
        max_archive_bytes: int, clock: Callable[[], float] = time.time,
    ) -> None:
        self.high_water = high_water
        self.policy = policy
        self.device_id = device_id
        self.max_archive_bytes = max_archive_bytes
        self.clock = clock
        #: Per stream, ``(name, version, rollout id)`` of the signed rollback :meth:`check`
        #: verified last (consumed by :meth:`installed`).
        self._verified: dict[str, tuple[str, int, int]] = {}

    def before_download(
        self, a: ModelAssignment, stream: str, running: tuple[str, int]
    ) -> str | None:
        """The reason to refuse ``a`` without downloading it, or None.

        Checks the announced size, and anti-rollback on the assignment's name and version (the
        manifest is checked again after the download: it must be the assigned package).
        """
        if self.high_water.broken is not None:
            return self.high_water.broken
        if a.archive_size > self.max_archive_bytes:
            return (f"announced archive size {a.archive_size} bytes exceeds "
                    f"updater.max_archive_bytes {self.max_archive_bytes}; not downloaded")
        try:
            self._anti_rollback(stream, running, a, a.name, a.version)
        except PackageError as exc:
            return f"{type(exc).__name__}: {exc}; not downloaded"
        return None

    def check(
        self, stream: str, running: tuple[str, int], a: ModelAssignment, manifest: Manifest
    ) -> None:
        """The verified manifest is the assigned package and passes anti-rollback.

        Args:
            stream: The stream it is for.
            running: ``(name, version)`` the stream runs now.
            a: The assignment.
            manifest: The archive's manifest, signature verified.

        Raises:
            PackageFormatError: another package than the assigned one, or the marks file is
                unreadable.
            RollbackRefused: see :func:`cloud_sync.rollback.check_rollback`.
        """
        label = f"{manifest.name}@{manifest.version}"
        if self.high_water.broken is not None:
            raise PackageFormatError(self.high_water.broken, label)
        if (manifest.name, manifest.version) != (a.name, a.version):
            raise PackageFormatError(
                f"archive holds {label}, not the assigned {a.name}@{a.version}", label)
        self._verified.pop(stream, None)
        if self._anti_rollback(stream, running, a, manifest.name, manifest.version) \
                and a.rollback is not None and a.rollback.rollout_id is not None:
            self._verified[stream] = (a.name, a.version, a.rollback.rollout_id)

    def installed(self, stream: str, a: ModelAssignment) -> None:
        """``a``'s package now runs on ``stream``: raise its marks, the install time, and the
        rollback mark when :meth:`check` verified a signed rollback for exactly this package
        (the signed ``rollout_id``, never the assignment's)."""
        verified = self._verified.pop(stream, None)
        rollback_of = verified[2] if verified is not None and verified[:2] == (
            a.name, a.version) else None
        self.high_water.ran(stream, a.name, a.version, installed_at=self.clock(),
                            rollback_of=rollback_of)

    def _anti_rollback(
        self, stream: str, running: tuple[str, int], a: ModelAssignment, name: str, version: int
    ) -> bool:
        """True when the package needed a rollback (and ``a``'s, signed, allowed it)."""
        label = f"{name}@{version}"
        marks = self.high_water.marks(stream)
        floor = rollback_floor(name, version, running, marks)
        if floor is None:
            if name not in marks and len(marks) >= MAX_NAMES:
                raise PackageFormatError(f"stream {stream} has run {MAX_NAMES} model names "
                                         "already; no new name is accepted", label)
            return False
        check_rollback(
            a.rollback, device_id=self.device_id, stream=stream, name=name,
            from_version=floor, to_version=version, policy=self.policy,
            now=self.clock(), where=label, rollout_id=a.rollout_id,
            rollback_mark=self.high_water.rollback_mark(stream),
            installed_at=self.high_water.installed_at(stream),
        )
        return True


def load_keys_dir(directory: str, key: str) -> TrustedKeys:
    """The ``*.pub`` keys of a configured directory (``key`` names the config key).

    Raises:
        ConfigError: the directory or a key cannot be loaded, or it holds no key.
    """
    try:
        keys = load_public_keys(Path(directory))
    except KeyFileError as exc:
        msg = f"{key}: {exc}"
        raise ConfigError(msg, problems=[msg]) from exc
    if not keys:
        msg = f"{key}: no *.pub key in {directory}"
        raise ConfigError(msg, problems=[msg])
    return keys


def load_rollback_policy(
    rollback_keys_dir: str | None, max_age_s: float, package_keys: TrustedKeys
) -> RollbackPolicy | None:
    """The rollback trust set of ``updater.rollback_keys_dir`` (None when not configured).

    A key that is also a package-signing key is refused: the two roles are separate trust sets
    (the fleet's rollback key lives on the server; it must not be able to sign packages).

    Raises:
        ConfigError: the directory or a key cannot be loaded, it holds no key, or a key is also
            in ``trusted_keys_dir``.
    """
    if rollback_keys_dir is None:
        return None
    keys = load_keys_dir(rollback_keys_dir, "updater.rollback_keys_dir")
    package_raw = {_raw(k): kid for kid, k in package_keys.items()}
    for kid, key in keys.items():
        if _raw(key) in package_raw:
            msg = (f"updater.rollback_keys_dir: key {kid!r} is also the package-signing key "
                   f"{package_raw[_raw(key)]!r} of trusted_keys_dir; a rollback key must not "
                   "sign packages (use separate keys)")
            raise ConfigError(msg, problems=[msg])
    return RollbackPolicy(keys, max_age_s=max_age_s)


def _raw(key: Ed25519PublicKey) -> bytes:
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415 - lazy: updater only

    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def salvage(raw: bytes) -> tuple[str, int, int | None]:
    """``(name, version, rollout_id)`` to report an assignment that failed the schema.

    Fields that are not valid are replaced: name ``invalid-assignment``, version 1, rollout None.
    """
    try:
        obj = json.loads(raw[: 64 * 1024])
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: deep nesting
        obj = None
    if not isinstance(obj, dict):
        obj = {}
    name = obj.get("name")
    version = obj.get("version")
    rollout = obj.get("rollout_id")
    return (
        name if isinstance(name, str) and re.fullmatch(PACKAGE_NAME_PATTERN, name)
        else "invalid-assignment",
        version if type(version) is int and 1 <= version < 2**63 else 1,
        rollout if type(rollout) is int and 0 <= rollout < 2**63 else None,
    )
