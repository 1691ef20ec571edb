"""Registry and rollouts over the API (SQLite and PostgreSQL): signed uploads only, canary,
auto-halt, promote, abort with a signed rollback, Range downloads, device-only reports."""

from __future__ import annotations

import hashlib
import io
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, create_engine

from cloud_sync.package import load_public_keys, verify_rollback
from cloud_sync.protocol import ModelAssignment, SignedRollback
from fleet.app import create_app
from fleet.errors import ConfigError
from fleet.registry.policy import pick_canaries
from fleet.registry.wiring import build_model_loop
from fleet.settings import Settings
from tests.fleet.conftest import enroll
from tests.fleet.model_pkg import archive, make_keys

GZ = {"Content-Type": "application/gzip"}
DEVICES = [f"gw{i}" for i in range(1, 11)]


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    return make_keys(tmp_path / "keys")


@pytest.fixture
def mclient(
    settings: Settings, engine: Engine, keys: tuple[Path, Path]
) -> Iterator[TestClient]:
    s = Settings(**{**settings.__dict__, "trusted_keys_dir": keys[1],
                    "rollback_key_file": keys[0]})
    with TestClient(create_app(s, engine)) as tc:
        yield tc


def push(client: TestClient, admin: dict[str, str], data: bytes) -> Any:
    return client.post("/v1/models", content=data, headers={**admin, **GZ})


@pytest.fixture
def fleet(
    mclient: TestClient, admin: dict[str, str], keys: tuple[Path, Path], tmp_path: Path
) -> dict[str, dict[str, str]]:
    """Ten devices tagged ``line1``, skab-wstat v1 and v2 pushed; device id -> auth header."""
    for v in (1, 2):
        assert push(mclient, admin, archive(tmp_path, v, keys[0])).status_code == 201
    return {d: {"Authorization": f"Bearer {enroll(mclient, d, ['line1'])}"} for d in DEVICES}


def assigned(client: TestClient, auth: dict[str, str], stream: str | None = None) -> Any:
    resp = client.get("/v1/models/assignment", headers=auth,
                      params={"stream": stream} if stream else None)
    assert resp.status_code in (200, 204), resp.text
    return None if resp.status_code == 204 else ModelAssignment.model_validate(resp.json())


def report(client: TestClient, auth: dict[str, str], device: str, state: str, **kw: Any) -> Any:
    body = {"device_id": device, "name": "skab-wstat", "version": 2, "state": state,
            "at": time.time(), **kw}
    return client.post("/v1/models/status", json=body, headers=auth)


def test_push_refuses_unsigned_untrusted_corrupt(
    mclient: TestClient, admin: dict[str, str], keys: tuple[Path, Path], tmp_path: Path
) -> None:
    r = push(mclient, admin, archive(tmp_path, 1, None))
    assert r.status_code == 422 and "SignatureError" in r.json()["detail"]
    rogue, _ = make_keys(tmp_path / "rogue", "rogue")
    r = push(mclient, admin, archive(tmp_path, 1, rogue))
    assert r.status_code == 422 and "not trusted" in r.json()["detail"]
    # corrupt: a signed package whose artefact was changed after signing
    good = archive(tmp_path, 1, keys[0])
    members: list[tuple[tarfile.TarInfo, bytes]] = []
    with tarfile.open(fileobj=io.BytesIO(good)) as tar:
        for m in tar.getmembers():
            f = tar.extractfile(m)
            assert f is not None
            data = f.read()
            if m.name == "model.int8.onnx":
                data = data[:-1] + bytes([data[-1] ^ 1])
            members.append((m, data))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for m, data in members:
            tar.addfile(m, io.BytesIO(data))
    r = push(mclient, admin, buf.getvalue())
    assert r.status_code == 422 and "HashMismatch" in r.json()["detail"]
    r = push(mclient, admin, b"not an archive")
    assert r.status_code == 422 and "PackageFormatError" in r.json()["detail"]
    # a device token cannot push
    token = enroll(mclient, "gw1")
    r = push(mclient, {"Authorization": f"Bearer {token}"}, good)
    assert r.status_code == 403
    r = push(mclient, admin, good)
    assert r.status_code == 201, r.text
    assert r.json()["key_id"] == "ops"
    assert push(mclient, admin, good).status_code == 409  # versions are immutable
    listed = mclient.get("/v1/models", headers=admin).json()["models"]
    assert [(m["name"], m["version"]) for m in listed] == [("skab-wstat", 1)]


