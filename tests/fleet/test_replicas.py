"""Two real ``edge-fleet serve`` replicas on one PostgreSQL database (docs/operations.md,
"Several replicas"): a revocation through one is refused by the other at once (with a one-hour
token cache), and a promote and an abort sent together through the two end in one state with
one 409."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from sqlalchemy import text

from fleet.db.engine import make_engine
from fleet.settings import Settings
from tests.fleet.conftest import ADMIN_TOKEN, wait_healthy
from tests.fleet.live import free_port, wait_for
from tests.fleet.model_pkg import archive, make_keys

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
#: Far beyond every wait here: a refusal cannot come from the cache expiring.
CACHE_TTL_S = 3600


@dataclass
class Replica:
    name: str
    base: str
    proc: subprocess.Popen[bytes]
    log: Path

    def get(self, path: str, **kw: Any) -> requests.Response:
        return requests.get(self.base + path, timeout=10, **kw)

    def post(self, path: str, **kw: Any) -> requests.Response:
        return requests.post(self.base + path, timeout=10, **kw)


def _empty(url: str) -> None:
    eng = make_engine(Settings(db_url=url, admin_token=ADMIN_TOKEN, pool_size=1))
    with eng.begin() as conn:
        names = conn.execute(text(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
            "AND tablename <> 'alembic_version'")).scalars().all()
        conn.execute(text(f"TRUNCATE {', '.join(names)} RESTART IDENTITY CASCADE"))
    eng.dispose()


@pytest.fixture
def replicas(pg_url: str, tmp_path: Path) -> Iterator[tuple[Replica, Replica]]:
    """Replicas ``a`` and ``b``: same database, admin token and keys; own state directories."""
    _empty(pg_url)
    key, trusted = make_keys(tmp_path / "keys")
    rollback, _ = make_keys(tmp_path / "rollback", "fleet-rollback")
    token_file = tmp_path / "admin.token"
    token_file.write_text(ADMIN_TOKEN + "\n")
    exe = shutil.which("edge-fleet")
    cmd = [exe] if exe else [sys.executable, "-m", "fleet.cli"]
    env = {k: v for k, v in os.environ.items() if k != "EDGE_FLEET_ADMIN_TOKEN"}
    started: list[Replica] = []
    try:
        for name in ("a", "b"):
            port, log = free_port(), tmp_path / f"serve-{name}.log"
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    [*cmd, "serve", "--db", pg_url, "--port", str(port), "--state-dir",
                     str(tmp_path / f"state-{name}"), "--admin-token-file", str(token_file),
                     "--auth-cache-ttl", str(CACHE_TTL_S), "--replica-id", name,
                     "--trusted-keys", str(trusted), "--rollback-key", str(rollback),
                     "--pool-size", "4"],
                    stdout=out, stderr=subprocess.STDOUT, env=env)
            started.append(Replica(name, f"http://127.0.0.1:{port}", proc, log))
        for r in started:
            wait_healthy(r.base, r.proc, r.log, 45)
            # the token cache is on only while the listener listens (fleet.db.invalidation)
            wait_for(lambda r=r: "fleet_invalidation_listening 1.0" in r.get("/metrics").text,
                     f"replica {r.name} listening", 20)
            assert f'fleet_replica_info{{replica="{r.name}"}} 1.0' in r.get("/metrics").text
        (tmp_path / "pkg").mkdir()
        for version in (1, 2):
            pushed = started[0].post("/v1/models", data=archive(tmp_path / "pkg", version, key),
                                     headers={**ADMIN, "Content-Type": "application/gzip"})
            assert pushed.status_code == 201, pushed.text
        yield started[0], started[1]
    finally:
        for r in started:
            r.proc.send_signal(signal.SIGTERM)
        for r in started:
            try:
                r.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                r.proc.kill()
                r.proc.wait()
    for r in started:
        assert "Traceback" not in r.log.read_text(), r.log.read_text()


def _enroll(replica: Replica, device_id: str) -> dict[str, str]:
    resp = replica.post("/v1/devices", json={"device_id": device_id, "tags": ["line1"]},
                        headers=ADMIN)
    assert resp.status_code == 201, resp.text
    return {"Authorization": f"Bearer {resp.json()['token']}"}


def _assignment(replica: Replica, auth: dict[str, str]) -> int:
    return replica.get("/v1/models/assignment", headers=auth).status_code


def test_revocation_through_one_replica_is_refused_by_the_other_at_once(
    replicas: tuple[Replica, Replica], pg_url: str
) -> None:
    a, b = replicas
    gw1, gw2 = _enroll(a, "gw1"), _enroll(a, "gw2")
    for replica in (a, b):  # both replicas now hold both tokens in their caches
        assert _assignment(replica, gw1) == _assignment(replica, gw2) == 204
    # control: a revocation that bypasses the fleet (no NOTIFY) stays invisible to b's cache,
    # so b's refusal below comes from the notification, not from a cache miss
    eng = make_engine(Settings(db_url=pg_url, admin_token=ADMIN_TOKEN, pool_size=1))
    with eng.begin() as conn:
        conn.execute(text("UPDATE devices SET revoked_at = now(), token_hash = NULL "
                          "WHERE device_id = 'gw2'"))
    eng.dispose()
    assert _assignment(b, gw2) == 204

    started = time.monotonic()
    assert requests.delete(f"{a.base}/v1/devices/gw1", headers=ADMIN,
                           timeout=10).status_code == 204
    wait_for(lambda: _assignment(b, gw1) == 401, "replica b to refuse the revoked token", 10)
    took = time.monotonic() - started
    assert took < 3.0, f"b refused after {took:.1f} s"  # the cache TTL is 3600 s
    assert _assignment(a, gw1) == 401
    assert "fleet_invalidations_total{kind=\"device\"} 1.0" in b.get("/metrics").text

    # operator API tokens are looked up per request: revoked through a, refused by b at once
    assert a.post("/v1/users", json={"username": "ops", "role": "operator"},
                  headers=ADMIN).status_code == 201
    made = a.post("/v1/tokens", json={"username": "ops", "role": "operator"}, headers=ADMIN)
    ops = {"Authorization": f"Bearer {made.json()['token']}"}
    assert b.get("/v1/rollouts", headers=ops).status_code == 200
    assert requests.delete(f"{a.base}/v1/tokens/{made.json()['id']}", headers=ADMIN,
                           timeout=10).status_code == 204
    assert b.get("/v1/rollouts", headers=ops).status_code == 401


def _race(first: tuple[Replica, str], second: tuple[Replica, str]) -> list[requests.Response]:
    """Send both POSTs at the same moment (a barrier), one per thread."""
    barrier = threading.Barrier(2)
    out: list[requests.Response | None] = [None, None]

    def send(i: int, replica: Replica, path: str) -> None:
        barrier.wait(10)
        out[i] = replica.post(path, headers=ADMIN)

    threads = [threading.Thread(target=send, args=(i, r, p))
               for i, (r, p) in enumerate((first, second))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert all(r is not None for r in out)
    return [r for r in out if r is not None]


def test_promote_and_abort_at_once_through_two_replicas(
    replicas: tuple[Replica, Replica]
) -> None:
    a, b = replicas
    for d in ("gw1", "gw2", "gw3", "gw4"):
        _enroll(a, d)
    for round_ in range(4):
        ro = a.post("/v1/rollouts", headers=ADMIN, json={
            "name": "skab-wstat", "version": 2, "tag": "line1", "canary_percent": 25})
        assert ro.status_code == 201 and ro.json()["state"] == "canary", ro.text
        rid = ro.json()["id"]
        # alternate which replica promotes, so both replicas both win and lose
        promoter, aborter = (a, b) if round_ % 2 == 0 else (b, a)
        promote, abort = _race((promoter, f"/v1/rollouts/{rid}/promote?expected_state=canary"),
                               (aborter, f"/v1/rollouts/{rid}/abort?expected_state=canary"))
        codes = sorted([promote.status_code, abort.status_code])
        assert codes == [200, 409], (promote.text, abort.text)
        won = promote if promote.status_code == 200 else abort
        lost = abort if won is promote else promote
        assert "not canary" in lost.json()["detail"]
        state = won.json()["state"]
        assert state in ("promoted", "aborted")
        for replica in (a, b):  # one state, whichever replica is asked
            seen = replica.get(f"/v1/rollouts/{rid}", headers=ADMIN).json()
            assert seen["state"] == state
            assert all(d["assigned"] for d in seen["devices"]) == (state == "promoted")
        if state == "promoted":
            assert a.post(f"/v1/rollouts/{rid}/abort", headers=ADMIN).status_code == 200

    # without expected_state the database still serialises them: abort after promote is
    # allowed (both 200), promote after abort is not (409); either way the rollout ends aborted
    ro = a.post("/v1/rollouts", headers=ADMIN, json={
        "name": "skab-wstat", "version": 2, "tag": "line1", "canary_percent": 25}).json()
    promote, abort = _race((a, f"/v1/rollouts/{ro['id']}/promote"),
                           (b, f"/v1/rollouts/{ro['id']}/abort"))
    assert abort.status_code == 200 and promote.status_code in (200, 409)
    assert b.get(f"/v1/rollouts/{ro['id']}", headers=ADMIN).json()["state"] == "aborted"
