"""Stored model archives checked against their recorded sha256 before they are served.

The registry stores each package's canonical archive and its ``archive_sha256`` (the package
identity, the download's ``ETag``). A row damaged in the database afterwards (a disk fault, a
restore gone wrong, a manual edit) would be served as it is, and devices would download it until
their retries ran out. So every download hashes the archive first (sha256 of at most the upload
limit, 64 MiB: well under a second) and, when it differs:

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
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
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
