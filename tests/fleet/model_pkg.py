"""Helpers of the model-loop fleet tests: keys and signed copies of models/skab-wstat."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from cloud_sync.package import MANIFEST, generate_keypair, pack, sign_package_dir

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "skab-wstat"


def make_keys(root: Path, key_id: str = "ops") -> tuple[Path, Path]:
    """``(private key file, trusted dir holding its .pub)``."""
    priv, _ = generate_keypair(root / "private", key_id)
    trusted = root / "trusted"
    trusted.mkdir(parents=True, exist_ok=True)
    shutil.copy(root / "private" / f"{key_id}.pub", trusted / f"{key_id}.pub")
    return priv, trusted


def package(tmp: Path, version: int, key: Path | None, name: str = "skab-wstat") -> Path:
    """A copy of the shipped package at ``version`` (named ``name``), signed with ``key`` (None:
    unsigned)."""
    dst = tmp / f"{name}-{version}-{key.stem if key else 'unsigned'}"
    shutil.copytree(SHIPPED, dst)
    raw = json.loads((dst / MANIFEST).read_text())
    raw["version"] = version
    raw["name"] = name
    (dst / MANIFEST).write_text(json.dumps(raw, indent=1))
    if key is not None:
        sign_package_dir(dst, key)
    return dst


def archive(tmp: Path, version: int, key: Path | None, name: str = "skab-wstat") -> bytes:
    pkg = package(tmp, version, key, name)
    out = tmp / f"{pkg.name}.tar.gz"
    pack(pkg, out)
    return out.read_bytes()
