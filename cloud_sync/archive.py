"""Reading package archives that nobody vouches for yet: bounded, and the signed manifest first.

A package archive (format: :mod:`cloud_sync.package`) comes from the network. Reading it:

* every byte decompressed is counted, and reading stops past a limit (gzip bombs);
* PAX extended headers and GNU long-name headers are refused past :data:`MAX_META_BYTES` each and
  :data:`MAX_META_HEADERS` per archive BEFORE Python's :mod:`tarfile` reads them (it reads a
  header's whole announced size into memory: a 1 GiB PAX header in a 1 MB archive is 1 GiB);
* only regular files and directory entries with safe relative names (no ``..``, absolute path,
  backslash or NUL); links, devices, FIFOs, sparse (GNU or PAX) and continued files are refused
  (sparse maps are refused as their headers are read: their extension chains have no bound).

:func:`unpack_verified` reads the archive twice. Pass 1 writes nothing: it finds
``manifest.json`` (at most :data:`MAX_MANIFEST_BYTES`), checks its Ed25519 signature with the
package-signing keys and its schema, checks that the archive holds exactly the manifest and the
artefacts it names, each of the size it names (any other member is refused), and runs the
caller's check (anti-rollback). Pass 2 extracts the artefacts, hashing while writing, and writes
the manifest bytes verified in pass 1. Nothing is written before the signature is verified, and
at most the manifest's total size is written.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import tarfile
import tempfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import IO, Any, Protocol, cast

from pydantic import ValidationError

from cloud_sync.errors import HashMismatch, PackageFormatError, SignatureError
from cloud_sync.manifest import Manifest
from cloud_sync.signing import TrustedKeys, verify_manifest

MANIFEST = "manifest.json"
#: Largest manifest.json read, bytes.
MAX_MANIFEST_BYTES = 4 * 1024 * 1024
#: Largest PAX extended header or GNU long name/link header, bytes (``pack`` writes none).
MAX_META_BYTES = 16 * 1024
#: Most PAX/GNU meta headers in one archive.
MAX_META_HEADERS = 512
#: Bytes read for tar headers and padding beyond the members' data (per member: header, one
#: meta header at most, padding; plus the end-of-archive blocks and the read-ahead).
_SLACK_PER_MEMBER = 2 * 512 + MAX_META_BYTES
_SLACK = 64 * 1024
_CHUNK = 1024 * 1024
_META_TYPES = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE,
               tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)
_REGULAR = (tarfile.REGTYPE, tarfile.AREGTYPE)


class _Limit(Exception):
    """A bound was hit inside :mod:`tarfile`'s reading (internal; carries the reason)."""


