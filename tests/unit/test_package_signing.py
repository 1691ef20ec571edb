"""cloud_sync.package: Ed25519 signing, deterministic archives, safe unpack, anti-rollback."""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
import tarfile
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from cloud_sync.package import (
    MANIFEST,
    HashMismatch,
    KeyFileError,
    PackageFormatError,
    RollbackRefused,
    SignatureError,
    fingerprint,
    generate_keypair,
    load_private_key,
    load_public_keys,
    pack,
    read_manifest,
    sign_manifest,
    sign_package_dir,
    sign_rollback,
    unpack,
    verify_hashes,
    verify_manifest,
    verify_package_dir,
)
from cloud_sync.protocol import SignedRollback
from cloud_sync.rollback import RollbackPolicy

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "skab-wstat"


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    return generate_keypair(tmp_path / "keys", "ops-1")


@pytest.fixture
def signed(tmp_path: Path, keys: tuple[Path, Path]) -> Path:
    dst = tmp_path / "pkg"
    shutil.copytree(SHIPPED, dst)
    sign_package_dir(dst, keys[0])
    return dst


def set_version(pkg: Path, version: int, key: Path) -> None:
    raw = json.loads((pkg / MANIFEST).read_text())
    raw["version"] = version
    (pkg / MANIFEST).write_text(json.dumps(raw))
    sign_package_dir(pkg, key)


def test_keypair_files(keys: tuple[Path, Path]) -> None:
    priv, pub = keys
    assert priv.name == "ops-1.key" and pub.name == "ops-1.pub"
    assert stat.S_IMODE(priv.stat().st_mode) == 0o600
    trusted = load_public_keys(priv.parent)
    assert list(trusted) == ["ops-1"]
    assert fingerprint(trusted["ops-1"]) == fingerprint(load_private_key(priv).public_key())
    with pytest.raises(KeyFileError):
        generate_keypair(priv.parent, "ops-1")  # never overwrite
    with pytest.raises(KeyFileError):
        load_private_key(pub)


def test_default_key_id_is_fingerprint(tmp_path: Path) -> None:
    priv, _ = generate_keypair(tmp_path)
    assert priv.stem == fingerprint(load_private_key(priv).public_key())
    assert len(priv.stem) == 16


def test_sign_verify_round_trip(keys: tuple[Path, Path]) -> None:
    trusted = load_public_keys(keys[0].parent)
    m: dict[str, Any] = {"name": "x", "version": 3, "signature": None}
    s = sign_manifest(m, load_private_key(keys[0]), "ops-1")
    assert s["signature"].startswith("ed25519:ops-1:")
    verify_manifest(s, trusted)
    assert m["signature"] is None  # input untouched


def test_signed_shipped_copy_verifies(signed: Path, keys: tuple[Path, Path]) -> None:
    trusted = load_public_keys(keys[0].parent)
    m = verify_package_dir(signed, trusted, installed_version=None)
    shipped = json.loads((SHIPPED / MANIFEST).read_text())
    assert (m.name, m.version) == ("skab-wstat", shipped["version"])
    assert m.signature is not None


def test_shipped_package_is_unsigned_but_hashed() -> None:
    raw, m = read_manifest(SHIPPED)
    assert raw.get("signature") is None
    assert verify_hashes(SHIPPED).name == m.name


