"""cloud_sync.archive: the signed manifest first, bounded tar headers and bytes, named members."""

from __future__ import annotations

import io
import shutil
import tarfile
import tracemalloc
from pathlib import Path

import pytest

from cloud_sync.archive import unpack_verified
from cloud_sync.errors import HashMismatch, PackageFormatError, SignatureError
from cloud_sync.manifest import Manifest
from cloud_sync.package import generate_keypair, load_public_keys, pack, unpack
from tests.integration.model_fleet import (
    flip_byte,
    make_package,
    pax_bomb,
    tar_gz,
    tar_gz_with,
)

MAX = 64 * 1024 * 1024


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    """(private key file, its directory of public keys)."""
    priv, _ = generate_keypair(tmp_path / "keys", "ops-1")
    return priv, priv.parent


def _write(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "in.tar.gz"
    path.write_bytes(data)
    return path


def _nothing_written(root: Path) -> bool:
    return not root.exists() or not any(root.iterdir())


def test_valid_package_round_trips_and_check_sees_the_verified_manifest(
    tmp_path: Path, keys: tuple[Path, Path]
) -> None:
    pkg = make_package(tmp_path / "src", 3, keys[0])
    archive = tmp_path / "p.tar.gz"
    pack(pkg, archive)
    seen: list[Manifest] = []
    m = unpack_verified(archive, tmp_path / "out" / "pkg", load_public_keys(keys[1]),
                        max_bytes=MAX, check=seen.append)
    assert m.version == 3 and [x.version for x in seen] == [3]
    assert sorted(p.name for p in (tmp_path / "out" / "pkg").iterdir()) == sorted(
        p.name for p in pkg.iterdir())
    assert (tmp_path / "out" / "pkg" / "manifest.json").read_bytes() == (
        pkg / "manifest.json").read_bytes()


def test_untrusted_signature_is_refused_before_anything_is_written(
    tmp_path: Path, keys: tuple[Path, Path]
) -> None:
    """A stranger's package with a corrupt artefact too: the signature fails first, no file is
    written and the caller's check never runs."""
    stranger, _ = generate_keypair(tmp_path / "stranger")
    pkg = make_package(tmp_path / "src", 3, stranger)
    flip_byte(pkg)
    out = tmp_path / "out"
    out.mkdir()
    called: list[Manifest] = []
    with pytest.raises(SignatureError, match="not trusted"):
        unpack_verified(_write(tmp_path, tar_gz(pkg)), out / "pkg", load_public_keys(keys[1]),
                        max_bytes=MAX, check=called.append)
    assert called == [] and _nothing_written(out)


def test_member_not_named_by_the_manifest_is_refused(
    tmp_path: Path, keys: tuple[Path, Path]
) -> None:
    pkg = make_package(tmp_path / "src", 3, keys[0])
    out = tmp_path / "out"
    out.mkdir()
    for extra in ({"payload.bin": b"x" * 4096}, {"a-first.bin": b"y"}):  # after / before
        data = tar_gz_with(pkg, extra)
        with pytest.raises(PackageFormatError, match="not named by the signed manifest"):
            unpack_verified(_write(tmp_path, data), out / "pkg", load_public_keys(keys[1]),
                            max_bytes=MAX)
        assert _nothing_written(out)


def test_member_of_another_size_or_hash_is_refused(
    tmp_path: Path, keys: tuple[Path, Path]
) -> None:
    pkg = make_package(tmp_path / "src", 3, keys[0])
    out = tmp_path / "out"
    out.mkdir()
    longer = pkg / "model.int8.onnx"
    grown = tmp_path / "grown"
    shutil.copytree(pkg, grown)
    (grown / "model.int8.onnx").write_bytes(longer.read_bytes() + b"\0")
    with pytest.raises(PackageFormatError, match="the signed manifest says"):
        unpack_verified(_write(tmp_path, tar_gz(grown)), out / "pkg",
                        load_public_keys(keys[1]), max_bytes=MAX)
    flip_byte(pkg)
    with pytest.raises(HashMismatch):
        unpack_verified(_write(tmp_path, tar_gz(pkg)), out / "pkg", load_public_keys(keys[1]),
                        max_bytes=MAX)
    assert _nothing_written(out)


def test_pax_bomb_is_refused_without_reading_the_header(
    tmp_path: Path, keys: tuple[Path, Path]
) -> None:
    """A 1 MB archive whose PAX header announces 1 GiB: refused at the header; the peak of
    Python allocations stays far below it (tarfile alone reads the whole header)."""
    archive = _write(tmp_path, pax_bomb(1 << 30))
    out = tmp_path / "out"
    for run in (
        lambda: unpack_verified(archive, out / "pkg", load_public_keys(keys[1]), max_bytes=MAX),
        lambda: unpack(archive, out / "pkg"),
    ):
        tracemalloc.start()
        try:
            with pytest.raises(PackageFormatError, match="meta header"):
                run()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        print(f"peak Python allocations while refusing a 1 GiB PAX header: {peak / 1e6:.1f} MB")
        assert peak < 32 * 1024 * 1024
        assert _nothing_written(out)


def test_bytes_read_are_bounded(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    """An unnamed 16 MiB member BEFORE manifest.json (not judged yet) with a 1 MiB limit:
    refused once the read passes the limit."""
    pkg = make_package(tmp_path / "src", 3, keys[0])
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("a-zeros.bin")
        info.size = 16 << 20
        tar.addfile(info, io.BytesIO(b"\0" * info.size))
        for f in sorted(pkg.iterdir()):
            tar.add(f, arcname=f.name)
    with pytest.raises(PackageFormatError, match="decompresses to more than"):
        unpack_verified(_write(tmp_path, buf.getvalue()), tmp_path / "out",
                        load_public_keys(keys[1]), max_bytes=1 << 20)
    with pytest.raises(PackageFormatError, match="unpacks to over"):
        unpack(_write(tmp_path, buf.getvalue()), tmp_path / "out2", max_bytes=1 << 20)
    assert not (tmp_path / "out").exists() and not (tmp_path / "out2").exists()


def test_package_larger_than_the_limit_is_refused_at_the_manifest(
    tmp_path: Path, keys: tuple[Path, Path]
) -> None:
    pkg = make_package(tmp_path / "src", 3, keys[0])
    archive = tmp_path / "p.tar.gz"
    pack(pkg, archive)
    with pytest.raises(PackageFormatError, match="at most 10000"):
        unpack_verified(archive, tmp_path / "out", load_public_keys(keys[1]), max_bytes=10_000)


@pytest.mark.parametrize("kind", [tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.GNUTYPE_SPARSE,
                                  tarfile.CONTTYPE, tarfile.FIFOTYPE])
def test_non_regular_members_are_refused(tmp_path: Path, keys: tuple[Path, Path],
                                         kind: bytes) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.GNU_FORMAT) as tar:
        info = tarfile.TarInfo("model.int8.onnx")
        info.type = kind
        info.linkname = "/etc/passwd" if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE) else ""
        tar.addfile(info)
    with pytest.raises(PackageFormatError):
        unpack_verified(_write(tmp_path, buf.getvalue()), tmp_path / "out",
                        load_public_keys(keys[1]), max_bytes=MAX)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("major", "minor"), [("0", "0"), ("0", "1"), ("1", "0")])