def test_push_refused_without_trusted_keys(
    client: TestClient, admin: dict[str, str], keys: tuple[Path, Path], tmp_path: Path
) -> None:
    r = push(client, admin, archive(tmp_path, 1, keys[0]))
    assert r.status_code == 422 and "no trusted keys" in r.json()["detail"]


def test_canary_halt_and_promote(
    mclient: TestClient, admin: dict[str, str], fleet: dict[str, dict[str, str]]
) -> None:
    r = mclient.post("/v1/rollouts", headers=admin, json={
        "name": "skab-wstat", "version": 2, "tag": "line1", "canary_percent": 20})
    assert r.status_code == 201, r.text
    ro = r.json()
    canaries = {d["device_id"] for d in ro["devices"] if d["canary"]}
    assert canaries == pick_canaries(DEVICES, 20) and len(canaries) == 2
    assert ro["state"] == "canary"
    for d, auth in fleet.items():
        got = assigned(mclient, auth, "pump1")
        if d in canaries:
            assert got is not None and (got.name, got.version, got.rollout_id) == (
                "skab-wstat", 2, ro["id"])
            assert got.rollback is None
        else:
            assert got is None
    # one canary rejects -> halted, nobody assigned any more
    bad = sorted(canaries)[0]
    r = report(mclient, fleet[bad], bad, "rejected", rollout_id=ro["id"],
               reason="golden mismatch 0.2 > atol")
    assert r.status_code == 204, r.text
    shown = mclient.get(f"/v1/rollouts/{ro['id']}", headers=admin).json()
    assert shown["state"] == "halted" and "golden mismatch" in shown["reason"]
    assert {d["device_id"]: d["state"] for d in shown["devices"]}[bad] == "rejected"
    assert all(assigned(mclient, auth) is None for auth in fleet.values())
    assert mclient.post(f"/v1/rollouts/{ro['id']}/promote", headers=admin).status_code == 409


def test_promote_assigns_whole_group(
    mclient: TestClient, admin: dict[str, str], fleet: dict[str, dict[str, str]]
) -> None:
    ro = mclient.post("/v1/rollouts", headers=admin, json={
        "name": "skab-wstat", "version": 2, "tag": "line1", "canary_percent": 10}).json()
    assert sum(d["canary"] for d in ro["devices"]) == 1
    for d in [x["device_id"] for x in ro["devices"] if x["canary"]]:
        assert report(mclient, fleet[d], d, "active", rollout_id=ro["id"]).status_code == 204
    r = mclient.post(f"/v1/rollouts/{ro['id']}/pause", headers=admin)
    assert r.json()["state"] == "paused"
    assert all(assigned(mclient, auth) is None for auth in fleet.values())
    assert mclient.post(f"/v1/rollouts/{ro['id']}/resume", headers=admin).json()["state"] == (
        "canary")
    r = mclient.post(f"/v1/rollouts/{ro['id']}/promote", headers=admin)
    assert r.status_code == 200 and r.json()["state"] == "promoted"
    assert all(d["assigned"] for d in r.json()["devices"])
    for auth in fleet.values():
        got = assigned(mclient, auth)
        assert got is not None and got.version == 2
    listed = mclient.get("/v1/rollouts", headers=admin).json()["rollouts"]
    assert [x["id"] for x in listed] == [ro["id"]] and listed[0]["counts"]["active"] == 1
    # the list counts device states in the database; the rollout's own page from its rows
    one = mclient.get(f"/v1/rollouts/{ro['id']}", headers=admin).json()
    assert listed[0]["counts"] == one["counts"] == {"active": 1, "none": len(ro["devices"]) - 1}


