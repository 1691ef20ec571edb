"""A stream's calibration kept across restarts: key, JSON, store round trip, restore decisions.

The agent-level tests build the real :class:`~agent.app.Agent` twice on one state directory with
a finite simulator stream (speed 0) and read its metrics and logs.
"""

from __future__ import annotations

import dataclasses
import logging
import sqlite3
import time
from pathlib import Path

import numpy as np
import pytest

from agent.app import Agent
from agent.config.loader import parse_config
from agent.errors import StoreError
from agent.inference.package import load_package
from agent.metrics import Metrics
from agent.pipeline.detector import Calibration
from agent.pipeline.restore import (
    StoredCalibration,
    calibration_from_json,
    calibration_key,
    calibration_to_json,
    refusal,
)
from agent.store.schema import MIGRATIONS, migrate
from agent.store.sqlite import Store
from agent.systemd import Notifier
from cloud_sync.calibration import FeatureStats, Scaler

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "skab-wstat"
DAY = 86400.0
NOW = 1_800_000_000.0


def _calibration(c: int = 8, seed: int = 0) -> Calibration:
    rng = np.random.default_rng(seed)
    return Calibration(
        Scaler(rng.normal(size=c), rng.uniform(0.5, 2.0, c)),
        FeatureStats(rng.normal(size=3 * c), rng.uniform(0.1, 1.0, 3 * c)),
        5.4321,
        rng.uniform(0, 5, 391),
    )


def _stored(stream: str = "pump", **spec: int) -> StoredCalibration:
    package = load_package(SHIPPED)
    key = calibration_key(package.manifest, package.detector_spec(**spec), "int8")
    readings = np.random.default_rng(1).normal(size=(key.spec["calibration_samples"], 8))
    return StoredCalibration(stream, key, _calibration(), NOW, len(readings), readings)


def _assert_same(a: StoredCalibration, b: StoredCalibration) -> None:
    assert (a.stream, a.key, a.fitted_at, a.samples) == (b.stream, b.key, b.fitted_at, b.samples)
    for x, y in ((a.calibration.scaler.mean, b.calibration.scaler.mean),
                 (a.calibration.scaler.scale, b.calibration.scaler.scale),
                 (a.calibration.features.mean, b.calibration.features.mean),
                 (a.calibration.features.std, b.calibration.features.std),
                 (a.calibration.scores, b.calibration.scores)):
        np.testing.assert_array_equal(x, y)  # bit-exact: JSON round-trips float64
    assert a.calibration.threshold == b.calibration.threshold
    assert (a.readings is None) == (b.readings is None)
    if a.readings is not None and b.readings is not None:
        np.testing.assert_array_equal(a.readings, b.readings)


# -- JSON and store -------------------------------------------------------------------------------


def test_calibration_json_round_trip_is_exact() -> None:
    cal = _calibration()
    back = calibration_from_json(calibration_to_json(cal))
    np.testing.assert_array_equal(back.scaler.scale, cal.scaler.scale)
    np.testing.assert_array_equal(back.features.std, cal.features.std)
    np.testing.assert_array_equal(back.scores, cal.scores)
    assert back.threshold == cal.threshold


@pytest.mark.parametrize("text", [
    "not json", "{}", '{"format": 2}',
    calibration_to_json(_calibration()).replace('"threshold":5.4321', '"threshold":-1'),
])
def test_bad_calibration_json_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="calibration"):
        calibration_from_json(text)


def test_store_round_trip_and_replace(tmp_path: Path) -> None:
    rec = _stored()
    with Store(tmp_path / "a.db") as store:
        assert store.calibration("pump") is None
        store.save_calibration(rec)
    with Store(tmp_path / "a.db") as store:  # survives closing the file
        got = store.calibration("pump")
        assert got is not None
        _assert_same(got, rec)
        newer = dataclasses.replace(rec, fitted_at=NOW + 5, readings=None)
        store.save_calibration(newer)
        got = store.calibration("pump")
        assert got is not None
        _assert_same(got, newer)
        assert store.calibration("other") is None


def test_corrupt_row_is_a_store_error(tmp_path: Path) -> None:
    with Store(tmp_path / "a.db") as store:
        store.save_calibration(_stored())
    conn = sqlite3.connect(tmp_path / "a.db")
    conn.execute("UPDATE calibrations SET readings = x'00'")
    conn.commit()
    conn.close()
    with Store(tmp_path / "a.db") as store, pytest.raises(StoreError, match="readings"):
        store.calibration("pump")


def test_migration_from_version_2_adds_the_table(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "old.db", isolation_level=None)
    migrate(conn, MIGRATIONS[:2])
    conn.close()
    with Store(tmp_path / "old.db") as store:
        store.save_calibration(_stored())
        assert store.calibration("pump") is not None


# -- restore decisions ----------------------------------------------------------------------------


def test_same_key_within_max_age_is_restored() -> None:
    rec = _stored()
    assert refusal(rec, rec.key, NOW + 29 * DAY, 30 * DAY) is None
    assert refusal(rec, rec.key, NOW + 1000 * DAY, None) is None
    assert refusal(rec, rec.key, NOW + 1000 * DAY, float("inf")) is None


