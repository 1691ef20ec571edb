"""A hostile fleet: a real HTTP server answers a real agent with malicious assignments/archives.

The server is :class:`tests.integration.model_fleet.FakeFleet` (``http.server`` in a thread,
the device side of the model-loop contract), told to serve whatever a compromised fleet (or
anyone on the path of a plain-HTTP URL) would. The agent is the whole daemon
(:class:`agent.app.Agent`: pipeline, store, updater threads, real files), running
``skab-wstat@6``. Each attack must end in a ``rejected`` status report to the fleet with a
clear reason, the running model untouched, and nothing written or removed outside the agent's
state directory.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent.services.package_guard import HighWater
from cloud_sync.package import generate_keypair, key_id_of, load_private_key, pack, sign_rollback
from tests.integration.model_fleet import FakeFleet, make_package, pax_bomb, tar_gz_with
from tests.integration.test_model_update import (
    FlowingSource,
    _agent,
    _running,
    _wait_for,
)

pytestmark = pytest.mark.integration

TOKEN = "device-token"


@pytest.fixture
def fleet() -> Any:
    with FakeFleet(TOKEN) as f:
        yield f


def _tree(root: Path, *skip: Path) -> dict[str, int]:
    """Every file and directory under ``root`` except ``skip``: path -> size (-1: directory)."""
    out: dict[str, int] = {}
    for p in sorted(root.rglob("*")):
        if any(p == s or s in p.parents for s in skip):
            continue
        out[str(p.relative_to(root))] = -1 if p.is_dir() else p.stat().st_size
    return out


class Attacks:
    """Serve one attack at a time and wait for its ``rejected`` report."""

    def __init__(self, fleet: FakeFleet, workdir: Path) -> None:
        self.fleet = fleet
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)

    def _rejected(self) -> list[dict[str, Any]]:
        with self.fleet.state.lock:
            return [r for r in self.fleet.state.reports if r["state"] == "rejected"]

    def expect_rejected(self, serve: Callable[[], None], reason: str) -> dict[str, Any]:
        before = len(self._rejected())
        serve()
        _wait_for(lambda: len(self._rejected()) > before)
        time.sleep(0.5)  # more polls: the same attack is reported once, not on every poll
        got = self._rejected()[before:]
        assert len(got) == 1, got
        assert reason in str(got[0]["reason"]), got[0]["reason"]
        return got[0]

    def archive(self, package_dir: Path) -> bytes:
        out = self.workdir / f"{package_dir.name}.tar.gz"
        pack(package_dir, out)
        return out.read_bytes()

    def requested(self, url: str) -> bool:
        with self.fleet.state.lock:
            return any(path == url for _, path, _ in self.fleet.state.requests)


def _a(name: str, version: int, **kw: Any) -> dict[str, Any]:
    return {"rollout_id": 9, "stream": None, "name": name, "version": version,
            "url": f"/v1/models/{name}/{version}/package", **kw}


def test_hostile_fleet_gets_nothing(
    tmp_path: Path, fleet: FakeFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    pkg_priv, pkg_pub = generate_keypair(tmp_path / "package-signer", "ops")
    rb_priv, rb_pub = generate_keypair(tmp_path / "rollback-signer", "fleet-rollback")
    trusted, rb_trusted = tmp_path / "trusted", tmp_path / "rollback-trusted"
    for d, pub in ((trusted, pkg_pub), (rb_trusted, rb_pub)):
        d.mkdir()
        (d / pub.name).write_bytes(pub.read_bytes())
    pkgs = tmp_path / "pkgs"
    v6 = make_package(pkgs / "installed", 6, pkg_priv)
    victim = tmp_path / "victim-7"
    victim.mkdir()
    (victim / "keep.txt").write_text("operator data")
    finish = threading.Event()
    agent = _agent(tmp_path, fleet, trusted, FlowingSource("pump", finish), monkeypatch,
                   model=str(v6), rollback_keys=rb_trusted)
    state = tmp_path / "state"
    outside = _tree(tmp_path, state, pkgs)
    attacks = Attacks(fleet, pkgs / "archives")
    good7 = attacks.archive(make_package(pkgs, 7, pkg_priv))

    with _running(agent, finish):
        # 1. names that would reach a path: refused at parse time, before any request
        for bad, field in (({"name": "../../../victim"}, "name"),
                           ({"stream": "../../../victim"}, "stream"),
                           ({"url": "/v1/models/../../../victim"}, "url")):
            a = {**_a("skab-wstat", 7), **bad}
            rep = attacks.expect_rejected(
                lambda a=a: fleet.serve(a, good7),  # type: ignore[misc]
                "assignment refused")
            assert field in str(rep["reason"]) and rep["rollout_id"] == 9
            assert not attacks.requested(a["url"])
        # 2. an announced archive larger than updater.max_archive_bytes: never downloaded
        huge = _a("skab-wstat", 7, archive_sha256="0" * 64, archive_size=300 * 1024 * 1024)
        attacks.expect_rejected(lambda: fleet.serve(huge), "exceeds updater.max_archive_bytes")
        assert not attacks.requested(huge["url"])
        # 3. a 1 MB archive holding a 1 GiB PAX header
        attacks.expect_rejected(lambda: fleet.serve(_a("skab-wstat", 7), pax_bomb(1 << 30)),
                                "meta header")
        # 4. a validly signed package with a member its manifest does not name
        extra = tar_gz_with(make_package(pkgs, 7, pkg_priv), {"payload.bin": b"\x7fELF" * 4096})
        attacks.expect_rejected(lambda: fleet.serve(_a("skab-wstat", 7), extra),
                                "not named by the signed manifest")
        # 5. a package signed by the fleet's ROLLBACK key: not a package signer
        by_rb = attacks.archive(make_package(pkgs / "by-rb", 7, rb_priv))
        attacks.expect_rejected(lambda: fleet.serve(_a("skab-wstat", 7), by_rb), "not trusted")
        assert agent.streams["pump"].package.label == "skab-wstat@6"

        # 6. anti-rollback across names: another model, then an older skab-wstat
        other = attacks.archive(make_package(pkgs, 1, pkg_priv, name="skab-other"))
        fleet.serve(_a("skab-other", 1), other)
        _wait_for(lambda: agent.streams["pump"].package.label == "skab-other@1")
        old = attacks.archive(make_package(pkgs, 1, pkg_priv))

        def rollback(key: Path = rb_priv, **kw: Any) -> dict[str, Any]:
            args: dict[str, Any] = {"rollout_id": 9, "device_id": "gw1", "stream": "pump",
                                    "name": "skab-wstat", "from_version": 6, "to_version": 1}
            return sign_rollback(load_private_key(key), key_id_of(key),
                                 **{**args, **kw}).model_dump()

        for rb, reason in (
            (None, "not newer than version 6 of skab-wstat"),
            (rollback(pkg_priv), "not a trusted rollback key"),  # wrong role
            (rollback(clock=lambda: time.time() - 7200), "expired"),
            (rollback(stream="fan"), "device/stream/name/from/to"),  # another assignment
            (rollback(to_version=2), "device/stream/name/from/to"),
            (rollback(device_id="gw2"), "device/stream/name/from/to"),
            (rollback(rollout_id=8), "for rollout 8, not this assignment's rollout 9"),
            (rollback(rollout_id=None), "names no rollout_id"),  # an older fleet's
        ):
            attacks.expect_rejected(
                lambda rb=rb: fleet.serve(_a("skab-wstat", 1, rollback=rb), old),  # type: ignore[misc]
                reason)
            assert agent.streams["pump"].package.label == "skab-other@1"
            assert not attacks.requested("/v1/models/skab-wstat/1/package")  # not downloaded
        # the one valid rollback for exactly this device, stream, name and versions
        captured = _a("skab-wstat", 1, rollback=rollback())
        fleet.serve(captured, old)
        _wait_for(lambda: agent.streams["pump"].package.label == "skab-wstat@1")
        # 7. a later rollout (10) moves the stream on; the captured rollout-9 rollback,
        # replayed well within its hour, is refused
        other2 = attacks.archive(make_package(pkgs, 2, pkg_priv, name="skab-other"))
        fleet.serve({**_a("skab-other", 2), "rollout_id": 10}, other2)
        _wait_for(lambda: agent.streams["pump"].package.label == "skab-other@2")
        attacks.expect_rejected(lambda: fleet.serve(captured, old),
                                "undoes rollout 9, but this stream has already applied a "
                                "signed rollback of rollout 9")
        assert agent.streams["pump"].package.label == "skab-other@2"
        # 8. (retest of issue 15) a genuine signed newer package served under an unsigned
        # rollout_id of 2**63-1 installs, but raises no mark: the operator's genuine abort of
        # rollout 11 (skab-other 3 -> 2, signed now) still applies
        other3 = attacks.archive(make_package(pkgs, 3, pkg_priv, name="skab-other"))
        fleet.serve({**_a("skab-other", 3), "rollout_id": 2**63 - 1}, other3)
        _wait_for(lambda: agent.streams["pump"].package.label == "skab-other@3")
        abort = rollback(rollout_id=11, name="skab-other", from_version=3, to_version=2)
        fleet.serve({**_a("skab-other", 2, rollback=abort), "rollout_id": 11}, other2)
        _wait_for(lambda: agent.streams["pump"].package.label == "skab-other@2")

    assert _tree(tmp_path, state, pkgs) == outside  # nothing written or removed outside state/
    assert (victim / "keep.txt").read_text() == "operator data"
    models = sorted(p.name for p in (state / "models").iterdir())
    assert models == ["active.json", "high_water.json", "incoming", "skab-other-2",
                      "skab-other-3"]  # running skab-other@2, previous skab-other@3
    assert list((state / "models" / "incoming").iterdir()) == []
    # the marks a restart reads: the rollback to skab-wstat@1 did not lower skab-wstat's
    marks = HighWater(state / "models" / "high_water.json")
    assert marks.marks("pump") == {"skab-wstat": 6, "skab-other": 3}
    assert marks.rollback_mark("pump") == 11  # only signed rollbacks raised it
    assert sorted(p.name for p in (state / "models" / "skab-other-2").iterdir()) == sorted(
        p.name for p in v6.iterdir())
    assert agent.metrics.registry.get_sample_value(
        "edge_agent_model_updates_total", {"stream": "pump", "state": "rejected"}) == 16.0


def test_short_downloads_do_not_fill_the_disk(
    tmp_path: Path, fleet: FakeFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retest of issue 15: a fleet that assigns a new name at every poll and always sends one
    byte less than it announces. At most one partial download is on disk at any time (a part
    file an earlier run left is deleted too), each short download is rejected and reported
    after ``download_tries`` tries without a new byte, and the part files count in the disk
    budget's ``models`` part."""
    from agent.disk_budget import default_parts  # noqa: PLC0415

    pkg_priv, pkg_pub = generate_keypair(tmp_path / "package-signer", "ops")
    trusted = tmp_path / "trusted"
    trusted.mkdir()
    (trusted / pkg_pub.name).write_bytes(pkg_pub.read_bytes())
    v6 = make_package(tmp_path / "pkgs" / "installed", 6, pkg_priv)
    incoming = tmp_path / "state" / "models" / "incoming"
    incoming.mkdir(parents=True)
    (incoming / "left-by-an-attack-9.tar.part").write_bytes(b"x" * 50_000)
    finish = threading.Event()
    agent = _agent(tmp_path, fleet, trusted, FlowingSource("pump", finish), monkeypatch,
                   model=str(v6), updater="download_tries = 2\ndownload_backoff_s = 0.2")
    attacks = Attacks(fleet, tmp_path / "archives")
    junk = b"x" * 100_000
    most = [0]
    seen_parts: set[str] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            parts = list(incoming.glob("*.part"))
            most[0] = max(most[0], len(parts))
            seen_parts.update(p.name for p in parts)
            time.sleep(0.01)

    watcher = threading.Thread(target=watch, daemon=True)
    with _running(agent, finish):
        watcher.start()
        for i in range(1, 5):
            name = f"fill-{i}"
            a = {**_a(name, 1), "archive_size": len(junk) + 1}
            rep = attacks.expect_rejected(lambda a=a: fleet.serve(a, junk),  # type: ignore[misc]
                                          "ended short again without a new byte 2 times")
            assert f"ended at byte {len(junk)} of {len(junk) + 1}" in str(rep["reason"])
            assert rep["name"] == name
        # a part file of the current download counts in the models part of the disk budget
        fleet.serve({**_a("fill-5", 1), "archive_size": len(junk) + 1}, junk)
        _wait_for((incoming / "fill-5-1.tar.part").exists)
        models = {p.name: p for p in default_parts(tmp_path / "state")}["models"]
        assert models.used_bytes() >= len(junk)
    done.set()
    watcher.join()
    assert most[0] <= 1, most
    assert {f"fill-{i}-1.tar.part" for i in range(1, 6)} <= seen_parts
    assert not (incoming / "left-by-an-attack-9.tar.part").exists()
    assert {p.name for p in incoming.glob("*.part")} <= {"fill-5-1.tar.part"}