def test_pax_sparse_members_are_refused_at_their_header(
    tmp_path: Path, keys: tuple[Path, Path], major: str, minor: str
) -> None:
    """PAX GNU.sparse.* (format 1.0 reads a sparse map of any announced length from the data)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("model.int8.onnx")
        info.size = 512
        info.pax_headers = {"GNU.sparse.major": major, "GNU.sparse.minor": minor,
                            "GNU.sparse.name": "model.int8.onnx", "GNU.sparse.realsize": "512",
                            "GNU.sparse.size": "512", "GNU.sparse.numblocks": "1",
                            "GNU.sparse.offset": "0", "GNU.sparse.numbytes": "512",
                            "GNU.sparse.map": "0,512"}
        tar.addfile(info, io.BytesIO(b"1\n0\n512\n".ljust(512, b"\0")))
    for run in (
        lambda: unpack_verified(_write(tmp_path, buf.getvalue()), tmp_path / "out",
                                load_public_keys(keys[1]), max_bytes=MAX),
        lambda: unpack(_write(tmp_path, buf.getvalue()), tmp_path / "out"),
    ):
        with pytest.raises(PackageFormatError, match="sparse"):
            run()
    assert not (tmp_path / "out").exists()


def test_a_pax_size_that_is_negative_is_refused(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("model.int8.onnx")
        info.size = 4
        info.pax_headers = {"size": "-5"}
        tar.addfile(info, io.BytesIO(b"abcd"))
    with pytest.raises(PackageFormatError, match="negative size"):
        unpack(_write(tmp_path, buf.getvalue()), tmp_path / "out")
    with pytest.raises(PackageFormatError, match="negative size"):
        unpack_verified(_write(tmp_path, buf.getvalue()), tmp_path / "out",
                        load_public_keys(keys[1]), max_bytes=MAX)
