"""Assignment names at parse time, high-water marks across names, rollback roles and expiry."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from agent.config.loader import parse_config
from agent.errors import ConfigError
from agent.services.model_store import Installed, ModelStore
from agent.services.package_guard import (
    HighWater,
    PackageGuard,
    load_rollback_policy,
    salvage,
)
from agent.services.updater import UpdaterConfig
from cloud_sync.errors import PackageFormatError, RollbackRefused
from cloud_sync.manifest import Manifest
from cloud_sync.package import generate_keypair, load_private_key, load_public_keys, sign_rollback
from cloud_sync.protocol import ModelAssignment
from cloud_sync.rollback import RollbackPolicy
from tests.integration.model_fleet import SOURCE_PACKAGE, make_package

NOW = 1_800_000_000.0
SHA = "0" * 64


def _assignment(**kw: Any) -> dict[str, Any]:
    a: dict[str, Any] = {"rollout_id": 1, "stream": "pump", "name": "skab-wstat", "version": 2,
                         "archive_sha256": SHA, "archive_size": 1000,
                         "url": "/v1/models/skab-wstat/2/package"}
    return {**a, **kw}


def _manifest(name: str, version: int) -> Manifest:
    raw = json.loads((SOURCE_PACKAGE / "manifest.json").read_text())
    return Manifest.model_validate({**raw, "name": name, "version": version})


@pytest.mark.parametrize("bad", [
    {"name": "../../../x"}, {"name": ".."}, {"name": "a/b"}, {"name": "a\\b"}, {"name": "A"},
    {"name": "x" * 65}, {"name": "a\x00"}, {"stream": ".."}, {"stream": "../pump"},
    {"stream": "a/b"}, {"url": "/v1/../../etc/passwd"}, {"url": "http://evil/x"},
    {"url": "//evil/x"}, {"url": "/v1/%2e%2e/x"}, {"archive_size": 2**40},
    {"version": 2**64}, {"rollback": {"device_id": "gw1", "name": "../x", "from_version": 2,
                                      "to_version": 1, "issued_at": NOW, "key_id": "k",
                                      "signature": "AA=="}},
])
def test_assignment_names_that_would_reach_a_path_fail_the_schema(bad: dict[str, Any]) -> None:
    ModelAssignment.model_validate(_assignment())  # the valid one parses
    with pytest.raises(ValidationError):
        ModelAssignment.model_validate(_assignment(**bad))


def test_salvage_reports_only_valid_fields() -> None:
    raw = json.dumps(_assignment(name="../../../x", version=7, rollout_id=3)).encode()
    assert salvage(raw) == ("invalid-assignment", 7, 3)
    assert salvage(b"\xff not json") == ("invalid-assignment", 1, None)
    assert salvage(json.dumps(_assignment(version=True)).encode())[1] == 1


def test_salvage_survives_deeply_nested_json() -> None:
    # a hostile fleet's answer nested deeper than the stdlib parser's recursion limit: the
    # refusal must still be reported (it raised RecursionError and the report was lost)
    assert salvage(b"[" * 100_000) == ("invalid-assignment", 1, None)
    assert salvage(b'{"a":' * 5_000 + b"1" + b"}" * 5_000) == ("invalid-assignment", 1, None)


def test_high_water_persists_and_never_lowers(tmp_path: Path) -> None:
    hw = HighWater(tmp_path / "hw.json")
    hw.ran("pump", "skab-wstat", 6)
    hw.ran("pump", "skab-wstat", 3)
    hw.ran("pump", "skab-other", 1)
    again = HighWater(tmp_path / "hw.json")  # a restart
    assert again.marks("pump") == {"skab-wstat": 6, "skab-other": 1}
    assert again.marks("fan") == {}


def test_unreadable_high_water_refuses_every_package(tmp_path: Path) -> None:
    (tmp_path / "hw.json").write_text("{not json")
    hw = HighWater(tmp_path / "hw.json")
    guard = PackageGuard(hw, None, "gw1", 10**9, clock=lambda: NOW)
    a = ModelAssignment.model_validate(_assignment())
    assert "unreadable" in str(guard.before_download(a, "pump", ("skab-wstat", 1)))
    with pytest.raises(PackageFormatError, match="unreadable"):
        guard.check("pump", ("skab-wstat", 1), a, _manifest("skab-wstat", 2))
    hw.ran("pump", "skab-wstat", 2)  # never overwrites the broken file with fresh marks
    assert (tmp_path / "hw.json").read_text() == "{not json"


def test_announced_size_is_bounded_before_download(tmp_path: Path) -> None:
    guard = PackageGuard(HighWater(tmp_path / "hw.json"), None, "gw1", 5000)
    running = ("skab-wstat", 1)
    ok = ModelAssignment.model_validate(_assignment())
    assert guard.before_download(ok, "pump", running) is None
    big = ModelAssignment.model_validate(_assignment(archive_size=5001))
    assert "exceeds updater.max_archive_bytes" in str(guard.before_download(big, "pump", running))
    # anti-rollback is checked on the assignment too: a refused rollback costs no download
    old = ModelAssignment.model_validate(_assignment(version=1))
    assert "RollbackRefused" in str(guard.before_download(old, "pump", running))


@pytest.fixture
def roles(tmp_path: Path) -> tuple[Path, Path, RollbackPolicy]:
    """(package key, rollback key, policy over the rollback keys only)."""
    pkg, _ = generate_keypair(tmp_path / "pkg", "ops")
    rb, _ = generate_keypair(tmp_path / "rb", "fleet-rb")
    return pkg, rb, RollbackPolicy(load_public_keys(tmp_path / "rb"), max_age_s=600.0)


def _rollback(key: Path, **kw: Any) -> dict[str, Any]:
    args: dict[str, Any] = {"rollout_id": 1, "device_id": "gw1", "stream": "pump",
                            "name": "skab-wstat", "from_version": 6, "to_version": 1,
                            "clock": lambda: NOW - 5}
    return sign_rollback(load_private_key(key), key.stem, **{**args, **kw}).model_dump()


def test_anti_rollback_across_names(
    tmp_path: Path, roles: tuple[Path, Path, RollbackPolicy]
) -> None:
    """skab-wstat@6, then skab-other@1: skab-wstat@1 still needs a rollback; @6 and @7 do not."""
    _pkg, rb_key, policy = roles
    hw = HighWater(tmp_path / "hw.json")
    hw.ran("pump", "skab-wstat", 6)
    hw.ran("pump", "skab-other", 1)
    guard = PackageGuard(hw, policy, "gw1", 10**9, clock=lambda: NOW)
    running = ("skab-other", 1)

    def check(version: int, rollback: dict[str, Any] | None = None, stream: str = "pump") -> None:
        a = ModelAssignment.model_validate(_assignment(version=version, rollback=rollback))
        guard.check(stream, running, a, _manifest("skab-wstat", version))

    with pytest.raises(RollbackRefused, match="not newer than version 6 of skab-wstat"):
        check(1)
    check(6)  # the newest of that name it ran: switching back is no rollback
    check(7)
    check(1, _rollback(rb_key))  # a valid rollback for exactly this
    # the mark is per stream: another stream never ran skab-wstat
    check(1, stream="fan")
    # and the same name at the same version as running needs one too
    with pytest.raises(RollbackRefused):
        guard.check("pump", running, ModelAssignment.model_validate(
            _assignment(name="skab-other", version=1)), _manifest("skab-other", 1))
    # the archive must hold the assigned package
    with pytest.raises(PackageFormatError, match="not the assigned"):
        guard.check("pump", running, ModelAssignment.model_validate(_assignment(version=7)),
                    _manifest("skab-wstat", 8))


@pytest.mark.parametrize(("change", "reason"), [
    ({"key": "package"}, "not a trusted rollback key"),
    ({"clock": lambda: NOW - 601}, "expired"),
    ({"clock": lambda: NOW + 3600}, "in the future"),
    ({"stream": "fan"}, "device/stream/name/from/to"),
    ({"stream": None}, "device/stream/name/from/to"),
    ({"device_id": "gw2"}, "device/stream/name/from/to"),
    ({"to_version": 2}, "device/stream/name/from/to"),
    ({"from_version": 5}, "device/stream/name/from/to"),
    ({"rollout_id": 2}, "for rollout 2, not this assignment's rollout 1"),
    ({"rollout_id": None}, "names no rollout_id: it was signed by a fleet older"),
], ids=["package-key", "expired", "future", "other-stream", "no-stream", "other-device",
        "other-version", "other-from", "other-rollout", "older-fleet"])
def test_rollback_role_expiry_and_binding(
    tmp_path: Path, roles: tuple[Path, Path, RollbackPolicy], change: dict[str, Any],
    reason: str,
) -> None:
    pkg_key, rb_key, policy = roles
    hw = HighWater(tmp_path / "hw.json")
    hw.ran("pump", "skab-wstat", 6)
    guard = PackageGuard(hw, policy, "gw1", 10**9, clock=lambda: NOW)
    key = pkg_key if change.pop("key", None) == "package" else rb_key
    a = ModelAssignment.model_validate(_assignment(version=1, rollback=_rollback(key, **change)))
    with pytest.raises(RollbackRefused, match=reason):
        guard.check("pump", ("skab-wstat", 6), a, _manifest("skab-wstat", 1))


def test_a_captured_rollback_is_refused_after_a_later_rollout(
    tmp_path: Path, roles: tuple[Path, Path, RollbackPolicy]
) -> None:
    """Rollout 1 signed skab-wstat 6 -> 1 and the stream applied it; rollout 2 then moved the
    stream to skab-other@2. The captured rollout-1 rollback, replayed within its hour, is
    refused, also after a restart (the rollback mark is in high_water.json); a rollback of
    rollout 2 is accepted."""
    _pkg, rb_key, policy = roles
    hw = HighWater(tmp_path / "hw.json")
    hw.ran("pump", "skab-wstat", 6)
    guard = PackageGuard(hw, policy, "gw1", 10**9, clock=lambda: NOW)
    captured = ModelAssignment.model_validate(_assignment(version=1, rollback=_rollback(rb_key)))
    guard.check("pump", ("skab-wstat", 6), captured, _manifest("skab-wstat", 1))  # valid now
    guard.installed("pump", captured)  # the rollback applied: its signed rollout 1 is the mark
    assert hw.rollback_mark("pump") == 1
    later = ModelAssignment.model_validate(_assignment(rollout_id=2, name="skab-other",
                                                       version=2))
    guard.check("pump", ("skab-wstat", 1), later, _manifest("skab-other", 2))
    guard.installed("pump", later)  # a later rollout
    for marks in (hw, HighWater(tmp_path / "hw.json")):  # in memory and after a restart
        guard = PackageGuard(marks, policy, "gw1", 10**9, clock=lambda: NOW)
        with pytest.raises(RollbackRefused, match="undoes rollout 1, but this stream has "
                           "already applied a signed rollback of rollout 1"):
            guard.check("pump", ("skab-other", 2), captured, _manifest("skab-wstat", 1))
        assert "RollbackRefused" in str(guard.before_download(captured, "pump",
                                                               ("skab-other", 2)))
        fresh = ModelAssignment.model_validate(
            _assignment(rollout_id=2, version=1, rollback=_rollback(rb_key, rollout_id=2)))
        guard.check("pump", ("skab-other", 2), fresh, _manifest("skab-wstat", 1))
    # the mark never goes down, and installs (whatever their rollout_id) never raise it
    hw.ran("pump", "skab-other", 3, installed_at=NOW)
    assert hw.rollback_mark("pump") == 1 and hw.marks("pump")["skab-other"] == 3


def test_an_unapplied_rollback_is_refused_once_the_stream_installed_after_it(
    tmp_path: Path, roles: tuple[Path, Path, RollbackPolicy]
) -> None:
    """The abort of rollout 1 (signed at NOW-5) never reached this device; rollout 2 installed
    skab-other@2 405 s later. Replayed within its age, the captured rollback is
    refused (issued before the last install); a fresh one for rollout 2 is accepted."""
    _pkg, rb_key, policy = roles
    hw = HighWater(tmp_path / "hw.json")
    hw.ran("pump", "skab-wstat", 6)
    hw.ran("pump", "skab-other", 2, installed_at=NOW + 400)
    guard = PackageGuard(hw, policy, "gw1", 10**9, clock=lambda: NOW + 500)
    captured = ModelAssignment.model_validate(_assignment(version=1, rollback=_rollback(rb_key)))
    with pytest.raises(RollbackRefused, match="issued 405 s before this stream last installed"):
        guard.check("pump", ("skab-other", 2), captured, _manifest("skab-wstat", 1))
    fresh = ModelAssignment.model_validate(_assignment(
        rollout_id=2, version=1, rollback=_rollback(rb_key, rollout_id=2,
                                                    clock=lambda: NOW + 490)))
    guard.check("pump", ("skab-other", 2), fresh, _manifest("skab-wstat", 1))
    # a fleet clock up to max_skew_s behind the device's still passes
    behind = ModelAssignment.model_validate(_assignment(
        rollout_id=2, version=1, rollback=_rollback(rb_key, rollout_id=2,
                                                    clock=lambda: NOW + 400 - 250)))
    guard.check("pump", ("skab-other", 2), behind, _manifest("skab-wstat", 1))


def test_an_unsigned_rollout_id_cannot_switch_rollbacks_off(
    tmp_path: Path, roles: tuple[Path, Path, RollbackPolicy]
) -> None:
    """The retest of issue 15: a hostile fleet served a genuine signed skab-wstat@12 with
    rollout_id 2**63-1; the operator's genuine abort of rollout 30 (12 -> 11) must still apply,
    also after a restart, and the install left no mark that blocks it."""
    _pkg, rb_key, policy = roles
    hw = HighWater(tmp_path / "hw.json")
    hw.ran("pump", "skab-wstat", 11)
    guard = PackageGuard(hw, policy, "gw1", 10**9, clock=lambda: NOW)
    hostile = ModelAssignment.model_validate(_assignment(rollout_id=2**63 - 1, version=12))
    guard.check("pump", ("skab-wstat", 11), hostile, _manifest("skab-wstat", 12))
    guard.installed("pump", hostile)
    assert hw.rollback_mark("pump") is None
    abort = ModelAssignment.model_validate(_assignment(
        rollout_id=30, version=11, rollback=_rollback(rb_key, rollout_id=30, from_version=12,
                                                      to_version=11, clock=lambda: NOW)))
    for marks in (hw, HighWater(tmp_path / "hw.json")):
        PackageGuard(marks, policy, "gw1", 10**9, clock=lambda: NOW).check(
            "pump", ("skab-wstat", 12), abort, _manifest("skab-wstat", 11))
    # a rollback in an assignment that did not need one (a newer version) is not verified:
    # it raises nothing either
    carried = ModelAssignment.model_validate(_assignment(
        rollout_id=31, version=13, rollback=_rollback(rb_key, rollout_id=2**63 - 1,
                                                      from_version=12, to_version=13)))
    guard.check("pump", ("skab-wstat", 12), carried, _manifest("skab-wstat", 13))
    guard.installed("pump", carried)
    assert hw.rollback_mark("pump") is None


def test_an_old_install_based_rollout_mark_is_ignored(
    tmp_path: Path, roles: tuple[Path, Path, RollbackPolicy]
) -> None:
    """A high_water.json whose "rollouts" mark a hostile fleet raised (earlier versions) does
    not block the operator's rollback after the upgrade."""
    _pkg, rb_key, policy = roles
    path = tmp_path / "hw.json"
    path.write_text(json.dumps({"format": 1, "streams": {"pump": {"skab-wstat": 12}},
                                "rollouts": {"pump": 2**63 - 1}}))
    guard = PackageGuard(HighWater(path), policy, "gw1", 10**9, clock=lambda: NOW)
    abort = ModelAssignment.model_validate(_assignment(
        rollout_id=30, version=11, rollback=_rollback(rb_key, rollout_id=30, from_version=12,
                                                      to_version=11)))
    guard.check("pump", ("skab-wstat", 12), abort, _manifest("skab-wstat", 11))


