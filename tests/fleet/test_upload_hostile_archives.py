"""Hostile archives pushed to a real ``edge-fleet serve`` over HTTP (issue 15, item 5, fleet side).

An operator (or whoever holds an operator token) pushes ``POST /v1/models``: a 1 MB archive
holding a 1 GiB PAX header (Python's ``tarfile`` would read the whole header into memory), and a
validly signed package with a member its manifest does not name. Both are refused with a 4xx
naming the reason, nothing is stored, and the server's peak resident memory (``VmHWM``) grows by
far less than the header announces. A valid package pushed afterwards is accepted: the refusals
are the archives', not the setup's.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from cloud_sync.package import generate_keypair
from tests.integration.fleet_peer import ADMIN_TOKEN, FleetProcess
from tests.integration.model_fleet import make_package, pax_bomb, tar_gz, tar_gz_with

OPERATOR = {"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/gzip"}
#: Peak RSS growth allowed for refusing a 1 GiB header (the unbounded read took 1.2 GB).
MAX_GROWTH_KB = 128 * 1024


@pytest.fixture(scope="module")
def fleet_and_key(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FleetProcess, Path]]:
    tmp = tmp_path_factory.mktemp("upload")
    priv, pub = generate_keypair(tmp / "signer", "ops")
    trusted = tmp / "trusted"
    trusted.mkdir()
    (trusted / pub.name).write_bytes(pub.read_bytes())
    proc = FleetProcess(tmp / "fleet", serve_args=["--trusted-keys", str(trusted)])
    proc.start()
    try:
        yield proc, priv
    finally:
        proc.stop()
    assert "Traceback" not in proc.log_tail(400)


def _peak_rss_kb(pid: int) -> int:
    """``VmHWM`` of ``pid`` (kB): the largest resident set it has had since it started."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmHWM for {pid}")


def _push(fleet: FleetProcess, body: bytes) -> requests.Response:
    return requests.post(f"{fleet.url}/v1/models", data=body, headers=OPERATOR, timeout=(5, 60))


def _stored(fleet: FleetProcess) -> list[str]:
    resp = requests.get(f"{fleet.url}/v1/models", headers=OPERATOR, timeout=(5, 30))
    assert resp.status_code == 200, resp.text
    return [f"{m['name']}@{m['version']}" for m in resp.json()["models"]]


def test_pax_bomb_upload_is_refused_with_bounded_memory(
    fleet_and_key: tuple[FleetProcess, Path]
) -> None:
    fleet, _key = fleet_and_key
    assert fleet.pid is not None
    bomb = pax_bomb(1 << 30)
    assert len(bomb) < 2 << 20  # about 1 MB on the wire, 1 GiB announced
    _push(fleet, b"not a tar")  # warm up the route's imports before the baseline
    before = _peak_rss_kb(fleet.pid)
    resp = _push(fleet, bomb)
    grown = _peak_rss_kb(fleet.pid) - before
    assert 400 <= resp.status_code < 500, (resp.status_code, resp.text)
    assert "meta header" in resp.json()["detail"], resp.text
    assert grown < MAX_GROWTH_KB, f"peak RSS grew by {grown} kB refusing the PAX bomb"
    assert _stored(fleet) == []


def test_unlisted_member_upload_is_refused(
    fleet_and_key: tuple[FleetProcess, Path], tmp_path: Path
) -> None:
    fleet, key = fleet_and_key
    pkg = make_package(tmp_path / "pkg", 3, key)
    resp = _push(fleet, tar_gz_with(pkg, {"payload.bin": b"\x7fELF" * 4096}))
    assert 400 <= resp.status_code < 500, (resp.status_code, resp.text)
    assert "not named by the signed manifest" in resp.json()["detail"], resp.text
    assert "skab-wstat@3" not in _stored(fleet)
    # the same package without the extra member is accepted: the member was the reason
    ok = _push(fleet, tar_gz(pkg))
    assert ok.status_code == 201, ok.text
    assert "skab-wstat@3" in _stored(fleet)
