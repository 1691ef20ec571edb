"""A univariate stream's adapted baseline kept across restarts: JSON, bounds, the store row, the
restore decision (resumed, discarded, refused) and the save cadence.

The pipelines are the agent's own (:class:`UnivariatePipeline`, the NumPy model of the window
features); the store is a real SQLite file. Hostile rows are written with a second connection.
"""

from __future__ import annotations

import logging
import sqlite3
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from agent.app import Agent
from agent.config.loader import parse_config
from agent.inference.package import ModelPackage, load_package
from agent.metrics import Metrics
from agent.pipeline.baseline_restore import (
    StoredBaseline,
    baseline_from_json,
    baseline_to_json,
    calibration_sha256,
    stale,
)
from agent.pipeline.restore import (
    CalibrationKey,
    calibration_from_json,
    calibration_key,
    calibration_to_json,
)
from agent.pipeline.robust import RobustParams, RobustState, resume_state
from agent.pipeline.univariate import UnivariatePipeline
from agent.pipeline.univariate_detector import UnivariateDetector
from agent.services.baselines import BaselineSaver, restore_baseline
from agent.store.sqlite import Store
from agent.systemd import Notifier
from tests.unit.test_univariate_robust import PARAMS, RULE, make_pipe

PACKAGE: ModelPackage = load_package(Path(__file__).resolve().parents[2] / "models"
                                     / "univariate-wstat")
NOW = 1_800_000_000.0


def series(n: int, shift_at: int = 600, shift: float = 4.0, seed: int = 0) -> np.ndarray:
    """``(n, 1)`` unit Gaussian noise whose level steps by ``shift`` at ``shift_at``."""
    x = np.random.default_rng(seed).normal(size=(n, 1))
    x[shift_at:] += shift
    return x


def key_of(pipe: UnivariatePipeline, package: ModelPackage = PACKAGE) -> CalibrationKey:
    return calibration_key(package.manifest, pipe.detector.spec, pipe.detector.backend.precision)


def adapted(n: int = 1500) -> UnivariatePipeline:
    """A pipeline that calibrated on 400 readings and followed a 4-sigma shift."""
    pipe = make_pipe()
    pipe.process_block(series(n), np.arange(float(n)))
    assert pipe.robust_state is not None and pipe.robust_state.centre[0] > 2.0
    return pipe


def restarted(pipe: UnivariatePipeline) -> UnivariatePipeline:
    """A new pipeline with ``pipe``'s calibration after a JSON round trip (as the agent
    restores it after a restart)."""
    assert pipe.calibration is not None
    cal = calibration_from_json(calibration_to_json(pipe.calibration))
    det = UnivariateDetector(pipe.spec, pipe.detector.backend, PARAMS)
    return UnivariatePipeline("s", "dev", pipe.spec, det, RULE, PARAMS, calibration=cal)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "agent.db", lambda: NOW)


def saved(store: Store, pipe: UnivariatePipeline) -> None:
    assert BaselineSaver(store, lambda: NOW).save(pipe, PACKAGE)


# -- pure parts -----------------------------------------------------------------------------------


def test_json_round_trip_is_exact() -> None:
    c, s = np.random.default_rng(1).normal(size=3), np.random.default_rng(2).uniform(0.1, 1, 3)
    back = baseline_from_json(baseline_to_json(c, s))
    assert back == (c.tolist(), s.tolist())


@pytest.mark.parametrize("text", [
    "not json", "[]", "null", '{"format": 2, "centre": [0], "scale": [1]}',
    '{"format": 1, "centre": ["a"], "scale": [1]}', '{"format": 1, "centre": [true], "scale": [1]}',
    '{"format": 1, "centre": [[0]], "scale": [1]}', '{"format": 1, "centre": [0]}',
    '{"format": 1, "centre": [1' + "0" * 400 + '], "scale": [1]}', "[" * 100_000,
])
def test_json_that_is_not_a_baseline_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        baseline_from_json(text)


def test_json_refuses_to_write_a_value_that_is_not_finite() -> None:
    with pytest.raises(ValueError):
        baseline_to_json(np.array([np.nan]), np.ones(1))


START = RobustState.start(np.array([0.5, 0.3, 0.2]), np.array([0.6, 0.1, 0.1]))


