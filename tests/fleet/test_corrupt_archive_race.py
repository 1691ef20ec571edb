"""A download that finds the stored archive damaged while a push of the same package repairs it
(:mod:`fleet.registry.integrity`): the real registry on SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine, select, update

from cloud_sync.signing import load_public_keys
from fleet.db.model_tables import models
from fleet.errors import CorruptArchive
from fleet.registry import integrity
from fleet.registry.store import ModelRegistry
from tests.fleet.model_pkg import archive, make_keys


def _damage(engine: Engine, name: str, version: int, at: int) -> None:
    with engine.begin() as conn:
        data = bytearray(conn.execute(select(models.c.archive).where(
            models.c.name == name, models.c.version == version)).scalar_one())
        data[at] ^= 0xFF
        conn.execute(update(models).where(models.c.name == name, models.c.version == version)
                     .values(archive=bytes(data)))


def test_a_repair_pushed_while_a_download_hashes_the_damaged_bytes_stays_repaired(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key, trusted = make_keys(tmp_path)
    reg = ModelRegistry(engine, load_public_keys(trusted))
    pushed = archive(tmp_path, 2, key)
    reg.add(pushed, "ops")
    _damage(engine, "skab-wstat", 2, 100)
    with pytest.raises(CorruptArchive):
        reg.archive("skab-wstat", 2)  # marked corrupt
    _damage(engine, "skab-wstat", 2, 200)  # damaged again (another byte; still marked)

    hashed = integrity.mismatch

    def push_while_hashing(data: bytes, recorded: str) -> str | None:
        # the operator's push of the same package lands while this download hashes
        reg.add(pushed, "ops")
        return hashed(data, recorded)

    monkeypatch.setattr(integrity, "mismatch", push_while_hashing)
    with pytest.raises(CorruptArchive):  # this download read the damaged bytes
        reg.archive("skab-wstat", 2)
    monkeypatch.setattr(integrity, "mismatch", hashed)

    assert reg.get("skab-wstat", 2).corrupt is None  # the repaired package is not marked
    data, sha = reg.archive("skab-wstat", 2)
    assert integrity.mismatch(data, sha) is None