def test_unsigned_refused(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    dst = tmp_path / "pkg"
    shutil.copytree(SHIPPED, dst)
    with pytest.raises(SignatureError, match="not signed"):
        verify_package_dir(dst, load_public_keys(keys[0].parent), None)


def test_byte_flip_after_pack_unpack_is_hash_mismatch(
    signed: Path, keys: tuple[Path, Path], tmp_path: Path
) -> None:
    archive = tmp_path / "p.tar.gz"
    pack(signed, archive)
    out = tmp_path / "out"
    unpack(archive, out)
    verify_package_dir(out, load_public_keys(keys[0].parent), None)
    art = out / "model.int8.onnx"
    data = bytearray(art.read_bytes())
    data[len(data) // 2] ^= 0x01
    art.write_bytes(bytes(data))
    with pytest.raises(HashMismatch, match=r"model\.int8\.onnx"):
        verify_package_dir(out, load_public_keys(keys[0].parent), None)


def test_changed_manifest_field_is_signature_error(signed: Path, keys: tuple[Path, Path]) -> None:
    raw = json.loads((signed / MANIFEST).read_text())
    raw["score"]["top_k"] += 1
    (signed / MANIFEST).write_text(json.dumps(raw))
    with pytest.raises(SignatureError, match="does not verify"):
        verify_package_dir(signed, load_public_keys(keys[0].parent), None)


def test_unknown_key_is_signature_error(signed: Path, tmp_path: Path) -> None:
    generate_keypair(tmp_path / "other", "other")
    with pytest.raises(SignatureError, match="not trusted"):
        verify_package_dir(signed, load_public_keys(tmp_path / "other"), None)


def test_same_key_id_different_key_fails(signed: Path, tmp_path: Path) -> None:
    generate_keypair(tmp_path / "impostor", "ops-1")
    with pytest.raises(SignatureError, match="does not verify"):
        verify_package_dir(signed, load_public_keys(tmp_path / "impostor"), None)


def test_anti_rollback(signed: Path, keys: tuple[Path, Path], tmp_path: Path) -> None:
    set_version(signed, 1, keys[0])
    trusted = load_public_keys(keys[0].parent)
    rb_priv, _ = generate_keypair(tmp_path / "rollback-keys", "fleet-rb")
    policy = RollbackPolicy(load_public_keys(tmp_path / "rollback-keys"), max_age_s=600.0)
    priv = load_private_key(rb_priv)
    now = 1_800_000_000.0

    def verify(rb: SignedRollback | None, installed: int = 2, device: str | None = "gw-1",
               stream: str | None = "pump", at: float = now) -> int:
        return verify_package_dir(signed, trusted, installed, rb, device_id=device,
                                  stream=stream, rollback_policy=policy, now=at,
                                  rollout_id=4).version

    def rollback(key: Ed25519PrivateKey = priv, kid: str = "fleet-rb", **kw: Any) -> SignedRollback:
        args: dict[str, Any] = {"rollout_id": 4, "device_id": "gw-1", "stream": "pump",
                                "name": "skab-wstat", "from_version": 2, "to_version": 1,
                                "clock": lambda: now - 10}
        return sign_rollback(key, kid, **{**args, **kw})

    # package is v1; device runs v2
    with pytest.raises(RollbackRefused, match="not newer"):
        verify(None)
    with pytest.raises(RollbackRefused):
        verify(None, installed=1)
    rb = rollback()
    assert verify(rb) == 1
    # bound to device, stream and from/to versions
    with pytest.raises(RollbackRefused, match="not"):
        verify(rb, device="gw-2")
    with pytest.raises(RollbackRefused, match="device/stream/name"):
        verify(rb, stream="fan")
    with pytest.raises(RollbackRefused):
        verify(rb, installed=3)
    with pytest.raises(RollbackRefused):
        verify(rb, device=None)  # device id unknown
    with pytest.raises(RollbackRefused, match="device/stream/name"):
        verify(rollback(stream=None))  # an older fleet's rollback names no stream
    # bound to the assignment's rollout; an older fleet's rollback names none
    with pytest.raises(RollbackRefused, match="for rollout 3, not this assignment's rollout 4"):
        verify(rollback(rollout_id=3))
    with pytest.raises(RollbackRefused, match=r"names no rollout_id.*upgrade the fleet"):
        verify(rollback(rollout_id=None))
    with pytest.raises(RollbackRefused, match="not valid"):  # the rollout id is signed
        verify(rollback(rollout_id=3).model_copy(update={"rollout_id": 4}))
    # expires; not from the future
    with pytest.raises(RollbackRefused, match="expired"):
        verify(rb, at=now + 601)
    with pytest.raises(RollbackRefused, match="in the future"):
        verify(rollback(clock=lambda: now + 3600))
    # no rollback keys configured: refused
    with pytest.raises(RollbackRefused, match="no rollback keys"):
        verify_package_dir(signed, trusted, 2, rb, device_id="gw-1", stream="pump", now=now)
    # tampered
    forged = rb.model_copy(update={"device_id": "gw-9"})
    with pytest.raises(RollbackRefused, match="not valid"):
        verify(forged, device="gw-9")
    # signed by the PACKAGE key: not a rollback key (roles are separate trust sets)
    with pytest.raises(RollbackRefused, match="not a trusted rollback key"):
        verify(rollback(load_private_key(keys[0]), "ops-1"))
    # signed by a key the device does not trust
    rogue = Ed25519PrivateKey.generate()
    with pytest.raises(RollbackRefused, match="not a trusted rollback key"):
        verify(rollback(rogue, "rogue"))
    # rogue key reusing the trusted key id
    with pytest.raises(RollbackRefused, match="not valid"):
        verify(rollback(rogue, "fleet-rb"))


def test_newer_version_ok(signed: Path, keys: tuple[Path, Path]) -> None:
    set_version(signed, 2, keys[0])
    m = verify_package_dir(signed, load_public_keys(keys[0].parent), installed_version=1)
    assert m.version == 2


def test_deterministic_pack(signed: Path, tmp_path: Path) -> None:
    a = pack(signed, tmp_path / "a.tar.gz")
    os.utime(signed / "model.int8.onnx", (1, 1))  # mtimes must not matter
    (signed / "stray.txt").write_text("not part of the package")
    b = pack(signed, tmp_path / "b.tar.gz")
    assert a == b
    assert (tmp_path / "a.tar.gz").read_bytes() == (tmp_path / "b.tar.gz").read_bytes()
    with tarfile.open(tmp_path / "a.tar.gz") as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == sorted(m.name for m in members)
    assert {m.name for m in members} == {MANIFEST, "model.fp32.onnx", "model.int8.onnx",
                                         "model.int8.xml", "model.int8.bin", "model.int8.tflite"}
    assert all(m.isreg() and m.mtime == 0 and m.uid == 0 and m.mode == 0o644 for m in members)


def _tar(path: Path, entries: list[tarfile.TarInfo], data: bytes = b"x") -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info in entries:
            if info.isreg():
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return path


@pytest.mark.parametrize("name", ["../evil", "a/../../evil", "/etc/evil", "a\\..\\evil"])
def test_unpack_refuses_traversal(tmp_path: Path, name: str) -> None:
    archive = _tar(tmp_path / "t.tar.gz", [tarfile.TarInfo(MANIFEST), tarfile.TarInfo(name)])
    with pytest.raises(PackageFormatError, match="unsafe path"):
        unpack(archive, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert not (tmp_path / "evil").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["t.tar.gz"]  # nothing left behind


@pytest.mark.parametrize(
    "kind", [tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.CHRTYPE, tarfile.FIFOTYPE]
)
def test_unpack_refuses_links_and_devices(tmp_path: Path, kind: bytes) -> None:
    link = tarfile.TarInfo("model.int8.onnx")
    link.type = kind
    link.linkname = "/etc/passwd"
    archive = _tar(tmp_path / "t.tar.gz", [tarfile.TarInfo(MANIFEST), link])
    with pytest.raises(PackageFormatError, match="not a regular file"):
        unpack(archive, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_unpack_limits(tmp_path: Path) -> None:
    archive = _tar(tmp_path / "big.tar.gz", [tarfile.TarInfo("a")], data=b"\0" * 100_000)
    with pytest.raises(PackageFormatError, match="bytes"):
        unpack(archive, tmp_path / "out", max_bytes=50_000)
    many = _tar(tmp_path / "many.tar.gz", [tarfile.TarInfo(f"f{i}") for i in range(5)])
    with pytest.raises(PackageFormatError, match="entries"):
        unpack(many, tmp_path / "out2", max_members=4)
    dup = _tar(tmp_path / "dup.tar.gz", [tarfile.TarInfo("a"), tarfile.TarInfo("a")])
    with pytest.raises(PackageFormatError, match="twice"):
        unpack(dup, tmp_path / "out3")
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not a gzip file at all")
    with pytest.raises(PackageFormatError, match=r"tar\.gz"):
        unpack(junk, tmp_path / "out4")


def test_unpack_into_existing_dir_refused(signed: Path, tmp_path: Path) -> None:
    archive = tmp_path / "p.tar.gz"
    pack(signed, archive)
    (tmp_path / "out").mkdir()
    with pytest.raises(PackageFormatError, match="exists"):
        unpack(archive, tmp_path / "out")


def test_pack_refuses_corrupt_package(signed: Path, tmp_path: Path) -> None:
    (signed / "model.fp32.onnx").write_bytes(b"changed")
    with pytest.raises(HashMismatch):
        pack(signed, tmp_path / "p.tar.gz")