def test_no_rollback_keys_refuses_every_rollback(
    tmp_path: Path, roles: tuple[Path, Path, RollbackPolicy]
) -> None:
    _pkg, rb_key, _policy = roles
    guard = PackageGuard(HighWater(tmp_path / "hw.json"), None, "gw1", 10**9, lambda: NOW)
    a = ModelAssignment.model_validate(_assignment(version=1, rollback=_rollback(rb_key)))
    with pytest.raises(RollbackRefused, match="no rollback keys are configured"):
        guard.check("pump", ("skab-wstat", 6), a, _manifest("skab-wstat", 1))


def test_a_key_in_both_trust_sets_is_refused(tmp_path: Path) -> None:
    _priv, pub = generate_keypair(tmp_path / "pkg", "ops")
    (tmp_path / "rb").mkdir()
    (tmp_path / "rb" / "renamed.pub").write_bytes(pub.read_bytes())  # same key, other id
    with pytest.raises(ConfigError, match="also the package-signing key"):
        load_rollback_policy(str(tmp_path / "rb"), 600.0, load_public_keys(tmp_path / "pkg"))
    generate_keypair(tmp_path / "rb2", "fleet-rb")
    policy = load_rollback_policy(str(tmp_path / "rb2"), 600.0,
                                  load_public_keys(tmp_path / "pkg"))
    assert policy is not None and set(policy.keys) == {"fleet-rb"}
    assert load_rollback_policy(None, 600.0, {}) is None


