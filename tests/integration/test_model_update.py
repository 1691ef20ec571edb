"""Model updates end to end: a real agent, readings flowing, packages over a real HTTP server.

The server is :class:`tests.integration.model_fleet.FakeFleet` (``http.server`` implementing the
device side of the model-loop contract with Range support and fault injection); packages are
signed copies of ``models/skab-wstat`` with bumped versions (``NEXT``: the builtin's + 1).
"""

from __future__ import annotations

import gc
import json
import os
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from agent.app import Agent
from agent.config.loader import parse_config
from agent.errors import SourceExhausted
from agent.records import Reading
from cloud_sync.package import generate_keypair, key_id_of, load_private_key, sign_rollback
from tests.integration.fleet_peer import FleetProcess
from tests.integration.model_fleet import (
    BUILTIN_VERSION,
    SOURCE_PACKAGE,
    FakeFleet,
    flip_byte,
    make_package,
)

pytestmark = pytest.mark.integration

#: The version an update carries: one above ``builtin:skab-wstat``'s.
NEXT = BUILTIN_VERSION + 1

CHANNELS = tuple(json.loads((SOURCE_PACKAGE / "manifest.json").read_text())["input"]["channels"])
CALIBRATION = 400
TOKEN = "device-token"


class FlowingSource:
    """Readings at a steady pace until ``finish`` is set, then a fixed tail, then exhausted.

    Noise around fixed channel levels, with a 30-sample offset on one channel every 300 samples
    (alerts). Counts every reading it emitted.
    """

    def __init__(self, stream: str, finish: threading.Event, tail: int = 200,
                 per_burst: int = 20, pause_s: float = 0.01) -> None:
        self.stream = stream
        self.channels = CHANNELS
        self.finish = finish
        self.tail = tail
        self.per_burst = per_burst
        self.pause_s = pause_s
        self.emitted = 0
        self._rng = np.random.default_rng(7)
        self._level = np.linspace(1.0, 8.0, len(CHANNELS))

    def _reading(self) -> Reading:
        i = self.emitted
        values = self._level + self._rng.normal(0.0, 0.1, len(CHANNELS))
        if i > CALIBRATION and i % 300 < 30:
            values[2] += 3.0
        return Reading(self.stream, 1_700_000_000.0 + i, values, time.monotonic())

    def run(self, emit: Callable[[Reading], None], reject: object, stop: threading.Event) -> None:
        left: int | None = None
        while not stop.is_set():
            if left is None and self.finish.is_set():
                left = self.tail
            for _ in range(self.per_burst):
                emit(self._reading())
                self.emitted += 1
                if left is not None:
                    left -= 1
                    if left <= 0:
                        raise SourceExhausted("tail done")
            time.sleep(self.pause_s)


@pytest.fixture
def fleet() -> Iterator[FakeFleet]:
    with FakeFleet(TOKEN) as f:
        yield f


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    """(private key file, trusted keys directory holding its public half)."""
    priv, _pub = generate_keypair(tmp_path / "keys")
    trusted = tmp_path / "trusted"
    trusted.mkdir()
    (trusted / _pub.name).write_bytes(_pub.read_bytes())
    return priv, trusted


@pytest.fixture
def rollback_keys(tmp_path: Path) -> tuple[Path, Path]:
    """(rollback private key file, rollback keys directory holding its public half): the
    fleet's rollback role, separate from the package signers of :func:`keys`."""
    priv, _pub = generate_keypair(tmp_path / "rollback-signer", "fleet-rollback")
    trusted = tmp_path / "rollback-trusted"
    trusted.mkdir()
    (trusted / _pub.name).write_bytes(_pub.read_bytes())
    return priv, trusted