class _BoundedTarInfo(tarfile.TarInfo):
    """Refuses an oversized or excess meta header before :mod:`tarfile` reads it.

    ``_proc_member`` is the hook :mod:`tarfile` documents for subclasses ("can be overridden in
    a subclass"); chained headers go through it again (``self.fromtarfile``).
    """

    def _proc_member(self, tf: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type == tarfile.GNUTYPE_SPARSE:  # its extension headers chain without a bound
            raise _Limit(f"entry {self.name!r} is a sparse file (refused)")
        if self.type in _META_TYPES:
            if self.size > MAX_META_BYTES:
                raise _Limit(f"a tar meta header (PAX or GNU long name) of {self.size} bytes; "
                             f"at most {MAX_META_BYTES} are read")
            if isinstance(tf, _BoundedTarFile):
                tf.meta_headers += 1
                if tf.meta_headers > MAX_META_HEADERS:
                    raise _Limit(f"more than {MAX_META_HEADERS} tar meta headers")
        member: tarfile.TarInfo = super()._proc_member(tf)  # type: ignore[misc]
        return member


    def _no_sparse(self, *_args: object) -> None:
        # PAX GNU.sparse.* records: format 1.0 reads a map of any announced length from the
        # data; no package is sparse, so every PAX sparse format is refused outright
        raise _Limit("a PAX header describes a sparse file (refused)")

    _proc_gnusparse_00 = _proc_gnusparse_01 = _proc_gnusparse_10 = _no_sparse


class _BoundedTarFile(tarfile.TarFile):
    tarinfo = _BoundedTarInfo
    meta_headers = 0


class _Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


class _Counted:
    """A read-only stream that refuses to deliver more than ``limit`` bytes in total."""

    def __init__(self, raw: _Readable, limit: int) -> None:
        self._raw = raw
        self._left = limit
        self.limit = limit

    def read(self, size: int = -1) -> bytes:
        """At most ``size`` bytes (``size < 0``: at most 1 MiB; tarfile never asks for all)."""
        want = min(_CHUNK if size < 0 else size, self._left + 1)
        data = self._raw.read(want)
        self._left -= len(data)
        if self._left < 0:
            raise _Limit(f"the archive decompresses to more than {self.limit} bytes")
        return data


def read_limit(max_bytes: int, max_members: int) -> int:
    """Decompressed bytes an archive of at most ``max_bytes`` of data may take to read."""
    return max_bytes + max_members * _SLACK_PER_MEMBER + _SLACK


@contextmanager
def open_bounded(archive: Path, max_read: int, where: str) -> Iterator[tarfile.TarFile]:
    """Open a tar.gz for one sequential pass, reading at most ``max_read`` decompressed bytes.

    Raises:
        PackageFormatError: not a gzip tar, a bound was hit (also while iterating).
    """
    try:
        with gzip.open(archive, "rb") as gz:
            counted = _Counted(gz, max_read)
            stream = cast(IO[bytes], counted)  # "r|" only calls read()
            with _BoundedTarFile.open(fileobj=stream, mode="r|") as tar:
                yield tar
    except _Limit as exc:
        raise PackageFormatError(f"archive refused: {exc}", where) from None
    except RecursionError:
        raise PackageFormatError("archive refused: tar headers nest too deeply", where) from None
    except (tarfile.TarError, EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise PackageFormatError(f"not a valid tar.gz archive: {exc}", where) from exc


def safe_relpath(name: str, where: str) -> PurePosixPath:
    """A relative POSIX path with no ``..``, no absolute part, no backslash or NUL.

    Raises:
        PackageFormatError: the name is unsafe.
    """
    p = PurePosixPath(name)
    if (
        not name
        or "\\" in name
        or "\x00" in name
        or p.is_absolute()
        or any(part in ("..", "") for part in name.split("/"))
        or name.startswith("./")
    ):
        raise PackageFormatError(f"unsafe path {name!r}", package=where)
    return p


def iter_files(tar: tarfile.TarFile, where: str, max_members: int) -> Iterator[tarfile.TarInfo]:
    """The regular-file members of ``tar`` (directory entries skipped), each checked.

    Raises:
        PackageFormatError: more than ``max_members`` entries, an unsafe name, a member that is
            not a regular file or directory, a name seen twice.
    """
    seen: set[str] = set()
    for count, member in enumerate(tar, start=1):
        if count > max_members:
            raise PackageFormatError(f"archive has more than {max_members} entries", where)
        name = member.name.removesuffix("/") if member.isdir() else member.name
        safe_relpath(name, where)
        if member.isdir():
            continue
        if member.size < 0:
            raise PackageFormatError(f"entry {member.name!r} has a negative size", where)
        if member.type not in _REGULAR or member.sparse is not None:
            raise PackageFormatError(
                f"entry {member.name!r} is not a regular file (links, devices, FIFOs, sparse "
                "and continued files are refused)", where)
        if name in seen:
            raise PackageFormatError(f"entry {name!r} appears twice", where)
        seen.add(name)
        yield member


def parse_manifest_bytes(data: bytes, where: str) -> tuple[dict[str, Any], Manifest]:
    """Parse manifest.json bytes: the raw dict (what is signed) and the model.

    Raises:
        PackageFormatError: too large, not a JSON object, or fails the schema.
    """
    if len(data) > MAX_MANIFEST_BYTES:
        raise PackageFormatError(f"{MANIFEST} exceeds {MAX_MANIFEST_BYTES} bytes", where)
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise PackageFormatError(f"{MANIFEST} is not JSON: {exc}", package=where) from exc
    except RecursionError:  # "[[[[..." deeper than the parser's recursion limit
        raise PackageFormatError(f"{MANIFEST} nests too deeply", package=where) from None
    if not isinstance(raw, dict):
        raise PackageFormatError(f"{MANIFEST} is not a JSON object", package=where)
    try:
        manifest = Manifest.model_validate(raw)
    except ValidationError as exc:
        raise PackageFormatError(f"{MANIFEST} fails the schema: {exc}", package=where) from exc
    return raw, manifest


def _read_member(tar: tarfile.TarFile, member: tarfile.TarInfo, limit: int, where: str) -> bytes:
    if member.size > limit:
        raise PackageFormatError(f"{member.name} is {member.size} bytes, at most {limit}", where)
    src = tar.extractfile(member)
    if src is None:  # pragma: no cover - regular members always have data
        raise PackageFormatError(f"entry {member.name!r} has no data", where)
    with src:
        return src.read(limit + 1)


def _verified_manifest(
    data: bytes, trusted_keys: TrustedKeys, max_bytes: int, where: str
) -> tuple[Manifest, dict[str, int]]:
    raw, manifest = parse_manifest_bytes(data, where)
    label = f"{manifest.name}@{manifest.version}"
    try:
        verify_manifest(raw, trusted_keys)
    except SignatureError as exc:
        raise SignatureError(str(exc), package=label) from exc
    sizes: dict[str, int] = {}
    for art in manifest.artefacts:
        safe_relpath(art.path, label)
        if art.path in sizes or art.path == MANIFEST:
            raise PackageFormatError(f"artefact path {art.path!r} used twice", package=label)
        sizes[art.path] = art.size_bytes
    total = sum(sizes.values()) + len(data)
    if total > max_bytes:
        raise PackageFormatError(f"the package is {total} bytes, at most {max_bytes}", label)
    return manifest, sizes


def _check_member(name: str, size: int, sizes: dict[str, int], label: str) -> None:
    if name not in sizes:
        raise PackageFormatError(
            f"archive member {name!r} is not named by the signed manifest (refused)", label)
    if size != sizes[name]:
        raise PackageFormatError(
            f"archive member {name!r} is {size} bytes, the signed manifest says {sizes[name]}",
            label)


def scan(
    archive: Path, trusted_keys: TrustedKeys, *, max_bytes: int, max_members: int
) -> tuple[bytes, Manifest]:
    """Pass 1 of :func:`unpack_verified` (writes nothing): the verified manifest bytes and model.

    Raises:
        PackageFormatError: see the module docstring; no manifest; a member not named by the
            manifest or of another size; an artefact missing from the archive.
        SignatureError: the manifest is unsigned, by an untrusted key, or does not verify.
    """
    where = str(archive)
    early: dict[str, int] = {}
    found: tuple[bytes, Manifest, dict[str, int]] | None = None
    seen: set[str] = set()
    with open_bounded(archive, read_limit(max_bytes, max_members), where) as tar:
        for member in iter_files(tar, where, max_members):
            seen.add(member.name)
            if member.name == MANIFEST:
                data = _read_member(tar, member, MAX_MANIFEST_BYTES, where)
                manifest, sizes = _verified_manifest(data, trusted_keys, max_bytes, where)
                found = (data, manifest, sizes)
                for name, size in early.items():
                    _check_member(name, size, sizes, manifest_label(manifest))
            elif found is None:
                early[member.name] = member.size
            else:
                _check_member(member.name, member.size, found[2], manifest_label(found[1]))
    if found is None:
        raise PackageFormatError(f"archive holds no {MANIFEST}", where)
    data, manifest, sizes = found
    missing = sorted(set(sizes) - seen)
    if missing:
        raise PackageFormatError(f"artefacts missing from the archive: {missing}",
                                 manifest_label(manifest))
    return data, manifest


def unlisted_files(directory: Path, manifest: Manifest) -> list[str]:
    """Files under ``directory`` that are neither ``manifest.json`` nor a manifest artefact
    (relative POSIX paths, sorted; e.g. what an older agent installed from an archive)."""
    named = {MANIFEST, *(a.path for a in manifest.artefacts)}
    found = (p.relative_to(directory).as_posix() for p in directory.rglob("*")
             if not p.is_dir())
    return sorted(f for f in found if f not in named)


def manifest_label(manifest: Manifest) -> str:
    """``name@version``."""
    return f"{manifest.name}@{manifest.version}"


def unpack_verified(
    archive: Path,
    dest_dir: Path,
    trusted_keys: TrustedKeys,
    *,
    max_bytes: int,
    max_members: int = 256,
    check: Callable[[Manifest], None] | None = None,
) -> Manifest:
    """Verify the signed manifest of ``archive``, then extract exactly what it names.

    Extraction goes to a temporary sibling of ``dest_dir`` (which must not exist), renamed to
    it only when everything succeeded; a failure leaves nothing behind.

    Args:
        archive: The tar.gz file.
        dest_dir: Directory to create.
        trusted_keys: Package-signing keys ``{key_id: public key}``.
        max_bytes: Largest package (manifest plus artefacts), bytes.
        max_members: Most archive entries.
        check: Called with the verified manifest before anything is written (anti-rollback,
            "is it the assigned package"); what it raises propagates.

    Returns:
        The verified manifest.

    Raises:
        PackageFormatError, SignatureError: see :func:`scan`.
        HashMismatch: an artefact's sha256 differs from the manifest.
    """
    manifest_bytes, manifest = scan(archive, trusted_keys, max_bytes=max_bytes,
                                    max_members=max_members)
    if check is not None:
        check(manifest)
    label = manifest_label(manifest)

    def fill(tmp: Path) -> None:
        _write_new(tmp / MANIFEST, manifest_bytes)
        _extract_named(archive, tmp, manifest, max_bytes, max_members)

    build_dir(dest_dir, fill, label)
    return manifest


def build_dir(dest_dir: Path, fill: Callable[[Path], None], where: str) -> None:
    """Create ``dest_dir`` (which must not exist) by ``fill`` of a temporary sibling directory,
    renamed to it only when ``fill`` succeeded; on any failure the sibling is removed.

    Raises:
        PackageFormatError: ``dest_dir`` exists, or entries collide (file vs directory).
    """
    if dest_dir.exists():
        raise PackageFormatError(f"destination {dest_dir} already exists", package=where)
    dest_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest_dir.name}.", dir=dest_dir.parent))
    try:
        fill(tmp)
        os.replace(tmp, dest_dir)
    except (FileExistsError, NotADirectoryError, IsADirectoryError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise PackageFormatError(f"entries collide (file vs directory): {exc}", where) from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _write_new(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _extract_named(
    archive: Path, dest: Path, manifest: Manifest, max_bytes: int, max_members: int
) -> None:
    label = manifest_label(manifest)
    arts = {a.path: a for a in manifest.artefacts}
    with open_bounded(archive, read_limit(max_bytes, max_members), label) as tar:
        for member in iter_files(tar, label, max_members):
            if member.name == MANIFEST:
                continue  # written from the bytes verified in pass 1
            art = arts.get(member.name)
            if art is None or member.size != art.size_bytes:
                raise PackageFormatError(f"archive member {member.name!r} changed between "
                                         "reads", label)
            target = dest.joinpath(*safe_relpath(member.name, label).parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            src = tar.extractfile(member)
            if src is None:  # pragma: no cover - regular members always have data
                raise PackageFormatError(f"entry {member.name!r} has no data", label)
            h = hashlib.sha256()
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            written = 0
            with src, os.fdopen(fd, "wb") as dst:
                while chunk := src.read(min(_CHUNK, art.size_bytes - written + 1)):
                    written += len(chunk)
                    if written > art.size_bytes:
                        raise PackageFormatError(f"{member.name} is longer than announced",
                                                 label)
                    h.update(chunk)
                    dst.write(chunk)
            if h.hexdigest() != art.sha256:
                raise HashMismatch(
                    f"artefact {art.path} sha256 {h.hexdigest()} != manifest {art.sha256}", label
                )