def test_abort_falls_back_with_signed_rollback(
    mclient: TestClient, admin: dict[str, str], fleet: dict[str, dict[str, str]],
    keys: tuple[Path, Path],
) -> None:
    # gw1 runs v1 (from an earlier rollout), then gets v2 and activates it
    r1 = mclient.post("/v1/rollouts", headers=admin,
                      json={"name": "skab-wstat", "version": 1, "devices": ["gw1", "gw2"]})
    assert r1.json()["state"] == "promoted"
    for d in ("gw1", "gw2"):
        report(mclient, fleet[d], d, "active", version=1, rollout_id=r1.json()["id"])
    r2 = mclient.post("/v1/rollouts", headers=admin,
                      json={"name": "skab-wstat", "version": 2, "devices": ["gw1", "gw2"]}).json()
    assert {d["previous_version"] for d in r2["devices"]} == {1}
    assert report(mclient, fleet["gw1"], "gw1", "active", rollout_id=r2["id"]).status_code == 204
    r = mclient.post(f"/v1/rollouts/{r2['id']}/abort", headers=admin)
    assert r.json()["state"] == "aborted"
    got = assigned(mclient, fleet["gw1"], "pump")  # the rollback names the asked stream
    assert got is not None and got.version == 1 and got.rollback is not None
    rb: SignedRollback = got.rollback
    assert (rb.device_id, rb.stream, rb.name, rb.from_version, rb.to_version) == (
        "gw1", "pump", "skab-wstat", 2, 1)
    assert rb.rollout_id == got.rollout_id == r2["id"]  # bound to the aborted rollout
    verify_rollback(rb, load_public_keys(keys[1]))
    stay = assigned(mclient, fleet["gw2"])  # never ran v2: v1 again, nothing to roll back
    assert stay is not None and (stay.version, stay.rollback) == (1, None)
    assert mclient.post(f"/v1/rollouts/{r2['id']}/resume", headers=admin).status_code == 409


def test_range_download_resumes(
    mclient: TestClient, admin: dict[str, str], fleet: dict[str, dict[str, str]]
) -> None:
    auth = fleet["gw1"]
    url = "/v1/models/skab-wstat/2/package"
    r = mclient.post("/v1/rollouts", headers=admin,
                     json={"name": "skab-wstat", "version": 2, "devices": ["gw1"]})
    assert r.status_code == 201, r.text
    full = mclient.get(url, headers=auth)
    assert full.status_code == 200
    sha = hashlib.sha256(full.content).hexdigest()
    assert full.headers["etag"] == f'"{sha}"' and full.headers["accept-ranges"] == "bytes"
    size = len(full.content)
    n = size // 3
    head = mclient.get(url, headers={**auth, "Range": f"bytes=0-{n - 1}"})
    assert head.status_code == 206 and head.content == full.content[:n]
    rest = mclient.get(url, headers={**auth, "Range": f"bytes={n}-", "If-Range": f'"{sha}"'})
    assert rest.status_code == 206
    assert rest.headers["content-range"] == f"bytes {n}-{size - 1}/{size}"
    assert hashlib.sha256(head.content + rest.content).hexdigest() == sha
    for bad in (f"bytes={size}-", "bytes=5-1", "bytes=0-1,3-4", "items=0-1"):
        r = mclient.get(url, headers={**auth, "Range": bad})
        assert r.status_code == 416, bad
        assert r.headers["content-range"] == f"bytes */{size}"
    stale = mclient.get(url, headers={**auth, "Range": f"bytes={n}-", "If-Range": '"old"'})
    assert stale.status_code == 200 and stale.content == full.content
    assert mclient.get(url, headers={**auth, "If-None-Match": f'"{sha}"'}).status_code == 304
    assert mclient.get("/v1/models/skab-wstat/9/package", headers=admin).status_code == 404
    assert mclient.get(url).status_code == 401