def test_expired_calibration_is_not_restored() -> None:
    rec = _stored()
    why = refusal(rec, rec.key, NOW + 31 * DAY, 30 * DAY)
    assert why == "calibration expired (fitted 31.0 d ago, streams.calibration_max_age_s = 30.0 d)"


def test_calibration_from_the_future_is_not_restored_with_a_max_age() -> None:
    rec = _stored()
    why = refusal(rec, rec.key, NOW - 2 * DAY, 30 * DAY)
    assert why is not None and "future" in why


def test_changed_spec_names_what_changed() -> None:
    rec = _stored()
    other = _stored(calibration_samples=300, threshold_quantile=0.99).key
    why = refusal(rec, other, NOW, None)
    assert why is not None
    assert "calibration_samples changed (400 → 300)" in why
    assert "threshold_quantile changed (1.0 → 0.99)" in why


def test_hop_does_not_change_the_key() -> None:
    assert _stored(hop=4).key == _stored().key


def test_other_precision_is_not_restored() -> None:
    rec = _stored()
    package = load_package(SHIPPED)
    fp32 = calibration_key(package.manifest, package.detector_spec(), "fp32")
    assert refusal(rec, fp32, NOW, None) == "precision changed (int8 → fp32)"


def test_other_model_version_or_contents_is_not_restored() -> None:
    rec = _stored()
    m = load_package(SHIPPED).manifest
    spec = load_package(SHIPPED).detector_spec()
    v = m.version
    newer = calibration_key(m.model_copy(update={"version": v + 1}), spec, "int8")
    assert refusal(rec, newer, NOW, None) == f"model changed (skab-wstat@{v} → skab-wstat@{v + 1})"
    edited = calibration_key(m.model_copy(update={"description": "rebuilt"}), spec, "int8")
    why = refusal(rec, edited, NOW, None)
    assert why == f"model package changed (skab-wstat@{v} with other contents)"


# -- the agent ------------------------------------------------------------------------------------


READINGS = 500
WINDOW = load_package(SHIPPED).manifest.input.window  # the simulator stream's default model


def _agent(tmp_path: Path, extra: str = "", clock: float | None = None) -> Agent:
    text = "\n".join([
        "[agent]", 'device_id = "gw1"', f'state_dir = "{tmp_path / "state"}"',
        "console_alerts = false",
        "[[streams]]", 'name = "demo"', 'backend = "onnxruntime"', extra,
        "[streams.source]", 'kind = "simulator"', "speed = 0", f"duration_s = {READINGS}",
        "[mqtt]", "enabled = false",
    ]) + "\n"
    return Agent(parse_config(text, env={}), Metrics(), console=None, notifier=Notifier(""),
                 clock=time.time if clock is None else lambda: clock)


def _value(agent: Agent, name: str) -> float | None:
    return agent.metrics.registry.get_sample_value(name, {"stream": "demo"})


def test_agent_restores_and_scores_from_the_first_window(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent")
    first = _agent(tmp_path)
    assert _value(first, "edge_agent_calibrating") == 1
    first.run()
    assert _value(first, "edge_agent_windows_total") == READINGS - 400
    threshold = first.streams["demo"].pipeline.threshold
    samples = first.streams["demo"].pipeline.calibration_samples
    assert samples is not None

    second = _agent(tmp_path)
    pipeline = second.streams["demo"].pipeline
    assert _value(second, "edge_agent_calibrating") == 0  # before the first reading
    assert _value(second, "edge_agent_threshold") == threshold
    assert not pipeline.calibrating and pipeline.threshold == threshold
    assert pipeline.calibration_samples is not None  # a model update can calibrate on them
    np.testing.assert_array_equal(pipeline.calibration_samples, samples)
    assert "stream demo: calibration restored (fitted " in caplog.text
    assert f"threshold {threshold:.3f})" in caplog.text
    second.run()
    assert _value(second, "edge_agent_windows_total") == READINGS - WINDOW + 1


@pytest.mark.parametrize(("extra", "clock", "why"), [
    ("calibration_samples = 300", None, "calibration_samples changed (400 → 300)"),
    ("recalibrate_on_start = true", None, "streams.recalibrate_on_start is set"),
    ("calibration_max_age_s = 3600", 4e9, "calibration expired"),
])
def test_agent_recalibrates_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, extra: str, clock: float | None, why: str
) -> None:
    _agent(tmp_path).run()
    caplog.clear()
    caplog.set_level(logging.INFO, logger="agent")
    again = _agent(tmp_path, extra, clock)
    try:
        assert again.streams["demo"].pipeline.calibrating
        assert _value(again, "edge_agent_calibrating") == 1
        lines = [r.getMessage() for r in caplog.records if "not restored" in r.getMessage()]
        assert len(lines) == 1 and why in lines[0], caplog.text
    finally:
        again.shutdown()
