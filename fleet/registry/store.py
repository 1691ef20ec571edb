"""The model registry: accepts signed package archives and serves them back.

An upload is refused unless it is a valid package signed by a key in the fleet's trusted keys
directory, read as the agent reads a download (:func:`cloud_sync.archive.unpack_verified`:
bounded headers and bytes, the signed manifest verified before anything is extracted, a member
the manifest does not name refused, artefacts hashed as they are written); the fleet never
stores an unsigned or untrusted package, nor one carrying files its manifest does not name.
What is stored is the canonical archive (:func:`cloud_sync.package.pack` of the unpacked
directory), so its sha256 is the package identity (``ETag``) whatever tool made the upload.
``(name, version)`` is unique.

Versions of one name are written one transaction at a time: :meth:`ModelRegistry.add` and
:meth:`ModelRegistry.next_version` take the registry's lock on the name (held until the
transaction ends; on PostgreSQL ``pg_advisory_xact_lock(VERSION_LOCK, hashtext(name))``, on
SQLite the database's write lock). A publisher that numbers its package with
:meth:`~ModelRegistry.next_version` in the transaction that stores it therefore never collides
with another publisher of the same name: the second one waits for the first to commit (or roll
back) and reads the version after it.
"""

from __future__ import annotations

import datetime as dt
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from sqlalchemy import Connection, Engine, false, func, insert, select, text, update
from sqlalchemy.exc import IntegrityError

from cloud_sync.archive import unpack_verified
from cloud_sync.package import PackageError, PackageFormatError, pack, read_manifest
from cloud_sync.protocol import INT64_MAX
from fleet.db.model_tables import models
from fleet.errors import Conflict, CorruptArchive, NotFound, Unprocessable
from fleet.ingest import unstorable
from fleet.registry import integrity

#: First key of the registry's per-name ``pg_advisory_xact_lock(int, int)`` (the second is
#: ``hashtext(name)``; the two-key space is separate from the one-key locks of migrations and
#: partition maintenance).
VERSION_LOCK = 0x0F1EE70A
#: Starts of the reasons an upload is not a model package archive at all (cloud_sync.archive).
_NOT_A_PACKAGE = ("not a valid tar.gz archive", "archive holds no manifest.json",
                  "manifest.json is not JSON", "manifest.json is not a JSON object",
                  "manifest.json fails the schema")
#: What such a refusal adds: how to build a package archive.
PACK_HINT = ("not a model package: build one from a signed package directory with `edge-fleet "
             "model pack DIR --out FILE.tar.gz`, or upload the directory with `edge-fleet model "
             "push DIR`")


def upload_error(exc: PackageError, tmp_dir: str) -> str:
    """The 422 ``detail`` of a refused upload: ``<error class>: <reason>``, without the
    server's temporary paths (the upload is unpacked in ``tmp_dir``), and with
    :data:`PACK_HINT` when the file is not a model package at all.

    >>> err = PackageFormatError("archive holds no manifest.json", "/tmp/up-1/upload.tar.gz")
    >>> upload_error(err, "/tmp/up-1").split(" (")[0]
    'PackageFormatError: archive holds no manifest.json'
    """
    text = str(exc)
    if exc.package is not None and exc.package.startswith(tmp_dir):
        text = text[len(exc.package) + 2:]  # PackageError's "<package>: " prefix
    text = text.replace(tmp_dir + "/", "").replace(tmp_dir, "")
    if isinstance(exc, PackageFormatError) and text.startswith(_NOT_A_PACKAGE):
        text = f"{text} ({PACK_HINT})"
    return f"{type(exc).__name__}: {text}"


@dataclass(frozen=True)
class ModelRecord:
    """A stored package (without its archive bytes); ``corrupt``: why its stored archive is
    unusable (:mod:`fleet.registry.integrity`), None while it is sound."""

    name: str
    version: int
    archive_sha256: str
    size: int
    key_id: str
    description: str
    uploaded_at: dt.datetime
    uploaded_by: str
    manifest: dict[str, Any]
    corrupt: str | None = None


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


_COLUMNS = (
    models.c.name, models.c.version, models.c.archive_sha256, models.c.size, models.c.key_id,
    models.c.uploaded_at, models.c.uploaded_by, models.c.manifest, models.c.corrupt_reason,
)