def test_device_downloads_only_what_it_is_assigned(
    mclient: TestClient, admin: dict[str, str], fleet: dict[str, dict[str, str]],
    keys: tuple[Path, Path], tmp_path: Path,
) -> None:
    """Package confidentiality: another device's retrained model, a package of no rollout, a
    paused rollout's package and an aborted version are refused (403) to a device."""
    own = archive(tmp_path, 1, keys[0], name="skab-wstat-gw1")  # gw1's retrained model
    assert push(mclient, admin, own).status_code == 201
    get = lambda who, name, v: mclient.get(  # noqa: E731
        f"/v1/models/{name}/{v}/package", headers=fleet[who]).status_code
    for who in ("gw1", "gw2"):
        assert get(who, "skab-wstat-gw1", 1) == 403  # pushed, in no rollout yet
    ro1 = mclient.post("/v1/rollouts", headers=admin, json={
        "name": "skab-wstat-gw1", "version": 1, "devices": ["gw1"], "stream": "pump"}).json()
    assert get("gw1", "skab-wstat-gw1", 1) == 200
    r = mclient.get("/v1/models/skab-wstat-gw1/1/package", headers=fleet["gw2"])
    assert r.status_code == 403 and "not assigned to device gw2" in r.json()["detail"]
    assert get("gw2", "skab-wstat-gw1", 7) == 403  # not stored: the same answer
    assert mclient.get("/v1/models/skab-wstat-gw1/1/package", headers=admin).status_code == 200
    # a canary rollout: the canary device only; paused: nobody
    ro2 = mclient.post("/v1/rollouts", headers=admin, json={
        "name": "skab-wstat", "version": 2, "devices": ["gw2", "gw3"], "canary_percent": 50,
    }).json()
    canary = next(d["device_id"] for d in ro2["devices"] if d["canary"])
    other = next(d["device_id"] for d in ro2["devices"] if not d["canary"])
    assert (get(canary, "skab-wstat", 2), get(other, "skab-wstat", 2)) == (200, 403)
    assert get(canary, "skab-wstat", 1) == 403
    mclient.post(f"/v1/rollouts/{ro2['id']}/pause", headers=admin)
    assert get(canary, "skab-wstat", 2) == 403
    # aborted after the canary ran v2 (from v1): v1 with the rollback, no longer v2
    mclient.post(f"/v1/rollouts/{ro2['id']}/resume", headers=admin)
    report(mclient, fleet[canary], canary, "active", version=1, rollout_id=None)
    report(mclient, fleet[canary], canary, "active", rollout_id=ro2["id"])
    mclient.post(f"/v1/rollouts/{ro2['id']}/abort", headers=admin)
    assert (get(canary, "skab-wstat", 1), get(canary, "skab-wstat", 2)) == (200, 403)
    assert get("gw1", "skab-wstat-gw1", 1) == 200 and ro1["stream"] == "pump"