def test_updater_config_of_the_guard(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="separate trust sets"):
        UpdaterConfig(trusted_keys_dir="k", rollback_keys_dir="k")
    with pytest.raises(ValidationError):
        UpdaterConfig(max_archive_bytes=2**40)
    base = '[[streams]]\nname = "a"\n[streams.source]\nkind = "simulator"\n'
    cfg = parse_config(base + '[updater]\ntrusted_keys_dir = "k"\nrollback_keys_dir = "rb"\n',
                       env={}).resolved(tmp_path)
    assert cfg.updater.rollback_keys_dir == str(tmp_path / "rb")
    assert cfg.updater.trusted_keys_dir == str(tmp_path / "k")
    assert cfg.updater.max_archive_bytes == 256 * 1024 * 1024


def test_high_water_write_failure_keeps_the_mark_in_memory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    hw = HighWater(tmp_path / "hw.json")
    (tmp_path / ".hw.json.tmp").mkdir()  # the temporary file cannot be created
    hw.ran("pump", "skab-wstat", 6)
    assert hw.marks("pump") == {"skab-wstat": 6}
    assert "kept in memory only" in caplog.text


def test_an_installed_package_with_an_unnamed_file_is_not_loaded(tmp_path: Path) -> None:
    """E.g. installed by an older agent that unpacked every archive member."""
    priv, pub = generate_keypair(tmp_path / "keys")
    store = ModelStore(tmp_path / "models")
    installed = store.package_dir("skab-wstat", 3)
    make_package(tmp_path, 3, priv).rename(installed)
    store.set_active("pump", Installed("skab-wstat", 3, str(installed)), None)
    assert store.load_active("pump", load_public_keys([pub])) is not None
    (installed / "payload.bin").write_bytes(b"\x7fELF")
    assert store.load_active("pump", load_public_keys([pub])) is None
