"""Model package archives and their verification (format: :mod:`cloud_sync.manifest`).

A package is a directory holding ``manifest.json`` and the artefacts it names. On the wire it is
a deterministic tar.gz (:func:`pack`): members ``manifest.json`` plus each artefact path, sorted by
name, regular files only (no directory entries), mtime 0, uid/gid 0, empty owner names, mode
0644, ustar format, gzip header with mtime 0 and no file name. The same directory always packs to
the same bytes, so the archive sha256 identifies a package (the fleet's ``ETag``).

Signature rule:

* Packages that arrive from the fleet MUST carry a valid Ed25519 manifest signature by a trusted
  key (:func:`verify_package_dir`); the fleet also refuses unsigned uploads.
* Builtin packages shipped inside the agent's own install (``models/``) are unsigned but hashed:
  they are as trusted as the agent code next to them. Load them with :func:`verify_hashes`.
  Signing touches only ``manifest.json`` (:func:`sign_package_dir`), so artefact hashes stay valid.

Anti-rollback: a fleet package must be newer than the installed version, unless a
:class:`~cloud_sync.protocol.SignedRollback` signed by a ROLLBACK key (a trust set separate from
the package keys) names exactly this device, stream, model name, installed version
(``from_version``) and package version (``to_version``) and is fresh (:mod:`cloud_sync.rollback`).

Archives from the network: :func:`cloud_sync.archive.unpack_verified` (signed manifest first,
bounded headers and bytes, only the members the manifest names). :func:`unpack` extracts any
safe archive within the same bounds, without verifying it.

Keys and signatures: :mod:`cloud_sync.signing` (re-exported here). Errors:
:mod:`cloud_sync.errors` (``PackageError`` and its subclasses).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
import time
from pathlib import Path, PurePosixPath
from typing import IO, Any

from cloud_sync.archive import (
    MANIFEST,
    MAX_MANIFEST_BYTES,
    build_dir,
    iter_files,
    open_bounded,
    parse_manifest_bytes,
    read_limit,
    safe_relpath,
)
from cloud_sync.errors import (
    HashMismatch,
    KeyFileError,
    PackageError,
    PackageFormatError,
    RollbackRefused,
    SignatureError,
)
from cloud_sync.manifest import Manifest
from cloud_sync.protocol import SignedRollback
from cloud_sync.rollback import RollbackPolicy, check_rollback
from cloud_sync.signing import (
    TrustedKeys,
    fingerprint,
    generate_keypair,
    key_id_of,
    load_private_key,
    load_public_key,
    load_public_keys,
    sign_manifest,
    sign_rollback,
    verify_manifest,
    verify_rollback,
)

__all__ = [
    "MANIFEST",
    "MAX_MANIFEST_BYTES",
    "MAX_MEMBERS",
    "MAX_UNPACKED_BYTES",
    "HashMismatch",
    "KeyFileError",
    "PackageError",
    "PackageFormatError",
    "RollbackRefused",
    "SignatureError",
    "TrustedKeys",
    "fingerprint",
    "generate_keypair",
    "key_id_of",
    "load_private_key",
    "load_public_key",
    "load_public_keys",
    "pack",
    "read_manifest",
    "sha256_file",
    "sign_manifest",
    "sign_package_dir",
    "sign_rollback",
    "unpack",
    "verify_hashes",
    "verify_manifest",
    "verify_package_dir",
    "verify_rollback",
]

#: Default limit of the total unpacked size, bytes.
MAX_UNPACKED_BYTES = 512 * 1024 * 1024
#: Most members an archive may hold.
MAX_MEMBERS = 256
_CHUNK = 1024 * 1024


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes (read in 1 MiB chunks)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def read_manifest(directory: Path) -> tuple[dict[str, Any], Manifest]:
    """Read ``directory/manifest.json``: the raw dict (what is signed) and the parsed model.

    Raises:
        PackageFormatError: missing, too large, a symlink, not JSON, or fails the schema.
    """
    where = str(directory)
    path = directory / MANIFEST
    if path.is_symlink() or not path.is_file():
        raise PackageFormatError(f"{MANIFEST} is missing or not a regular file", package=where)
    with path.open("rb") as f:
        data = f.read(MAX_MANIFEST_BYTES + 1)
    return parse_manifest_bytes(data, where)


def verify_hashes(directory: Path) -> Manifest:
    """Parse the manifest and check every artefact's size and sha256 (no signature check).

    Use this alone only for builtin packages from the agent's own install.

    Raises:
        PackageFormatError: bad manifest, unsafe/duplicate artefact path, missing artefact or a
            symlink.
        HashMismatch: an artefact's size or sha256 differs from the manifest.
    """
    _, manifest = read_manifest(directory)
    where = f"{manifest.name}@{manifest.version}"
    seen: set[str] = set()
    for art in manifest.artefacts:
        rel = safe_relpath(art.path, where)
        if art.path in seen or art.path == MANIFEST:
            raise PackageFormatError(f"artefact path {art.path!r} used twice", package=where)
        seen.add(art.path)
        path = directory.joinpath(*rel.parts)
        if path.is_symlink() or not path.is_file():
            raise PackageFormatError(f"artefact {art.path} is missing", package=where)
        size = path.stat().st_size
        if size != art.size_bytes:
            raise HashMismatch(
                f"artefact {art.path} is {size} bytes, manifest says {art.size_bytes}", where
            )
        digest = sha256_file(path)
        if digest != art.sha256:
            raise HashMismatch(
                f"artefact {art.path} sha256 {digest} != manifest {art.sha256}", package=where
            )
    return manifest


def verify_package_dir(
    directory: Path,
    trusted_keys: TrustedKeys,
    installed_version: int | None,
    rollback: SignedRollback | None = None,
    *,
    device_id: str | None = None,
    stream: str | None = None,
    rollback_policy: RollbackPolicy | None = None,
    now: float | None = None,
    rollout_id: int | None = None,
) -> Manifest:
    """Everything a device checks before installing a package directory that came from the fleet.

    Order: manifest format, signature (package keys), artefact sizes and hashes, anti-rollback
    (:func:`cloud_sync.rollback.check_rollback`: rollback keys, binding, age). The updater
    checks archives with :func:`cloud_sync.archive.unpack_verified` instead, before unpacking.

    Args:
        directory: An unpacked package (see :func:`unpack`).
        trusted_keys: Package-signing keys ``{key_id: public key}`` (:func:`load_public_keys`).
        installed_version: Version of this model name installed now, or None for none.
        rollback: Permission to install an older (or the same) version.
        device_id: This device's id; a rollback applies only when it names it.
        stream: The stream; a rollback applies only when it names it.
        rollback_policy: Rollback keys and ages (None: no rollback is accepted).
        now: Wall clock, epoch seconds UTC (default: now).
        rollout_id: The assignment's rollout; a rollback applies only when it names it.

    Returns:
        The parsed manifest.

    Raises:
        PackageFormatError: not a valid package.
        SignatureError: unsigned, untrusted key, or the signature fails.
        HashMismatch: an artefact differs from the manifest.
        RollbackRefused: ``version <= installed_version`` and ``rollback`` is absent, not for
            this device/stream/name/versions, expired, or not validly signed by a rollback key.
    """
    raw, manifest = read_manifest(directory)
    where = f"{manifest.name}@{manifest.version}"
    try:
        verify_manifest(raw, trusted_keys)
    except SignatureError as exc:
        raise SignatureError(str(exc), package=where) from exc
    verify_hashes(directory)
    if installed_version is None or manifest.version > installed_version:
        return manifest
    check_rollback(
        rollback, device_id=device_id, stream=stream, name=manifest.name,
        from_version=installed_version, to_version=manifest.version, policy=rollback_policy,
        now=time.time() if now is None else now, where=where, rollout_id=rollout_id,
    )
    return manifest


def sign_package_dir(directory: Path, private_key_path: Path) -> str:
    """Sign ``directory/manifest.json`` in place with a key file (key id = its stem).

    Hashes are checked first: signing a package whose artefacts do not match is refused.
    The file is rewritten as JSON with a 1-space indent (formatting is not signed).

    Returns:
        The key id used.

    Raises:
        KeyFileError: the key cannot be loaded.
        PackageFormatError, HashMismatch: the package is not valid.
    """
    key = load_private_key(private_key_path)
    kid = key_id_of(private_key_path)
    verify_hashes(directory)
    raw, _ = read_manifest(directory)
    signed = sign_manifest(raw, key, kid)
    tmp = directory / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(signed, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, directory / MANIFEST)
    return kid


def pack(package_dir: Path, out_path: Path) -> str:
    """Write the deterministic tar.gz of a package directory (see the module docstring).

    Only ``manifest.json`` and the artefacts it names are packed; hashes are checked first.

    Returns:
        Hex sha256 of the archive written to ``out_path``.

    Raises:
        PackageFormatError, HashMismatch: the directory is not a valid package.
    """
    manifest = verify_hashes(package_dir)
    names = sorted([MANIFEST, *(a.path for a in manifest.artefacts)])
    buf = io.BytesIO()
    with (
        gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.USTAR_FORMAT) as tar,
    ):
        for name in names:
            path = package_dir.joinpath(*PurePosixPath(name).parts)
            info = tarfile.TarInfo(name)
            info.size = path.stat().st_size
            info.mtime = 0
            info.mode = 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.type = tarfile.REGTYPE
            with path.open("rb") as f:
                tar.addfile(info, f)
    data = buf.getvalue()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(f".{out_path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, out_path)
    return hashlib.sha256(data).hexdigest()


def _copy_limited(src: IO[bytes], dst: IO[bytes], budget: int, where: str) -> int:
    written = 0
    while chunk := src.read(min(_CHUNK, budget - written + 1)):
        written += len(chunk)
        if written > budget:
            raise PackageFormatError("archive unpacks to more than the size limit", where)
        dst.write(chunk)
    return written


def unpack(
    archive: Path,
    dest_dir: Path,
    *,
    max_bytes: int = MAX_UNPACKED_BYTES,
    max_members: int = MAX_MEMBERS,
) -> None:
    """Safely extract a package archive into ``dest_dir`` (which must not exist yet).

    Only regular files (and directory entries, ignored) with safe relative names are accepted;
    files are written with mode 0644. Extraction goes to a temporary sibling directory that is
    renamed to ``dest_dir`` only when everything succeeded, so a failure leaves nothing behind.
    This does not verify the package: call :func:`verify_package_dir` next.

    Args:
        archive: The tar.gz file.
        dest_dir: Directory to create.
        max_bytes: Limit of the total extracted size (bytes; guards against gzip bombs).
        max_members: Limit of the number of entries.

    Raises:
        PackageFormatError: not a gzip tar; an entry that is absolute, has ``..``, is a symlink,
            hard link, device or FIFO; a duplicate name; too many entries or too many bytes;
            ``dest_dir`` exists.
    """
    where = str(archive)
    build_dir(dest_dir, lambda tmp: _extract(archive, tmp, max_bytes, max_members, where), where)


def _extract(archive: Path, dest: Path, max_bytes: int, max_members: int, where: str) -> None:
    total = 0
    with open_bounded(archive, read_limit(max_bytes, max_members), where) as tar:
        for member in iter_files(tar, where, max_members):
            if total + member.size > max_bytes:
                raise PackageFormatError(f"archive unpacks to over {max_bytes} bytes", where)
            target = dest.joinpath(*safe_relpath(member.name, where).parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            src = tar.extractfile(member)
            if src is None:  # pragma: no cover - regular members always have data
                raise PackageFormatError(f"entry {member.name!r} has no data", where)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            with src, os.fdopen(fd, "wb") as dst:
                total += _copy_limited(src, dst, max_bytes - total, where)