def test_abort_of_the_first_rollout_from_a_builtin_model(
    mclient: TestClient, admin: dict[str, str], fleet: dict[str, dict[str, str]],
) -> None:
    """Devices on their configured (builtin) v1 report it at start; an abort of v2 sends them
    back to the registry's v1, and the rollout's reason says what happens to each device."""
    start = {"version": 1, "rollout_id": None, "stream": "pump",
             "details": {"origin": "configured"}}
    assert report(mclient, fleet["gw1"], "gw1", "active", **start).status_code == 204
    # gw5 runs a version the registry does not hold
    report(mclient, fleet["gw5"], "gw5", "active", **{**start, "version": 7})
    ro = mclient.post("/v1/rollouts", headers=admin, json={
        "name": "skab-wstat", "version": 2, "devices": ["gw1", "gw2", "gw3", "gw4", "gw5"]}).json()
    prev = {d["device_id"]: d["previous_version"] for d in ro["devices"]}
    assert prev == {"gw1": 1, "gw2": None, "gw3": None, "gw4": None, "gw5": 7}
    # gw2 starts after the rollout was created: its first report of the rollout fills it in
    report(mclient, fleet["gw2"], "gw2", "active", **start)
    report(mclient, fleet["gw2"], "gw2", "downloaded", rollout_id=ro["id"])
    for d in ("gw1", "gw2", "gw3", "gw5"):  # gw3 never said what it ran before
        assert report(mclient, fleet[d], d, "active", rollout_id=ro["id"]).status_code == 204
    shown = mclient.get(f"/v1/rollouts/{ro['id']}", headers=admin).json()
    prev = {d["device_id"]: d["previous_version"] for d in shown["devices"]}
    assert prev == {"gw1": 1, "gw2": 1, "gw3": None, "gw4": None, "gw5": 7}
    r = mclient.post(f"/v1/rollouts/{ro['id']}/abort", headers=admin).json()
    assert r["state"] == "aborted"
    assert r["reason"] == (
        "aborted by the operator: back to skab-wstat@1: gw1, gw2; keep skab-wstat@2 (no "
        "previous version known: the device never reported another version of skab-wstat): "
        "gw3; untouched (never ran it): gw4; keep skab-wstat@2 (skab-wstat@7 is not in the "
        "registry: push it signed): gw5")
    for d in ("gw1", "gw2"):
        got = assigned(mclient, fleet[d], "pump")
        assert got is not None and got.version == 1 and got.rollback is not None
        assert (got.rollback.from_version, got.rollback.to_version) == (2, 1)
    assert all(assigned(mclient, fleet[d]) is None for d in ("gw3", "gw4", "gw5"))
    # gw1 is back on v1: the rollout says so, and nothing more is assigned to it
    report(mclient, fleet["gw1"], "gw1", "active", version=1, rollout_id=ro["id"])
    row = next(d for d in mclient.get(f"/v1/rollouts/{ro['id']}", headers=admin).json()[
        "devices"] if d["device_id"] == "gw1")
    assert (row["state"], row["reason"], row["version"]) == (
        "rolled_back", "abort: back on skab-wstat@1", 1)
    again = assigned(mclient, fleet["gw1"], "pump")  # the version it runs, no more rollback
    assert again is not None and (again.version, again.rollback) == (1, None)
    reason = mclient.get(f"/v1/rollouts/{ro['id']}", headers=admin).json()["reason"]
    assert reason.startswith("aborted by the operator: rolled back (abort: back on "
                             "skab-wstat@1): gw1; back to skab-wstat@1: gw2;"), reason


