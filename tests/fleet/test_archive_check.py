"""A repeated download of an unchanged archive is compared with the bytes already verified, not
hashed again; an archive damaged between downloads is still refused with 500
``corrupt_archive`` (:class:`fleet.registry.integrity.VerifiedArchives`; SQLite and
PostgreSQL)."""

from __future__ import annotations

import doctest
import hashlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, select, update

from fleet.app import create_app
from fleet.db.model_tables import models
from fleet.registry import integrity, store
from fleet.registry.integrity import VerifiedArchives
from fleet.settings import Settings
from tests.fleet.model_pkg import archive, make_keys

GZ = {"Content-Type": "application/gzip"}
URL = "/v1/models/skab-wstat/2/package"


@pytest.fixture
def keyed(settings: Settings, engine: Engine,
          tmp_path: Path) -> Iterator[tuple[TestClient, Path]]:
    key, trusted = make_keys(tmp_path / "keys")
    s = Settings(**{**settings.__dict__, "trusted_keys_dir": trusted})
    with TestClient(create_app(s, engine)) as tc:
        yield tc, key


@pytest.fixture
def hashes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Sizes of the archives hashed by the registry's check, in order."""
    seen: list[int] = []
    real = integrity.mismatch

    def counting(data: bytes, recorded: str) -> str | None:
        seen.append(len(data))
        return real(data, recorded)

    monkeypatch.setattr(integrity, "mismatch", counting)
    return seen


def _damage(engine: Engine, at: int) -> None:
    """Flip one byte of the stored archive in place (same size, same sha256 column)."""
    where = (models.c.name == "skab-wstat", models.c.version == 2)
    with engine.begin() as conn:
        data = bytearray(conn.execute(select(models.c.archive).where(*where)).scalar_one())
        data[at] ^= 0xFF
        conn.execute(update(models).where(*where).values(archive=bytes(data)))


def test_a_repeated_download_is_not_hashed_again_and_damage_is_still_refused(
    keyed: tuple[TestClient, Path], admin: dict[str, str], engine: Engine,
    hashes: list[int], tmp_path: Path,
) -> None:
    client, key = keyed
    pushed = archive(tmp_path, 2, key)
    assert client.post("/v1/models", content=pushed, headers={**admin, **GZ}).status_code == 201
    first = client.get(URL, headers=admin)
    assert first.status_code == 200
    sha = hashlib.sha256(first.content).hexdigest()
    assert hashes == [len(first.content)]
    again = client.get(URL, headers=admin)
    part = client.get(URL, headers={**admin, "Range": "bytes=10-19"})
    assert again.status_code == 200 and again.content == first.content
    assert part.status_code == 206 and part.content == first.content[10:20]
    assert hashes == [len(first.content)]  # compared with the verified bytes, not hashed

    _damage(engine, len(first.content) // 2)
    for _ in range(2):
        r = client.get(URL, headers=admin)
        assert r.status_code == 500, r.text
        assert r.json()["error"] == "corrupt_archive"
        assert "model skab-wstat@2 is corrupt in the fleet's store" in r.json()["detail"]
    assert len(hashes) == 3  # damaged bytes never pass as the verified ones
    listed = client.get("/v1/models", headers=admin).json()
    assert listed["models"][0]["corrupt"] is not None

    assert client.post("/v1/models", content=pushed, headers={**admin, **GZ}).status_code == 201
    repaired = client.get(URL, headers=admin)
    assert repaired.status_code == 200
    assert hashlib.sha256(repaired.content).hexdigest() == sha


def test_verified_archives_keep_at_most_max_bytes_least_recent_out_first(
    hashes: list[int],
) -> None:
    def sha(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()

    a, b, c = b"a" * 40, b"b" * 40, b"c" * 30
    v = VerifiedArchives(max_bytes=100)
    for name, data in (("a", a), ("b", b), ("a", a), ("c", c)):  # c drops b (least recent)
        assert v.mismatch(name, 1, data, sha(data)) is None
    assert v.hashed == 3
    assert v.mismatch("a", 1, a, sha(a)) is None and v.hashed == 3
    assert v.mismatch("c", 1, c, sha(c)) is None and v.hashed == 3
    assert v.mismatch("b", 1, b, sha(b)) is None and v.hashed == 4
    assert v.mismatch("a", 2, a, sha(a)) is None and v.hashed == 5  # another version: hashed
    big = b"x" * 101
    for _ in range(2):
        assert v.mismatch("big", 1, big, sha(big)) is None  # over max_bytes: never kept
    assert v.hashed == 7
    none = VerifiedArchives(max_bytes=0)
    for _ in range(2):
        assert none.mismatch("a", 1, a, sha(a)) is None
    assert none.hashed == 2 and len(hashes) == 9


@pytest.mark.parametrize("module", [integrity, store], ids=lambda m: m.__name__)
def test_doctests(module: ModuleType) -> None:
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0
