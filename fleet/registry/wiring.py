"""Build the registry and rollout services from :class:`fleet.settings.Settings`."""

from __future__ import annotations

import logging

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import Engine

from cloud_sync.package import KeyFileError, key_id_of, load_private_key, load_public_keys
from fleet.api.model_loop import ModelLoop
from fleet.db.retention import StatusRetention
from fleet.db.webhooks import WebhookStore
from fleet.errors import ConfigError
from fleet.registry.rollouts import RolloutService, Signer
from fleet.registry.store import ModelRegistry
from fleet.settings import Settings

_log = logging.getLogger("fleet")


def _same_key(a: Ed25519PrivateKey, b: Ed25519PrivateKey) -> bool:
    raw = (serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return a.public_key().public_bytes(*raw) == b.public_key().public_bytes(*raw)


def build_model_loop(settings: Settings, engine: Engine) -> ModelLoop:
    """Load the trusted keys and the optional rollback key; wire registry and rollouts.

    Raises:
        ConfigError: a key file or the trusted keys directory cannot be loaded.
    """
    try:
        trusted = (
            load_public_keys(settings.trusted_keys_dir)
            if settings.trusted_keys_dir is not None else {}
        )
        signer: Signer | None = None
        if settings.rollback_key_file is not None:
            path = settings.rollback_key_file
            signer = (key_id_of(path), load_private_key(path))
            if settings.signing_key_file is not None and _same_key(
                load_private_key(settings.signing_key_file), signer[1]
            ):
                raise ConfigError("the rollback key and the package signing key are the same "
                                  "key; use separate keys (separate roles on the devices)")
        elif settings.signing_key_file is not None or settings.trusted_keys_dir is not None:
            _log.warning("no --rollback-key: an aborted rollout only stops assigning, devices "
                         "keep the aborted version (the package signing key never signs "
                         "rollbacks; docs/rollouts.md)")
    except KeyFileError as exc:
        raise ConfigError(str(exc)) from None
    registry = ModelRegistry(engine, trusted)
    days = settings.status_retention_days
    retention = StatusRetention(engine, days * 86400) if days > 0 else None
    hooks = WebhookStore(engine)
    rollouts = RolloutService(
        engine, registry, signer, halt_after_failures=settings.rollout_halt_failures,
        retention=retention,
        on_halt=lambda conn, data: hooks.enqueue("rollout_halted", data, conn),
    )
    return ModelLoop(registry=registry, rollouts=rollouts)