@pytest.mark.parametrize(("centre", "scale", "why"), [
    ([0.5, 0.3], [0.6, 0.1, 0.1], "shape"),
    ([[0.5], [0.3], [0.2]], [0.6, 0.1, 0.1], "shape"),
    ([np.nan, 0.3, 0.2], [0.6, 0.1, 0.1], "not finite"),
    ([0.5, 0.3, 0.2], [np.inf, 0.1, 0.1], "not finite"),
    ([0.5, 0.3, 0.2], [0.6, 0.0, 0.1], "not positive"),
    ([0.5, 0.3, 0.2], [-0.6, 0.1, 0.1], "not positive"),
    ([0.5 + 6.01, 0.3, 0.2], [0.6, 0.1, 0.1], "centre beyond its bound"),  # drift bound 6
    ([0.5, 0.3 * 4.1, 0.2], [0.6, 0.1, 0.1], "centre beyond its bound"),  # factor 4
    ([0.5, 0.3, 0.2], [0.6 / 4.1, 0.1, 0.1], "scale beyond its bound"),
])
def test_resume_refuses_a_state_the_baseline_cannot_reach(centre: list[float],
                                                          scale: list[float], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        resume_state(START, np.array(centre), np.array(scale), RobustParams())


def test_resume_takes_a_state_at_its_bounds_and_keeps_the_start() -> None:
    c, s = np.array([6.5, 1.2, 0.05]), np.array([2.4, 0.025, 0.4])
    state = resume_state(START, c, s, RobustParams())
    np.testing.assert_array_equal(state.centre, c)
    assert state.centre0 is START.centre0 and state.bounded
    flat = RobustState.start(np.array([3.0, 0.0, 0.0]), np.ones(3), bounded=False)
    assert resume_state(flat, np.array([500.0, 9.0, 9.0]), np.full(3, 50.0),
                        RobustParams()).centre[0] == 500.0  # a flat calibration: no upper bound


def test_stale_names_the_package_settings_or_calibration() -> None:
    pipe = adapted()
    cal = pipe.calibration
    assert cal is not None
    key = key_of(pipe)
    rec = StoredBaseline("s", key, calibration_sha256(cal), np.zeros(3), np.ones(3), NOW)
    assert stale(rec, key, cal) is None
    assert stale(rec, key, calibration_from_json(calibration_to_json(cal))) is None
    v = PACKAGE.manifest.version
    newer = replace(PACKAGE, manifest=PACKAGE.manifest.model_copy(update={"version": v + 1}))
    assert stale(rec, key_of(pipe, newer), cal) == (
        f"model changed (univariate-wstat@{v} → univariate-wstat@{v + 1})")
    edited = replace(PACKAGE, manifest=PACKAGE.manifest.model_copy(update={"description": "x"}))
    assert stale(rec, key_of(pipe, edited), cal) == (
        f"model package changed (univariate-wstat@{v} with other contents)")
    assert stale(rec, key, replace(cal, threshold=7.0)) == "the calibration changed"
    assert stale(rec, key, None) == "the stream calibrates afresh"


# -- store and restore ----------------------------------------------------------------------------


def test_a_resumed_baseline_continues_exactly(store: Store) -> None:
    """Scores after a restart equal those of a run that never stopped (its window restarted
    at the same reading); without the stored row the restart scores the old shift again."""
    x, ts = series(3000), np.arange(3000.0)
    a = make_pipe()
    a.process_block(x[:1500], ts[:1500])
    saved(store, a)
    b, fresh = restarted(a), restarted(a)
    assert restore_baseline(store, b, key_of(b))
    a.restart_window()
    out_a = a.process_block(x[1500:], ts[1500:])
    out_b = b.process_block(x[1500:], ts[1500:])
    np.testing.assert_array_equal(out_a.scores, out_b.scores)
    assert a.robust_state is not None and b.robust_state is not None
    np.testing.assert_array_equal(a.robust_state.centre, b.robust_state.centre)
    np.testing.assert_array_equal(a.robust_state.scale, b.robust_state.scale)
    assert out_b.alerts == []
    assert fresh.process_block(x[1500:], ts[1500:]).alerts  # the calibration's baseline


def test_store_round_trip_and_forget(store: Store) -> None:
    pipe = adapted()
    saved(store, pipe)
    rec = store.baseline("s")
    assert rec is not None and rec.key == key_of(pipe) and rec.saved_at == NOW
    assert pipe.robust_state is not None
    np.testing.assert_array_equal(rec.centre, pipe.robust_state.centre)
    np.testing.assert_array_equal(rec.scale, pipe.robust_state.scale)
    store.forget_baseline("s")
    assert store.baseline("s") is None


def _level(pipe: UnivariatePipeline, delta: float) -> str:
    start = pipe.baseline_start()
    assert start is not None
    return (f'{{"format":1,"centre":[{float(start.centre0[0]) + delta!r},0.5,0.5],'
            f'"scale":[1.0,0.5,0.5]}}')


HOSTILE = [
    ("baseline", '{"format":1,"centre":[0.0,0.5],"scale":[1.0,0.5,0.5]}', "shape"),
    ("baseline", '{"format":1,"centre":[NaN,0.5,0.5],"scale":[1.0,0.5,0.5]}', "not finite"),
    ("baseline", '{"format":1,"centre":[1e999,0.5,0.5],"scale":[1.0,0.5,0.5]}', "not finite"),
    ("baseline", '{"format":1,"centre":[0.0,0.5,0.5],"scale":[-Infinity,0.5,0.5]}', "not finite"),
    ("baseline", '{"format":1,"centre":["0",0.5,0.5],"scale":[1.0,0.5,0.5]}', "numbers"),
    ("baseline", '{"format":1,"centre":{"a":1},"scale":[1.0,0.5,0.5]}', "numbers"),
    ("baseline", "garbage", "not JSON"),
    ("baseline", b"\x00\xff", "not text"),
    ("baseline", 42, "not a JSON object"),  # the TEXT column makes it '42'
    ("baseline", 4.5, "not a JSON object"),
    ("baseline", "drift", "centre beyond its bound"),
    ("model_version", "three", "wrong type"),
    ("saved_at", "yesterday", "wrong type"),
    ("spec", "{", "not JSON"),
    ("spec_sha256", "0" * 64, "do not match"),
]


@pytest.mark.parametrize(("column", "value", "why"), HOSTILE)
def test_a_hostile_row_is_refused_with_one_warning(
    store: Store, tmp_path: Path, caplog: pytest.LogCaptureFixture, column: str,
    value: object, why: str,
) -> None:
    pipe = adapted()
    saved(store, pipe)
    if value == "drift":  # one calibration sigma beyond the level's drift bound
        value = _level(pipe, PARAMS.drift_bound + 1.0)
    with sqlite3.connect(tmp_path / "agent.db") as conn:
        conn.execute(f"UPDATE baselines SET {column} = ?", (value,))
    b = restarted(pipe)
    caplog.set_level(logging.INFO, logger="agent")
    assert not restore_baseline(store, b, key_of(b))
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "stored baseline refused" in warnings[0].getMessage()
    assert why in warnings[0].getMessage()
    assert b.robust_state is None and store.baseline("s") is None  # deleted: warned once
    n = 200
    out = b.process_block(np.full((n, 1), 4.0), 2000.0 + np.arange(float(n)))
    assert out.alerts  # the calibration's baseline: the followed shift alerts again


def test_a_baseline_just_within_its_drift_bound_is_resumed(store: Store,
                                                           tmp_path: Path) -> None:
    pipe = adapted()
    saved(store, pipe)
    with sqlite3.connect(tmp_path / "agent.db") as conn:
        conn.execute("UPDATE baselines SET baseline = ?", (_level(pipe, PARAMS.drift_bound),))
    b = restarted(pipe)
    assert restore_baseline(store, b, key_of(b))


@pytest.mark.parametrize("case", ["version", "calibration", "calibrating"])
def test_a_stale_baseline_is_discarded_with_one_info_line(
    store: Store, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    pipe = adapted()
    saved(store, pipe)
    b = restarted(pipe)
    key = key_of(b)
    if case == "version":
        v = PACKAGE.manifest.version
        key = key_of(b, replace(PACKAGE, manifest=PACKAGE.manifest.model_copy(
            update={"version": v + 1})))
    elif case == "calibration":
        assert b.calibration is not None
        b.calibration = replace(b.calibration, threshold=7.0)
    else:
        b = make_pipe()
    caplog.set_level(logging.INFO, logger="agent")
    assert not restore_baseline(store, b, key)
    lines = [r for r in caplog.records if "baseline" in r.getMessage()]
    assert [r.levelno for r in lines] == [logging.INFO]
    assert "stored baseline discarded (" in lines[0].getMessage()
    assert b.robust_state is None and store.baseline("s") is None


# -- saving ---------------------------------------------------------------------------------------


def test_saves_at_most_every_interval_and_only_when_moved(store: Store) -> None:
    mono, wall = [0.0], [NOW]
    saver = BaselineSaver(store, lambda: wall[0], lambda: mono[0], interval_s=60.0)
    pipe, x = make_pipe(), series(2000)
    saver.after_block(pipe, PACKAGE)  # calibrating: nothing to save
    assert store.baseline("s") is None
    times = []
    for i, a in enumerate(range(0, 2000, 100)):
        mono[0], wall[0] = 10.0 * i, NOW + 10.0 * i
        pipe.process_block(x[a:a + 100], np.arange(a, a + 100.0))
        saver.after_block(pipe, PACKAGE)
        rec = store.baseline("s")
        times.append(None if rec is None else rec.saved_at - NOW)
    # calibrated in the 4th block (i = 3), scored from the 5th (t = 40 s): saved then, then
    # every 60 s
    assert times[:5] == [None, None, None, None, 40.0]
    assert sorted({t for t in times if t is not None}) == [40.0, 100.0, 160.0]
    mono[0] += 1.0
    wall[0] += 1.0
    assert saver.save(pipe, PACKAGE)  # moved since: written when asked (shutdown)
    assert not saver.save(pipe, PACKAGE)  # unchanged since the last save: not written again
    wall[0] += 1.0
    saver.save_all([(pipe, PACKAGE)])
    rec = store.baseline("s")
    assert rec is not None and rec.saved_at == NOW + 191.0


def test_a_failed_save_is_one_warning(store: Store, caplog: pytest.LogCaptureFixture) -> None:
    pipe = adapted()
    saver = BaselineSaver(store, lambda: NOW)
    store.close()
    assert not saver.save(pipe, PACKAGE)
    pipe.process_block(series(50, shift_at=0), 2000.0 + np.arange(50.0))
    assert not saver.save(pipe, PACKAGE)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "adapted baseline not stored" in warnings[0].getMessage()


# -- the agent ------------------------------------------------------------------------------------


def _agent(tmp_path: Path, values: np.ndarray, start: int, extra: str = "") -> Agent:
    csv = tmp_path / f"plant{start}.csv"
    rows = ["timestamp,value"] + [f"{1_700_000_000 + start + i},{v!r}"
                                  for i, v in enumerate(values.ravel().tolist())]
    csv.write_text("\n".join(rows) + "\n", encoding="utf-8")
    text = "\n".join([
        "[agent]", 'device_id = "gw1"', f'state_dir = "{tmp_path / "state"}"',
        "console_alerts = false",
        "[[streams]]", 'name = "temp"', 'model = "builtin:univariate-wstat"',
        'backend = "onnxruntime"', extra,
        "[streams.source]", 'kind = "replay"', f'path = "{csv}"', 'time_column = "timestamp"',
        "speed = 0", "[mqtt]", "enabled = false",
    ]) + "\n"
    return Agent(parse_config(text, env={}), Metrics(), console=None, notifier=Notifier(""))


def test_the_agent_saves_at_shutdown_resumes_and_discards_on_recalibration(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent")
    x = 20.0 + 0.5 * series(3000, shift_at=600, shift=6.0, seed=5)
    first = _agent(tmp_path, x, 0)
    assert first.run() == 0 and first.alerts_raised >= 1
    state = first.streams["temp"].pipeline
    assert isinstance(state, UnivariatePipeline) and state.robust_state is not None
    centre = state.robust_state.centre

    second = _agent(tmp_path, x[-600:], 3000)
    pipe = second.streams["temp"].pipeline
    assert isinstance(pipe, UnivariatePipeline) and pipe.robust_state is not None
    np.testing.assert_array_equal(pipe.robust_state.centre, centre)  # the shutdown's save
    assert second.run() == 0 and second.alerts_raised == 0
    assert "stream temp: adapted baseline restored (saved " in caplog.text

    caplog.clear()
    third = _agent(tmp_path, x[-600:], 3600, "recalibrate_on_start = true")
    try:
        pipe = third.streams["temp"].pipeline
        assert isinstance(pipe, UnivariatePipeline) and pipe.robust_state is None
        lines = [r.getMessage() for r in caplog.records if "baseline" in r.getMessage()]
        assert lines == ["stream temp: stored baseline discarded (the stream calibrates "
                         "afresh); starting from the calibration's baseline"]
    finally:
        third.shutdown()
