"""Ed25519 keys and signatures for model manifests and rollbacks (RFC 8032, via ``cryptography``).

Public API is re-exported by :mod:`cloud_sync.package`; import it from there.

Keys live in PEM files named after their key id: ``<key_id>.key`` (PKCS#8 private key, mode
0600) and ``<key_id>.pub`` (SubjectPublicKeyInfo public key). The key id of a file is its stem.
:func:`generate_keypair` picks, unless told otherwise, :func:`fingerprint` of the public key: the
first 16 hex digits of sha256 over the 32 raw public key bytes. Key ids match
:data:`KEY_ID_PATTERN` (no ``:``, which separates the signature's fields).

Manifest signature (``manifest["signature"]``)::

    "ed25519:<key_id>:<base64(Ed25519(private_key, canonical_bytes(manifest)))>"

where :func:`cloud_sync.manifest.canonical_bytes` drops the ``signature`` key itself. Base64 is
standard with padding (RFC 4648 §4).

:class:`~cloud_sync.protocol.SignedRollback`: ``signature`` is base64 Ed25519 over
``canonical_bytes({"role": "rollback", "rollout_id", "device_id", "stream", "name",
"from_version", "to_version", "issued_at"})`` and ``key_id`` names the key. Same key files, but
a separate trust set: a device checks rollbacks against its rollback keys only and manifests
against its package keys only (:mod:`cloud_sync.rollback`), so the fleet's rollback key (which
lives on the server) cannot sign a package.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cloud_sync.errors import KeyFileError, SignatureError
from cloud_sync.manifest import canonical_bytes
from cloud_sync.protocol import SignedRollback

# ``cryptography`` (about 6 MB resident) is imported by the functions that use it, so a process
# that only imports this module (an agent without signed model updates) never loads it.
if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

SCHEME = "ed25519"
KEY_ID_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"
PRIVATE_SUFFIX = ".key"
PUBLIC_SUFFIX = ".pub"
#: Largest key file read, bytes (a PEM Ed25519 key is ~120).
_MAX_KEY_FILE = 16 * 1024

TrustedKeys = Mapping[str, "Ed25519PublicKey"]


def _check_key_id(key_id: str) -> str:
    if not re.fullmatch(KEY_ID_PATTERN, key_id):
        raise KeyFileError(f"invalid key id {key_id!r} (must match {KEY_ID_PATTERN})")
    return key_id


def fingerprint(public_key: Ed25519PublicKey) -> str:
    """First 16 hex digits of sha256 over the 32 raw public key bytes (the default key id)."""
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415 - lazy, see top

    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def generate_keypair(directory: Path, key_id: str | None = None) -> tuple[Path, Path]:
    """Create a new Ed25519 key pair as PEM files in ``directory`` (created if missing).

    Args:
        directory: Where ``<key_id>.key`` (mode 0600) and ``<key_id>.pub`` are written.
        key_id: Name of the pair; default :func:`fingerprint` of the new public key.

    Returns:
        ``(private_path, public_path)``.

    Raises:
        KeyFileError: invalid key id, or a file of that name exists (never overwritten).
    """
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415 - lazy, see top
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (  # noqa: PLC0415
        Ed25519PrivateKey,
    )

    private_key = Ed25519PrivateKey.generate()
    kid = _check_key_id(key_id or fingerprint(private_key.public_key()))
    directory.mkdir(parents=True, exist_ok=True)
    priv_path = directory / f"{kid}{PRIVATE_SUFFIX}"
    pub_path = directory / f"{kid}{PUBLIC_SUFFIX}"
    for p in (priv_path, pub_path):
        if p.exists():
            raise KeyFileError(f"{p} exists; refusing to overwrite a key")
    priv_pem = private_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(priv_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(priv_pem)
    os.chmod(priv_path, 0o600)  # umask may have narrowed it further; never wider
    pub_pem = private_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    pub_path.write_bytes(pub_pem)
    return priv_path, pub_path


def _read_key_file(path: Path) -> bytes:
    try:
        with path.open("rb") as f:
            data = f.read(_MAX_KEY_FILE + 1)
    except OSError as exc:
        raise KeyFileError(f"cannot read key file {path}: {exc}") from exc
    if len(data) > _MAX_KEY_FILE:
        raise KeyFileError(f"key file {path} is larger than {_MAX_KEY_FILE} bytes")
    return data


def key_id_of(path: Path) -> str:
    """The key id of a key file: its stem (``keys/fleet-2026.key`` → ``fleet-2026``).

    Raises:
        KeyFileError: the stem is not a valid key id.
    """
    return _check_key_id(path.stem)


def load_private_key(path: Path) -> Ed25519PrivateKey:
    """Load an unencrypted PEM (PKCS#8) Ed25519 private key; its key id is :func:`key_id_of`.

    Raises:
        KeyFileError: unreadable, encrypted, or not an Ed25519 private key.
    """
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415 - lazy, see top
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (  # noqa: PLC0415
        Ed25519PrivateKey,
    )

    data = _read_key_file(path)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise KeyFileError(f"{path} is not an unencrypted PEM private key: {exc}") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(f"{path} holds a {type(key).__name__}, not an Ed25519 private key")
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    """Load a PEM (SubjectPublicKeyInfo) Ed25519 public key.

    Raises:
        KeyFileError: unreadable or not an Ed25519 public key.
    """
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415 - lazy, see top
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (  # noqa: PLC0415
        Ed25519PublicKey,
    )

    data = _read_key_file(path)
    try:
        key = serialization.load_pem_public_key(data)
    except ValueError as exc:
        raise KeyFileError(f"{path} is not a PEM public key: {exc}") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise KeyFileError(f"{path} holds a {type(key).__name__}, not an Ed25519 public key")
    return key


def load_public_keys(source: Path | Iterable[Path]) -> dict[str, Ed25519PublicKey]:
    """Load trusted public keys, keyed by key id (file stem).

    Args:
        source: A directory (every ``*.pub`` in it, not recursive; none is fine) or key files.

    Returns:
        ``{key_id: public_key}``; may be empty (then every signature check fails).

    Raises:
        KeyFileError: a file is not an Ed25519 public key, the directory is unreadable, or two
            files share a key id.
    """
    if isinstance(source, Path):
        if not source.is_dir():
            raise KeyFileError(f"trusted keys directory {source} does not exist")
        paths = sorted(source.glob(f"*{PUBLIC_SUFFIX}"))
    else:
        paths = list(source)
    keys: dict[str, Ed25519PublicKey] = {}
    for p in paths:
        kid = key_id_of(p)
        if kid in keys:
            raise KeyFileError(f"two trusted keys have the id {kid!r}")
        keys[kid] = load_public_key(p)
    return keys


def _verify(trusted: TrustedKeys, key_id: str, sig_b64: str, message: bytes, what: str) -> None:
    from cryptography.exceptions import InvalidSignature  # noqa: PLC0415 - lazy, see top

    key = trusted.get(key_id)
    if key is None:
        raise SignatureError(f"{what} is signed by key {key_id!r}, which is not trusted")
    try:
        sig = base64.b64decode(sig_b64.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise SignatureError(f"{what} signature is not valid base64") from exc
    try:
        key.verify(sig, message)
    except InvalidSignature as exc:
        raise SignatureError(
            f"{what} signature does not verify with key {key_id!r} (content changed?)"
        ) from exc


def sign_manifest(
    manifest: Mapping[str, Any], private_key: Ed25519PrivateKey, key_id: str
) -> dict[str, Any]:
    """Return a copy of ``manifest`` with ``signature`` set (any old one replaced).

    Raises:
        KeyFileError: invalid key id.
    """
    _check_key_id(key_id)
    out = {k: v for k, v in manifest.items() if k != "signature"}
    sig = private_key.sign(canonical_bytes(out))
    out["signature"] = f"{SCHEME}:{key_id}:{base64.b64encode(sig).decode('ascii')}"
    return out


def verify_manifest(manifest: Mapping[str, Any], trusted: TrustedKeys) -> None:
    """Check ``manifest["signature"]`` against the raw manifest dict (as read from JSON).

    Verify the dict parsed from ``manifest.json``, not a re-serialised model: the signature
    covers exactly :func:`~cloud_sync.manifest.canonical_bytes` of what was signed.

    Raises:
        SignatureError: signature missing or malformed, key id not in ``trusted``, or the
            Ed25519 check fails.
    """
    sig = manifest.get("signature")
    if not isinstance(sig, str) or not sig:
        raise SignatureError("manifest is not signed")
    parts = sig.split(":")
    if len(parts) != 3 or parts[0] != SCHEME:
        raise SignatureError("manifest signature is not 'ed25519:<key_id>:<base64>'")
    _verify(trusted, parts[1], parts[2], canonical_bytes(dict(manifest)), "manifest")


#: ``role`` of the signed rollback body (domain separation from manifests).
ROLLBACK_ROLE = "rollback"


def _rollback_body(rb: SignedRollback) -> dict[str, Any]:
    return {
        "role": ROLLBACK_ROLE,
        "rollout_id": rb.rollout_id,
        "device_id": rb.device_id,
        "stream": rb.stream,
        "name": rb.name,
        "from_version": rb.from_version,
        "to_version": rb.to_version,
        "issued_at": rb.issued_at,
    }


def sign_rollback(
    private_key: Ed25519PrivateKey,
    key_id: str,
    *,
    rollout_id: int | None,
    device_id: str,
    stream: str | None,
    name: str,
    from_version: int,
    to_version: int,
    clock: Callable[[], float] = time.time,
) -> SignedRollback:
    """Sign permission for ``device_id`` to go from ``from_version`` down to ``to_version``.

    Args:
        private_key: The signer's key; its public half must be in the device's rollback keys
            (``updater.rollback_keys_dir``), not its package keys.
        key_id: Its key id.
        rollout_id: The rollout it undoes (the assignment's ``rollout_id``; None: refused by
            devices, kept so that tests can build an older fleet's rollback).
        device_id: The one device this permission is for.
        stream: The one stream of that device (None: refused by devices; kept so that a
            fleet asked without a stream still answers).
        name: Model name.
        from_version: The version the device runs now (0 = none).
        to_version: The older version it may install.
        clock: Wall clock for ``issued_at`` (epoch seconds, UTC).

    Raises:
        KeyFileError: invalid key id.
    """
    _check_key_id(key_id)
    rb = SignedRollback(
        rollout_id=rollout_id,
        device_id=device_id,
        stream=stream,
        name=name,
        from_version=from_version,
        to_version=to_version,
        issued_at=float(clock()),
        key_id=key_id,
        signature="",
    )
    sig = private_key.sign(canonical_bytes(_rollback_body(rb)))
    return rb.model_copy(update={"signature": base64.b64encode(sig).decode("ascii")})


def verify_rollback(rollback: SignedRollback, trusted: TrustedKeys) -> None:
    """Check a :class:`SignedRollback`'s signature (not whether it fits a package).

    Raises:
        SignatureError: key id not trusted, malformed signature, or the check fails.
    """
    _verify(
        trusted,
        rollback.key_id,
        rollback.signature,
        canonical_bytes(_rollback_body(rollback)),
        "rollback",
    )