def _record(row: Any) -> ModelRecord:
    manifest = dict(row.manifest)
    return ModelRecord(
        name=row.name, version=int(row.version), archive_sha256=row.archive_sha256,
        size=int(row.size), key_id=row.key_id, description=str(manifest.get("description", "")),
        uploaded_at=row.uploaded_at, uploaded_by=row.uploaded_by, manifest=manifest,
        corrupt=row.corrupt_reason,
    )


class ModelRegistry:
    """Stores and lists model packages.

    Args:
        engine: The fleet database (migrated to 0002 or later).
        trusted_keys: ``{key_id: public key}`` an upload must be signed by (empty: refuse all).
        max_unpacked_bytes: Limit of an upload's unpacked size, bytes.
        clock: Wall clock for ``uploaded_at`` (aware UTC).
        verified: The check of a downloaded archive against its sha256 (keeps verified
            archives, up to 64 MiB, so a repeated download compares instead of hashing).
    """

    def __init__(
        self,
        engine: Engine,
        trusted_keys: dict[str, Ed25519PublicKey],
        *,
        max_unpacked_bytes: int = 256 * 1024 * 1024,
        clock: Callable[[], dt.datetime] = _now,
        verified: integrity.VerifiedArchives | None = None,
    ) -> None:
        self._engine = engine
        self._trusted = trusted_keys
        self._max_unpacked = max_unpacked_bytes
        self._clock = clock
        self.verified = verified if verified is not None else integrity.VerifiedArchives()

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """One database transaction (commit on success) for :meth:`add` with ``conn`` and what
        must commit with it (a rollout, the retraining job's completion)."""
        with self._engine.begin() as conn:
            yield conn

    def add(self, archive: bytes, uploaded_by: str, conn: Connection | None = None) -> ModelRecord:
        """Verify and store an uploaded archive.

        Args:
            archive: The package archive (tar.gz bytes).
            uploaded_by: Who stored it (an operator's name, ``retrain``).
            conn: Store inside this transaction (the caller's: the package exists only if the
                caller commits); a new transaction when None.

        Raises:
            Unprocessable: not a valid package, unsigned, signed by an untrusted key, or an
                artefact hash differs (``detail`` starts with the error class, e.g.
                ``SignatureError: ...``).
            Conflict: ``(name, version)`` is already stored.
        """
        if not self._trusted:
            raise Unprocessable("SignatureError: the fleet has no trusted keys (--trusted-keys)")
        with tempfile.TemporaryDirectory(prefix="edge-fleet-upload-") as tmp:
            src = Path(tmp) / "upload.tar.gz"
            src.write_bytes(archive)
            pkg = Path(tmp) / "pkg"
            try:
                manifest = unpack_verified(src, pkg, self._trusted, max_bytes=self._max_unpacked)
                raw, _ = read_manifest(pkg)
                canonical = Path(tmp) / "canonical.tar.gz"
                sha = pack(pkg, canonical)
            except PackageError as exc:
                raise Unprocessable(upload_error(exc, tmp)) from None
            data = canonical.read_bytes()
        bad = unstorable(raw, "manifest")
        if bad is None and type(raw.get("version")) is not int:  # the schema reads "7", 7.0, true
            bad = f"manifest.version: {raw.get('version')!r} is not a JSON integer"
        if bad is None and not 1 <= manifest.version <= INT64_MAX:
            bad = "manifest.version: out of range"
        if bad is not None:
            raise Unprocessable(f"PackageFormatError: {bad}")
        signature = manifest.signature or ""
        row = {
            "name": manifest.name, "version": manifest.version, "archive": data,
            "archive_sha256": sha, "size": len(data), "manifest": raw,
            "key_id": signature.split(":")[1], "uploaded_at": self._clock(),
            "uploaded_by": uploaded_by,
        }
        if conn is None:
            with self.transaction() as own:
                return self._insert(row, own)
        return self._insert(row, conn)

    def _insert(self, row: dict[str, Any], conn: Connection) -> ModelRecord:
        self.lock_name(row["name"], conn)
        if integrity.repair(conn, row):  # the same package again over a corrupt copy
            return self.get(row["name"], row["version"], conn)
        try:  # on PostgreSQL a conflict aborts the caller's transaction: it must roll back
            conn.execute(insert(models).values(**row))
        except IntegrityError:
            raise Conflict(
                f"{row['name']}@{row['version']} already exists: versions are immutable, "
                "bump the version"
            ) from None
        return self.get(row["name"], row["version"], conn)

    def lock_name(self, name: str, conn: Connection) -> None:
        """Take the registry's write lock on ``name`` until ``conn``'s transaction ends
        (module docstring); waits while another transaction holds it.

        On SQLite this is the database's write lock, taken by a write that changes nothing: it
        must come before any read of the transaction (a transaction that read first cannot
        upgrade once another wrote), and waits up to the busy timeout.

        Raises:
            sqlalchemy.exc.OperationalError: SQLite: the lock was not free within the busy
                timeout ("database is locked").
        """
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(CAST(:k AS integer), hashtext(:n))"),
                         {"k": VERSION_LOCK, "n": name})
        else:
            conn.execute(update(models).where(false()).values(version=models.c.version))

    def next_version(self, name: str, conn: Connection, *, above: int = 0) -> int:
        """The version to store ``name`` under in ``conn``'s transaction: one more than its
        newest stored version and than ``above`` (e.g. the version its base package carries).

        Takes :meth:`lock_name` first (call it before any other statement of the transaction),
        so the number stays free until the transaction ends; :meth:`add` the package through
        the same ``conn``.

        Raises:
            Unprocessable: no storable version is left above them (the newest or ``above`` is
                already the largest, 2**63 - 1).
        """
        self.lock_name(name, conn)
        newest = conn.execute(
            select(func.max(models.c.version)).where(models.c.name == name)
        ).scalar()
        return version_above(name, max(above, int(newest or 0)))

    def get(self, name: str, version: int, conn: Connection | None = None) -> ModelRecord:
        """The package's record (read through ``conn`` when given). Raises: NotFound."""
        if conn is None:
            with self._engine.connect() as own:
                return self.get(name, version, own)
        row = conn.execute(
            select(*_COLUMNS).where(models.c.name == name, models.c.version == version)
        ).first()
        if row is None:
            raise NotFound(f"model {name}@{version} is not in the registry")
        return _record(row)

    def exists(self, name: str, version: int) -> bool:
        with self._engine.connect() as conn:
            n = conn.execute(
                select(func.count()).where(models.c.name == name, models.c.version == version)
            ).scalar_one()
        return bool(n)

    def archive(self, name: str, version: int) -> tuple[bytes, str]:
        """The archive bytes and their sha256, checked against each other (read from the
        database every time; hashed unless equal to bytes already verified:
        :class:`fleet.registry.integrity.VerifiedArchives`).

        Raises:
            NotFound: no such package.
            CorruptArchive: the stored archive does not hash to its recorded sha256 (the
                package is marked corrupt: :mod:`fleet.registry.integrity`).
        """
        with self._engine.connect() as conn:
            row = conn.execute(
                select(models.c.archive, models.c.archive_sha256).where(
                    models.c.name == name, models.c.version == version
                )
            ).first()
        if row is None:
            raise NotFound(f"model {name}@{version} is not in the registry")
        data, sha = bytes(row.archive), str(row.archive_sha256)
        actual = self.verified.mismatch(name, version, data, sha)
        if actual is not None:
            reason = integrity.corrupt_reason(name, version, sha, actual, len(data))
            with self._engine.begin() as conn:
                integrity.mark_corrupt(conn, name, version, data, reason, self._clock())
            raise CorruptArchive(reason)
        return data, sha

    def list(self, name: str | None = None) -> list[ModelRecord]:
        """Every package (or those of ``name``), by name then version."""
        q = select(*_COLUMNS).order_by(models.c.name, models.c.version)
        if name is not None:
            q = q.where(models.c.name == name)
        with self._engine.connect() as conn:
            return [_record(r) for r in conn.execute(q)]


def version_above(name: str, version: int) -> int:
    """``version`` + 1, the next version of ``name``.

    Raises:
        Unprocessable: ``version`` is already the largest storable one (2**63 - 1).
    """
    if version >= INT64_MAX:
        raise Unprocessable(f"PackageFormatError: {name}@{version} is the largest version the "
                            f"registry stores ({INT64_MAX}): no version is left above it")
    return version + 1
