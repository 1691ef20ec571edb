"""Stored model archives checked against their recorded sha256 before they are served.

The registry stores each package's canonical archive and its ``archive_sha256`` (the package
identity, the download's ``ETag``). A row damaged in the database afterwards (a disk fault, a
restore gone wrong, a manual edit) would be served as it is, and devices would download it until
their retries ran out. So every download checks the archive it read first and, when it differs:

* the download is refused with HTTP 500 ``{"error": "corrupt_archive", "detail": "model
  NAME@VERSION is corrupt in the fleet's store ..."}`` (:class:`fleet.errors.CorruptArchive`;
  a device retries with backoff and installs nothing);
* the package is marked corrupt in the database (``models.corrupt_at``, ``corrupt_reason``):
  ``GET /v1/models`` (``edge-fleet model list``) and the rollouts of that version
  (``edge-fleet rollout show``) say so; the first detection is logged once at ERROR, every
  refused download is counted in ``fleet_model_archive_corrupt_total``;
* pushing the same package again (same name, version and archive sha256) replaces the damaged
  bytes and clears the mark (:func:`repair`); a different package under that version is still
  a conflict (versions are immutable).

The check (:class:`VerifiedArchives`): the first download of a package hashes the archive
(sha256: about 45 ms for the 64 MiB upload limit on an x86 core with SHA extensions) and, when
it matches, keeps those bytes; a later download compares the bytes it read with them (about
6 ms for 64 MiB) and hashes only when they differ (a damaged archive, or a package not kept).
The archive is still read from the database on every download: it lives there, not in a file
with a modification time, and a damaged row (a disk fault, a bad restore) shows only in its
bytes.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import threading
from collections import OrderedDict
from typing import Any

from sqlalchemy import Connection, select, update

from fleet.db.model_tables import models

_log = logging.getLogger("fleet.registry")


def corrupt_reason(name: str, version: int, recorded: str, actual: str, size: int) -> str:
    """The text stored and answered for a damaged archive.

    >>> corrupt_reason("m", 2, "ab" * 32, "cd" * 32, 10).split(":")[0]
    "model m@2 is corrupt in the fleet's store"
    """
    return (f"model {name}@{version} is corrupt in the fleet's store: its {size}-byte archive "
            f"hashes to sha256 {actual[:16]}..., not the recorded {recorded[:16]}...; push the "
            "package again (edge-fleet model push) or roll out another version")


def mismatch(data: bytes, recorded: str) -> str | None:
    """The sha256 of ``data`` (hex) when it is not ``recorded``, else None.

    >>> mismatch(b"x", hashlib.sha256(b"x").hexdigest()) is None, mismatch(b"y", "0" * 64)[:8]
    (True, 'a1fce436')
    """
    actual = hashlib.sha256(data).hexdigest()
    return None if actual == recorded else actual


#: Default of :class:`VerifiedArchives`' ``max_bytes``: one archive at the upload limit.
VERIFIED_CACHE_BYTES = 64 * 1024 * 1024


class VerifiedArchives:
    """Archives that hashed to their recorded sha256, kept so that the next read of the same
    package is checked by comparing bytes instead of hashing them again.

    Equal bytes have an equal hash, so a read equal to a kept archive matches its recorded
    sha256 exactly as if it had been hashed; any other read is hashed. Thread-safe (downloads
    are served from a thread pool).

    Args:
        max_bytes: Most archive bytes kept, in total (the least recently downloaded are dropped
            first; an archive larger than this is never kept, always hashed). 0 keeps none.

    >>> v = VerifiedArchives(max_bytes=10)
    >>> good = hashlib.sha256(b"pkg").hexdigest()
    >>> v.mismatch("m", 1, b"pkg", good), v.hashed  # hashed, then kept
    (None, 1)
    >>> v.mismatch("m", 1, b"pkg", good), v.hashed  # compared with the kept bytes
    (None, 1)
    >>> v.mismatch("m", 1, b"pkX", good)[:8], v.hashed  # differs: hashed, refused
    ('a4c2c419', 2)
    """

    def __init__(self, max_bytes: int = VERIFIED_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.hashed = 0  # archives hashed (a figure for tests and benchmarks)
        self._kept: OrderedDict[tuple[str, int, str], bytes] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()

    def mismatch(self, name: str, version: int, data: bytes, recorded: str) -> str | None:
        """The sha256 of ``data`` (hex), read as ``name@version``'s archive, when it is not
        ``recorded``; else None."""
        key = (name, version, recorded)
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None:
                self._kept.move_to_end(key)
        if kept is not None and kept == data:
            return None
        actual = mismatch(data, recorded)
        with self._lock:
            self.hashed += 1
            if actual is None:
                self._keep(key, data)
        return actual

    def _keep(self, key: tuple[str, int, str], data: bytes) -> None:
        old = self._kept.pop(key, None)
        if old is not None:
            self._size -= len(old)
        if len(data) > self.max_bytes:
            return
        self._kept[key] = data
        self._size += len(data)
        while self._size > self.max_bytes:
            _, dropped = self._kept.popitem(last=False)
            self._size -= len(dropped)


def mark_corrupt(conn: Connection, name: str, version: int, data: bytes, reason: str,
                 now: dt.datetime) -> None:
    """Mark the package corrupt in ``conn``'s transaction while its stored archive is still
    ``data``, the bytes found damaged (a push of the same package may have repaired it since
    they were read); the first mark (by any worker or replica) is logged at ERROR, later ones
    change nothing."""
    marked = conn.execute(
        update(models)
        .where(models.c.name == name, models.c.version == version,
               models.c.corrupt_at.is_(None), models.c.archive == data)
        .values(corrupt_at=now, corrupt_reason=reason)
    ).rowcount
    if marked:
        _log.error("%s (downloads are refused with HTTP 500 until it is pushed again)", reason)


def repair(conn: Connection, row: dict[str, Any]) -> bool:
    """Replace the damaged archive of ``row``'s package when ``row`` (a verified upload) is the
    same package (same ``archive_sha256``) and the stored one is marked corrupt; True when done.
    """
    stored = conn.execute(
        select(models.c.archive_sha256, models.c.corrupt_at)
        .where(models.c.name == row["name"], models.c.version == row["version"])
    ).first()
    if (stored is None or stored.corrupt_at is None
            or stored.archive_sha256 != row["archive_sha256"]):
        return False
    conn.execute(
        update(models)
        .where(models.c.name == row["name"], models.c.version == row["version"])
        .values(archive=row["archive"], size=row["size"], corrupt_at=None, corrupt_reason=None)
    )
    _log.warning("model %s@%s: the corrupt stored archive was replaced by the same package "
                 "pushed again", row["name"], row["version"])
    return True