def test_abort_without_rollback_key_names_the_fix(
    settings: Settings, engine: Engine, admin: dict[str, str], keys: tuple[Path, Path],
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """A fleet served without --rollback-key (the quick start as it was): the abort keeps the
    device on v2 and its reason says how to fix that; serve warns at start."""
    s = Settings(**{**settings.__dict__, "trusted_keys_dir": keys[1]})
    with caplog.at_level("WARNING", logger="fleet"), TestClient(create_app(s, engine)) as tc:
        assert any("no --rollback-key" in r.getMessage() for r in caplog.records)
        for v in (1, 2):
            assert push(tc, admin, archive(tmp_path, v, keys[0])).status_code == 201
        auth = {"Authorization": f"Bearer {enroll(tc, 'gw1', ['line1'])}"}
        report(tc, auth, "gw1", "active", version=1, rollout_id=None, stream="pump")
        ro = tc.post("/v1/rollouts", headers=admin,
                     json={"name": "skab-wstat", "version": 2, "tag": "line1"}).json()
        assert report(tc, auth, "gw1", "active", rollout_id=ro["id"]).status_code == 204
        r = tc.post(f"/v1/rollouts/{ro['id']}/abort", headers=admin).json()
        assert r["state"] == "aborted"
        assert r["reason"] == (
            "aborted by the operator: keep skab-wstat@2 (the fleet has no --rollback-key to sign "
            "the rollback: start edge-fleet serve with --rollback-key; docs/rollouts.md): gw1")
        assert assigned(tc, auth, "pump") is None


def test_abort_stops_devices_that_have_not_activated_without_rollback_key(
    settings: Settings, engine: Engine, admin: dict[str, str], keys: tuple[Path, Path],
    tmp_path: Path,
) -> None:
    """No --rollback-key, a rollout of v2 over devices on v1: the abort stops every device
    that has not made v2 active (shadow, downloaded, accepted, verified, no report): its
    assignment is v1 again, unsigned, and v2 can no longer be downloaded; only the device
    already active on v2 keeps it, and the reason says which and why."""
    s = Settings(**{**settings.__dict__, "trusted_keys_dir": keys[1]})
    with TestClient(create_app(s, engine)) as tc:
        for v in (1, 2):
            assert push(tc, admin, archive(tmp_path, v, keys[0])).status_code == 201
        ids = ["gw1", "gw2", "gw3", "gw4", "gw5", "gw6"]
        auth = {d: {"Authorization": f"Bearer {enroll(tc, d, ['line1'])}"} for d in ids}
        for d in ids:
            report(tc, auth[d], d, "active", version=1, rollout_id=None, stream="pump")
        ro = tc.post("/v1/rollouts", headers=admin,
                     json={"name": "skab-wstat", "version": 2, "tag": "line1"}).json()
        states = {"gw1": "active", "gw2": "shadow", "gw3": "downloaded", "gw4": "accepted",
                  "gw5": "verified"}
        for d, st in states.items():
            assert report(tc, auth[d], d, st, rollout_id=ro["id"]).status_code == 204
        shown = tc.get(f"/v1/rollouts/{ro['id']}", headers=admin).json()["devices"]
        assert {d["device_id"]: (d["state"], d["version"]) for d in shown} == {
            **{d: (st, 2) for d, st in states.items()}, "gw6": (None, None)}
        r = tc.post(f"/v1/rollouts/{ro['id']}/abort", headers=admin).json()
        assert r["state"] == "aborted"
        assert r["reason"] == (
            "aborted by the operator: keep skab-wstat@2 (the fleet has no --rollback-key to sign "
            "the rollback: start edge-fleet serve with --rollback-key; docs/rollouts.md): gw1; "
            "stopped before activating skab-wstat@2: assigned skab-wstat@1 again (no rollback "
            "needed): gw2, gw3, gw4, gw5, gw6")
        assert assigned(tc, auth["gw1"], "pump") is None  # active on v2: keeps it
        for d in ids[1:]:
            got = assigned(tc, auth[d], "pump")
            assert got is not None and (got.version, got.rollback) == (1, None), d
            r2 = tc.get("/v1/models/skab-wstat/2/package", headers=auth[d])
            assert r2.status_code == 403, d


def test_device_reports_only_for_itself(
    mclient: TestClient, admin: dict[str, str], fleet: dict[str, dict[str, str]]
) -> None:
    ro = mclient.post("/v1/rollouts", headers=admin, json={
        "name": "skab-wstat", "version": 2, "devices": ["gw1"]}).json()
    r = report(mclient, fleet["gw2"], "gw1", "rejected", rollout_id=ro["id"])
    assert r.status_code == 403
    r = report(mclient, fleet["gw2"], "gw2", "rejected", rollout_id=ro["id"])
    assert r.status_code == 403  # gw2 is not in that rollout
    assert report(mclient, fleet["gw2"], "gw2", "active", rollout_id=999).status_code == 404
    r = mclient.post("/v1/models/status", headers=admin, json={
        "device_id": "gw1", "name": "skab-wstat", "version": 2, "state": "rejected", "at": 1.0})
    assert r.status_code == 403  # the admin is no device
    shown = mclient.get(f"/v1/rollouts/{ro['id']}", headers=admin).json()
    assert shown["state"] == "promoted" and shown["devices"][0]["state"] is None


def test_rollout_validation(
    mclient: TestClient, admin: dict[str, str], fleet: dict[str, dict[str, str]]
) -> None:
    post = lambda body: mclient.post("/v1/rollouts", headers=admin, json=body)  # noqa: E731
    assert post({"name": "skab-wstat", "version": 7, "tag": "line1"}).status_code == 404
    assert post({"name": "skab-wstat", "version": 2, "tag": "nope"}).status_code == 422
    assert post({"name": "skab-wstat", "version": 2}).status_code == 422
    assert post({"name": "skab-wstat", "version": 2, "devices": ["ghost"]}).status_code == 422
    r = mclient.post("/v1/rollouts", headers=fleet["gw1"],
                     json={"name": "skab-wstat", "version": 2, "tag": "line1"})
    assert r.status_code == 403
    # stream-specific rollout: only that stream gets it
    ro = post({"name": "skab-wstat", "version": 2, "devices": ["gw3"], "stream": "pump1"}).json()
    assert assigned(mclient, fleet["gw3"], "pump2") is None
    got = assigned(mclient, fleet["gw3"], "pump1")
    assert got is not None and got.stream == "pump1" and got.rollout_id == ro["id"]


def test_rollback_key_must_not_be_the_package_signing_key(tmp_path: Path) -> None:
    """The fleet's rollback role is a key of its own (devices trust it for rollbacks only)."""
    key, _ = make_keys(tmp_path / "k")
    other, _ = make_keys(tmp_path / "k2", "fleet-rollback")
    eng = create_engine("sqlite://")
    base = Settings(db_url="sqlite://", admin_token="x", state_dir=tmp_path)
    same = Settings(**{**base.__dict__, "signing_key_file": key, "rollback_key_file": key})
    with pytest.raises(ConfigError, match="same key"):
        build_model_loop(same, eng)
    ok = Settings(**{**base.__dict__, "signing_key_file": key, "rollback_key_file": other})
    assert build_model_loop(ok, eng).rollouts is not None


def test_expected_state_refuses_a_stale_action(
    mclient: TestClient, admin: dict[str, str], fleet: dict[str, dict[str, str]]
) -> None:
    """Two operators looked at the rollout in canary: the first action applies, the second
    (decided on the stale state) gets 409 and changes nothing."""
    ro = mclient.post("/v1/rollouts", headers=admin, json={
        "name": "skab-wstat", "version": 2, "tag": "line1", "canary_percent": 10}).json()
    url = f"/v1/rollouts/{ro['id']}"
    first = mclient.post(f"{url}/promote?expected_state=canary", headers=admin)
    assert first.status_code == 200 and first.json()["state"] == "promoted"
    second = mclient.post(f"{url}/abort?expected_state=canary", headers=admin)
    assert second.status_code == 409
    assert "promoted, not canary" in second.json()["detail"]
    assert mclient.get(url, headers=admin).json()["state"] == "promoted"
    bad = mclient.post(f"{url}/abort?expected_state=nonsense", headers=admin)
    assert bad.status_code == 422
    assert mclient.post(f"{url}/abort?expected_state=promoted",
                        headers=admin).json()["state"] == "aborted"


def _act(client: TestClient, admin: dict[str, str], rid: int, action: str) -> Any:
    return client.post(f"/v1/rollouts/{rid}/{action}", headers=admin)


def test_actions_are_exactly_those_the_fleet_accepts(
    mclient: TestClient, admin: dict[str, str], fleet: dict[str, dict[str, str]]
) -> None:
    """In every state the rollout's ``actions`` list is what the fleet does not refuse: each
    listed action succeeds (tried on a fresh rollout in that state), each other one is 409."""
    every = ["promote", "pause", "resume", "abort"]
    expected = {"canary": ["promote", "pause", "abort"], "paused": ["promote", "resume", "abort"],
                "promoted": ["pause", "abort"], "halted": ["resume", "abort"], "aborted": []}
    steps = {"canary": [], "paused": ["pause"], "promoted": ["promote"], "aborted": ["abort"]}

    def in_state(state: str, device: str) -> Any:
        ro = mclient.post("/v1/rollouts", headers=admin, json={
            "name": "skab-wstat", "version": 2, "devices": [device, "gw10"],
            "canary_percent": 50}).json()
        for action in steps.get(state, []):
            assert _act(mclient, admin, ro["id"], action).status_code == 200
        if state == "halted":
            canary = next(d["device_id"] for d in ro["devices"] if d["canary"])
            report(mclient, fleet[canary], canary, "rejected", rollout_id=ro["id"])
        shown = mclient.get(f"/v1/rollouts/{ro['id']}", headers=admin).json()
        assert shown["state"] == state and shown["superseded_by"] is None
        return shown

    for i, (state, actions) in enumerate(expected.items()):
        for action in every:
            ro = in_state(state, DEVICES[i])  # each its own device: the newest, not superseded
            assert ro["actions"] == actions, state
            listed = {x["id"]: x for x in mclient.get("/v1/rollouts", headers=admin).json()[
                "rollouts"]}
            assert listed[ro["id"]]["actions"] == actions
            got = _act(mclient, admin, ro["id"], action)
            assert got.status_code == (200 if action in actions else 409), (state, action)


def test_a_newer_rollout_of_the_stream_supersedes_and_resume_clears_the_halt_reason(
    mclient: TestClient, admin: dict[str, str], fleet: dict[str, dict[str, str]]
) -> None:
    def create(devices: list[str], stream: str | None = None, **kw: Any) -> Any:
        r = mclient.post("/v1/rollouts", headers=admin, json={
            "name": "skab-wstat", "version": 2, "devices": devices, "stream": stream, **kw})
        assert r.status_code == 201, r.text
        return r.json()

    def show(rid: int) -> Any:
        return mclient.get(f"/v1/rollouts/{rid}", headers=admin).json()

    old = create(["gw1", "gw2"], "pump1", canary_percent=50)
    canary = next(d["device_id"] for d in old["devices"] if d["canary"])
    report(mclient, fleet[canary], canary, "rejected", rollout_id=old["id"], reason="bad golden")
    halted = show(old["id"])
    assert halted["state"] == "halted" and "bad golden" in halted["reason"]
    resumed = _act(mclient, admin, old["id"], "resume").json()
    assert resumed["state"] == "canary" and resumed["reason"] is None
    assert show(old["id"])["reason"] is None
    other_stream = create(["gw1", "gw2"], "fan")
    part = create(["gw1"], "pump1")  # gw2 still follows the old one
    assert show(old["id"])["superseded_by"] is None
    assert show(old["id"])["actions"] == ["promote", "pause", "abort"]
    whole = create(["gw2", "gw3"])  # every stream: gw2's pump1 follows it now
    got = show(old["id"])  # its devices follow part and whole: the oldest of them is named
    assert got["superseded_by"] == part["id"] and got["actions"] == []
    listed = {x["id"]: x for x in mclient.get("/v1/rollouts", headers=admin).json()["rollouts"]}
    assert listed[old["id"]]["superseded_by"] == part["id"]
    assert listed[old["id"]]["actions"] == []
    for newer in (other_stream, part, whole):
        assert listed[newer["id"]]["superseded_by"] is None
    refused = _act(mclient, admin, old["id"], "abort")
    assert refused.status_code == 409 and f"superseded by rollout {part['id']}" in (
        refused.json()["detail"])
    assert show(old["id"])["state"] == "canary"
    # the newer rollout on every stream is not superseded by one of a single stream
    create(["gw2", "gw3"], "pump1")
    assert show(whole["id"])["superseded_by"] is None