def _agent(tmp_path: Path, fleet: FakeFleet | FleetProcess, trusted: Path,
           source: FlowingSource, monkeypatch: pytest.MonkeyPatch, shadow: int = 50,
           model: str = "builtin:skab-wstat", poll_s: float = 0.2, updater: str = "",
           token: str = TOKEN, rollback_keys: Path | None = None) -> Agent:
    monkeypatch.setenv("EDGE_TEST_TOKEN", token)
    text = f"""
[agent]
device_id = "gw1"
state_dir = "{tmp_path / 'state'}"
console_alerts = false
[[streams]]
name = "pump"
model = "{model}"
[streams.source]
kind = "simulator"
[fleet]
enabled = true
url = "{fleet.url}"
token_env = "EDGE_TEST_TOKEN"
interval_s = 0.5
[updater]
enabled = true
poll_interval_s = {poll_s}
trusted_keys_dir = "{trusted}"
shadow_windows = {shadow}
acceptance_runs = 20
{updater}
"""
    if rollback_keys is not None:
        text += f'rollback_keys_dir = "{rollback_keys}"\n'
    config = parse_config(text, env={}).resolved(tmp_path)
    return Agent(config, sources={"pump": source})


def _wait_for(cond: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


def _windows_scored(agent: Agent) -> float:
    return agent.metrics.registry.get_sample_value(
        "edge_agent_windows_total", {"stream": "pump"}
    ) or 0.0


def test_shadow_then_swap_while_readings_flow_drops_nothing(
    tmp_path: Path, fleet: FakeFleet, keys: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """builtin → NEXT through every state, without a dropped reading or a broken alert id."""
    priv, trusted = keys
    finish = threading.Event()
    source = FlowingSource("pump", finish)
    agent = _agent(tmp_path, fleet, trusted, source, monkeypatch)
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    _wait_for(lambda: (agent.metrics.registry.get_sample_value(
        "edge_agent_alerts_total", {"stream": "pump"}) or 0) >= 1)  # an alert on the builtin first
    fleet.publish(make_package(tmp_path, NEXT, priv), tmp_path)
    _wait_for(lambda: (NEXT, "active") in fleet.states())
    time.sleep(1.0)  # the post-swap watch and more alerts on NEXT
    finish.set()
    thread.join(30)
    assert not thread.is_alive()
    assert [s for _, s in fleet.states()] == [
        "downloaded", "verified", "accepted", "shadow", "active",
    ]
    assert _windows_scored(agent) == source.emitted - CALIBRATION
    rows = sqlite3.connect(tmp_path / "state" / "agent.db").execute(
        "SELECT alert_id, seq, payload FROM alerts ORDER BY seq"
    ).fetchall()
    assert [r[1] for r in rows] == list(range(1, len(rows) + 1))
    assert [r[0] for r in rows] == [f"gw1:pump:{r[1]}" for r in rows]
    versions = [json.loads(r[2])["model"]["version"] for r in rows]
    assert versions == sorted(versions) and versions[-1] == NEXT
    assert versions[0] == BUILTIN_VERSION
    state = json.loads((tmp_path / "state" / "models" / "active.json").read_text())
    assert state["streams"]["pump"]["active"]["version"] == NEXT
    assert agent.metrics.registry.get_sample_value(
        "edge_agent_model_version", {"stream": "pump"}) == NEXT


def test_candidate_withdrawn_during_shadow_never_becomes_active(
    tmp_path: Path, fleet: FakeFleet, keys: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rollout is aborted while the candidate shadows (the fleet stops assigning it): the
    shadow run ends without a swap, nothing is reported refused, the builtin keeps scoring."""
    priv, trusted = keys
    finish = threading.Event()
    source = FlowingSource("pump", finish)
    agent = _agent(tmp_path, fleet, trusted, source, monkeypatch, shadow=300)
    with _running(agent, finish):
        fleet.publish(make_package(tmp_path, NEXT, priv), tmp_path)
        _wait_for(lambda: (NEXT, "shadow") in fleet.states(), 60)
        with fleet.state.lock:
            fleet.state.assignment = None  # aborted: the fleet answers 204
        before = _windows_scored(agent)
        _wait_for(lambda: _windows_scored(agent) > before + 900, 120)  # 3 shadow runs' worth
        assert [s for _, s in fleet.states()] == ["downloaded", "verified", "accepted", "shadow"]
        assert agent.streams["pump"].package.manifest.version == BUILTIN_VERSION
        assert agent.metrics.registry.get_sample_value(
            "edge_agent_model_version", {"stream": "pump"}) == BUILTIN_VERSION


@contextmanager
def _running(agent: Agent, finish: threading.Event) -> Iterator[None]:
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        finish.set()
        thread.join(30)
        assert not thread.is_alive()


def _reports(fleet: FakeFleet, state: str) -> list[dict[str, object]]:
    with fleet.state.lock:
        return [r for r in fleet.state.reports if r["state"] == state]


def _assert_refused_and_old_model_scores(
    agent: Agent, fleet: FakeFleet, version: int, reason: str, old_version: int = BUILTIN_VERSION
) -> None:
    """Rejected with ``reason``; the old model keeps scoring, its version unchanged."""
    _wait_for(lambda: bool(_reports(fleet, "rejected")))
    rejected = _reports(fleet, "rejected")
    assert len(rejected) == 1 and rejected[0]["version"] == version
    assert reason in str(rejected[0]["reason"])
    assert "active" not in [s for _, s in fleet.states()]
    before = _windows_scored(agent)
    _wait_for(lambda: _windows_scored(agent) > before + 100)  # still scoring
    assert agent.streams["pump"].package.manifest.version == old_version
    assert agent.metrics.registry.get_sample_value(
        "edge_agent_model_version", {"stream": "pump"}) == old_version
    assert agent.metrics.registry.get_sample_value(
        "edge_agent_model_updates_total", {"stream": "pump", "state": "rejected"}) == 1.0
    time.sleep(0.5)  # several more polls: the refused assignment is not tried again
    assert len(_reports(fleet, "rejected")) == 1


def test_package_with_one_byte_flipped_is_refused(
    tmp_path: Path, fleet: FakeFleet, keys: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    priv, trusted = keys
    finish = threading.Event()
    agent = _agent(tmp_path, fleet, trusted, FlowingSource("pump", finish), monkeypatch)
    pkg = make_package(tmp_path, NEXT, priv)
    flip_byte(pkg)
    fleet.publish(pkg, tmp_path, checked=False)
    with _running(agent, finish):
        _assert_refused_and_old_model_scores(agent, fleet, NEXT, "HashMismatch")
    assert not (tmp_path / "state" / "models" / f"skab-wstat-{NEXT}").exists()


def test_package_signed_by_an_unknown_key_is_refused(
    tmp_path: Path, fleet: FakeFleet, keys: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    _priv, trusted = keys
    stranger, _ = generate_keypair(tmp_path / "stranger")
    finish = threading.Event()
    agent = _agent(tmp_path, fleet, trusted, FlowingSource("pump", finish), monkeypatch)
    fleet.publish(make_package(tmp_path, NEXT, stranger), tmp_path)
    with _running(agent, finish):
        _assert_refused_and_old_model_scores(agent, fleet, NEXT, "not trusted")


def test_older_version_is_refused_then_accepted_with_a_signed_rollback(
    tmp_path: Path, fleet: FakeFleet, keys: tuple[Path, Path],
    rollback_keys: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch,
) -> None:
    priv, trusted = keys
    rb_priv, rb_trusted = rollback_keys
    installed = make_package(tmp_path / "installed", 5, priv)
    finish = threading.Event()
    agent = _agent(tmp_path, fleet, trusted, FlowingSource("pump", finish), monkeypatch,
                   model=str(installed), rollback_keys=rb_trusted)
    older = make_package(tmp_path, 4, priv)
    fleet.publish(older, tmp_path)
    with _running(agent, finish):
        _assert_refused_and_old_model_scores(agent, fleet, 4, "RollbackRefused", old_version=5)
        rollback = sign_rollback(
            load_private_key(rb_priv), key_id_of(rb_priv), rollout_id=1, device_id="gw1",
            stream="pump",
            name="skab-wstat", from_version=5, to_version=4,
        )
        fleet.publish(older, tmp_path, rollback=rollback.model_dump())
        _wait_for(lambda: (4, "active") in fleet.states())
    assert agent.streams["pump"].package.manifest.version == 4


def test_rollback_signed_for_another_device_is_refused(
    tmp_path: Path, fleet: FakeFleet, keys: tuple[Path, Path],
    rollback_keys: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch,
) -> None:
    priv, trusted = keys
    rb_priv, rb_trusted = rollback_keys
    installed = make_package(tmp_path / "installed", 5, priv)
    finish = threading.Event()
    agent = _agent(tmp_path, fleet, trusted, FlowingSource("pump", finish), monkeypatch,
                   model=str(installed), rollback_keys=rb_trusted)
    rollback = sign_rollback(load_private_key(rb_priv), key_id_of(rb_priv), rollout_id=1,
                             device_id="gw2",
                             stream="pump", name="skab-wstat", from_version=5, to_version=4)
    fleet.publish(make_package(tmp_path, 4, priv), tmp_path, rollback=rollback.model_dump())
    with _running(agent, finish):
        _assert_refused_and_old_model_scores(agent, fleet, 4, "RollbackRefused", old_version=5)


def test_interrupted_download_resumes_with_range(
    tmp_path: Path, fleet: FakeFleet, keys: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server drops the connection after 2,000 bytes; the next poll asks for the rest."""
    priv, trusted = keys
    finish = threading.Event()
    agent = _agent(tmp_path, fleet, trusted, FlowingSource("pump", finish), monkeypatch)
    served = fleet.publish(make_package(tmp_path, NEXT, priv), tmp_path)
    fleet.state.drop_after = 2000
    with _running(agent, finish):
        _wait_for(lambda: (NEXT, "active") in fleet.states())
    with fleet.state.lock:
        gets = [h.get("Range") for m, path, h in fleet.state.requests if path == served.url]
    assert gets == [None, "bytes=2000-"]
    assert [s for _, s in fleet.states()][:2] == ["downloaded", "verified"]  # sha and size ok
    assert len(_reports(fleet, "downloaded")) == 1


def test_archive_with_a_wrong_sha256_is_rejected_after_bounded_tries(
    tmp_path: Path, fleet: FakeFleet, keys: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The assignment announces another sha256 than the archive has: 3 downloads with backoff,
    then one ``rejected`` report with the reason, and no more downloads."""
    priv, trusted = keys
    finish = threading.Event()
    agent = _agent(tmp_path, fleet, trusted, FlowingSource("pump", finish), monkeypatch,
                   updater="download_tries = 3\ndownload_backoff_s = 0.2")
    served = fleet.publish(make_package(tmp_path, NEXT, priv), tmp_path)
    with fleet.state.lock:
        assert fleet.state.assignment is not None
        fleet.state.assignment["archive_sha256"] = "0" * 64

    def downloads() -> int:
        with fleet.state.lock:
            return sum(path == served.url for _, path, _ in fleet.state.requests)

    with _running(agent, finish):
        _assert_refused_and_old_model_scores(agent, fleet, NEXT,
                                             "download failed its check 3 times")
        assert downloads() == 3  # more polls have passed (the helper waits): no fourth download
    rejected = _reports(fleet, "rejected")
    assert "sha256" in str(rejected[0]["reason"]) and rejected[0]["rollout_id"] == 1
    assert [s for _, s in fleet.states()] == ["rejected"]
    assert not list((tmp_path / "state" / "models" / "incoming").iterdir())


@pytest.fixture
def small_models_dir(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    """``tmp_path/state/models`` on a tmpfs of ``request.param`` (e.g. ``40k``: room for a
    15 kB archive, not for the 70 kB it unpacks to; root only; skipped elsewhere unless CI is
    set)."""
    mnt = tmp_path / "state" / "models"
    mnt.mkdir(parents=True)
    size = str(request.param)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                       check=False, capture_output=True, text=True)
    if r.returncode != 0:
        if os.environ.get("CI"):
            pytest.fail(f"cannot mount a tmpfs: {r.stderr.strip()}")
        pytest.skip(f"cannot mount a tmpfs (needs root): {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.parametrize(
    ("small_models_dir", "reason", "downloaded"),
    [("8k", "download could not be written 3 times", 0), ("40k", "install failed 3 times", 3)],
    ids=["archive-does-not-fit", "unpacked-does-not-fit"], indirect=["small_models_dir"],
)
def test_update_on_a_full_disk_is_rejected_after_bounded_tries(
    tmp_path: Path, fleet: FakeFleet, keys: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch,
    small_models_dir: Path, reason: str, downloaded: int,
) -> None:
    """The archive, or the package it unpacks to, does not fit (ENOSPC): 3 tries with backoff,
    then ``rejected`` with the reason, and nothing left in ``incoming/``; before, an exception
    was logged at every poll for ever."""
    priv, trusted = keys
    finish = threading.Event()
    agent = _agent(tmp_path, fleet, trusted, FlowingSource("pump", finish), monkeypatch,
                   updater="download_tries = 3\ndownload_backoff_s = 0.2")
    fleet.publish(make_package(tmp_path, NEXT, priv), tmp_path)
    with _running(agent, finish):
        _assert_refused_and_old_model_scores(agent, fleet, NEXT, reason)
    assert "No space left on device" in str(_reports(fleet, "rejected")[0]["reason"])
    assert [s for _, s in fleet.states()] == ["downloaded"] * downloaded + ["rejected"]
    assert not list((small_models_dir / "incoming").iterdir())


def test_start_reports_the_running_package(
    tmp_path: Path, fleet: FakeFleet, keys: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first pass tells the fleet what each stream runs: the configured builtin."""
    _priv, trusted = keys
    finish = threading.Event()
    agent = _agent(tmp_path, fleet, trusted, FlowingSource("pump", finish), monkeypatch)
    with _running(agent, finish):
        _wait_for(lambda: bool(fleet.states(running=True)))
        time.sleep(0.5)  # more polls: reported once
    with fleet.state.lock:
        reports = list(fleet.state.reports)
    assert len(reports) == 1
    r = reports[0]
    assert (r["device_id"], r["stream"], r["name"], r["version"], r["state"]) == (
        "gw1", "pump", "skab-wstat", BUILTIN_VERSION, "active")
    assert r["rollout_id"] is None and r["details"] == {"origin": "configured"}


@pytest.mark.parametrize(
    ("tamper", "reason"),
    [({"golden_delta": 1.0}, "golden vectors differ"),
     ({"latency_budget_ms": 0.0001}, "p99 latency")],
    ids=["golden-tampered", "too-slow"],
)
def test_model_failing_acceptance_is_rejected(
    tmp_path: Path, fleet: FakeFleet, keys: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch,
    tamper: dict[str, float], reason: str,
) -> None:
    """Validly signed by a trusted key, but the device's own acceptance test fails."""
    priv, trusted = keys
    finish = threading.Event()
    agent = _agent(tmp_path, fleet, trusted, FlowingSource("pump", finish), monkeypatch)
    fleet.publish(make_package(tmp_path, NEXT, priv, **tamper), tmp_path)  # type: ignore[arg-type]
    with _running(agent, finish):
        _assert_refused_and_old_model_scores(agent, fleet, NEXT, reason)
    assert [s for _, s in fleet.states()] == ["downloaded", "verified", "rejected"]


def test_restart_comes_back_on_the_installed_model(
    tmp_path: Path, fleet: FakeFleet, keys: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    priv, trusted = keys
    finish = threading.Event()
    agent = _agent(tmp_path, fleet, trusted, FlowingSource("pump", finish), monkeypatch)
    fleet.publish(make_package(tmp_path, NEXT, priv), tmp_path)
    with _running(agent, finish):
        _wait_for(lambda: (NEXT, "active") in fleet.states())
    swapped_in = agent.streams["pump"].pipeline.threshold
    again = _agent(tmp_path, fleet, trusted, FlowingSource("pump", threading.Event()), monkeypatch)
    assert again.streams["pump"].package.manifest.version == NEXT
    # the calibration NEXT was swapped in with is stored: restored, with the calibration readings
    # a later update calibrates its candidate on
    pipeline = again.streams["pump"].pipeline
    assert not pipeline.calibrating and pipeline.threshold == swapped_in
    assert pipeline.calibration_samples is not None
    assert pipeline.calibration_samples.shape == (CALIBRATION, len(CHANNELS))
    again.store.close()
    # an installed package tampered with on disk is never loaded: the configured one is used,
    # and the stored calibration (of NEXT) does not fit it
    flip_byte(tmp_path / "state" / "models" / f"skab-wstat-{NEXT}")
    third = _agent(tmp_path, fleet, trusted, FlowingSource("pump", threading.Event()), monkeypatch)
    assert third.streams["pump"].package.manifest.version == BUILTIN_VERSION
    assert third.streams["pump"].pipeline.calibrating
    third.store.close()


def _rss_bytes() -> int:
    try:
        import psutil  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415
    except ImportError:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    return int(psutil.Process().memory_info().rss)


def test_memory_does_not_grow_across_100_swaps(
    tmp_path: Path, fleet: FakeFleet, keys: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """100 full updates (download, verify, accept, shadow, swap, watch), NEXT … NEXT + 99.

    RSS growth from swap 10 to swap 100 must stay under 20 MB. Measured (/proc/self/statm, psutil
    not installed; 3 runs): 131.6 → 136.7, 132.6 → 138.2, 132.0 → 137.3 MB, i.e. 5.1-5.6 MB over
    90 swaps (~60 kB per swap, part of it pytest's captured log records).
    """
    priv, trusted = keys
    finish = threading.Event()
    agent = _agent(tmp_path, fleet, trusted, FlowingSource("pump", finish), monkeypatch,
                   shadow=10, poll_s=0.05)
    # a generous latency budget: this test is about memory, not a loaded CI machine's jitter
    packages = [make_package(tmp_path / "pkgs", v, priv, latency_budget_ms=100.0)
                for v in range(NEXT, NEXT + 100)]
    rss: dict[int, int] = {}
    with _running(agent, finish):
        for n, pkg in enumerate(packages, start=1):
            version = BUILTIN_VERSION + n
            fleet.publish(pkg, tmp_path / "archives")
            _wait_for(lambda v=version: (v, "active") in fleet.states(), timeout_s=60)  # type: ignore[misc]
            _wait_for(lambda: agent.updater is not None and not _busy(agent), timeout_s=60)
            if n in (10, 100):
                gc.collect()
                rss[n] = _rss_bytes()
    growth_mb = (rss[100] - rss[10]) / 1e6
    print(f"RSS after swap 10: {rss[10] / 1e6:.1f} MB, after swap 100: {rss[100] / 1e6:.1f} MB, "
          f"growth {growth_mb:.2f} MB")
    assert growth_mb < 20.0
    last = BUILTIN_VERSION + 100
    assert agent.streams["pump"].package.manifest.version == last
    installed = sorted(p.name for p in (tmp_path / "state" / "models").iterdir())
    assert installed == sorted(["active.json", "high_water.json", "incoming",
                                f"skab-wstat-{last - 1}", f"skab-wstat-{last}"])
    assert len(_reports(fleet, "rejected")) == 0


def _busy(agent: Agent) -> bool:
    """True while the last swap's post-swap watch still observes the stream."""
    return agent.streams["pump"].pipeline.observer is not None
