"""A refused model upload says why without the server's temporary paths; a file that is no model
package gets the way to build one (``edge-fleet model pack``); ``edge-fleet model push`` of an
unsigned package warns that devices checking signatures will refuse it."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from fleet.app import create_app
from fleet.cli import main as fleet_main
from fleet.settings import Settings
from tests.fleet.model_pkg import archive, make_keys, package

GZ = {"Content-Type": "application/gzip"}


@pytest.fixture
def mclient(settings: Settings, engine: Engine, tmp_path: Path) -> Iterator[TestClient]:
    _, trusted = make_keys(tmp_path / "keys")
    s = Settings(**{**settings.__dict__, "trusted_keys_dir": trusted})
    with TestClient(create_app(s, engine)) as tc:
        yield tc


def _tar_gz(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.mark.parametrize(("body", "reason"), [
    (b"%PDF-1.7 not a package", "PackageFormatError: not a valid tar.gz archive"),
    (_tar_gz({"notes.txt": b"hello"}), "PackageFormatError: archive holds no manifest.json"),
    (_tar_gz({"manifest.json": b"{not json"}), "PackageFormatError: manifest.json is not JSON"),
], ids=["not-gzip", "no-manifest", "bad-manifest"])
def test_a_file_that_is_no_package_gets_the_pack_hint_and_no_temp_path(
    mclient: TestClient, admin: dict[str, str], body: bytes, reason: str
) -> None:
    r = mclient.post("/v1/models", content=body, headers={**admin, **GZ})
    assert r.status_code == 422
    detail = r.json()["detail"]
    assert detail.startswith(reason), detail
    assert "edge-fleet model pack DIR --out FILE.tar.gz" in detail
    assert "/tmp" not in detail and "edge-fleet-upload" not in detail and "upload.tar.gz" not in \
        detail


def test_an_unsigned_package_is_refused_without_temp_paths(
    mclient: TestClient, admin: dict[str, str], tmp_path: Path
) -> None:
    r = mclient.post("/v1/models", content=archive(tmp_path, 3, None), headers={**admin, **GZ})
    assert r.status_code == 422
    assert r.json()["detail"] == "SignatureError: skab-wstat@3: manifest is not signed"


def test_push_of_an_unsigned_package_warns_before_it_uploads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    token = tmp_path / "token"
    token.write_text("x" * 40)
    http = ["--url", "http://127.0.0.1:9", "--admin-token-file", str(token)]  # nobody listens
    unsigned = package(tmp_path, 3, None)
    assert fleet_main(["model", "push", str(unsigned), *http]) == 69
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (
        f"edge-fleet: warning: {unsigned} is not signed: devices that check signatures (an "
        "agent's [updater] trusted_keys_dir) will refuse it, and the fleet stores only signed "
        f"packages; sign it first: edge-fleet model sign {unsigned} --key ID.key")
    assert err[1].startswith("edge-fleet: fleet unreachable")
    key, _ = make_keys(tmp_path / "keys")
    assert fleet_main(["model", "push", str(package(tmp_path, 4, key)), *http]) == 69
    assert "warning" not in capsys.readouterr().err
    junk = tmp_path / "junk"
    junk.mkdir()
    assert fleet_main(["model", "push", str(junk), *http]) == 78
    assert "must be a model package directory: manifest.json" in capsys.readouterr().err


@pytest.mark.parametrize("version", ["7", 7.0, True], ids=["string", "float", "bool"])
def test_a_signed_manifest_whose_version_is_no_json_integer_is_refused(
    mclient: TestClient, admin: dict[str, str], tmp_path: Path, version: object
) -> None:
    """The schema reads "7", 7.0 and true as 7, 7 and 1: stored, the package would carry a
    version that is not the one its manifest says to a reader that does not coerce."""
    key = tmp_path / "keys" / "private" / "ops.key"
    body = archive(tmp_path, cast(int, version), key)
    r = mclient.post("/v1/models", content=body, headers={**admin, **GZ})
    assert r.status_code == 422, r.text
    assert r.json()["detail"].startswith("PackageFormatError: manifest.version: "), r.text
    assert "is not a JSON integer" in r.json()["detail"]
    assert mclient.get("/v1/models", headers=admin).json() == {"models": []}
