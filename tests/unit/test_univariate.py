"""Univariate streams: gaps and irregular timestamps, bounded drift adaptation, explanations,
channel mapping (agent/pipeline/univariate.py, records, protocol)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from agent.errors import ConfigError
from agent.pipeline.detector import DetectorSpec
from agent.pipeline.rules import RuleParams
from agent.pipeline.stream import AlertEvent
from agent.pipeline.univariate import UnivariatePipeline, univariate_channel
from agent.pipeline.univariate_detector import (
    UnivariateDetector,
    UnivariateParams,
    build_detector,
    univariate_floor,
)
from agent.records import Alert, Explanation, TopChannel
from cloud_sync.protocol import AlertBody
from tests.unit.test_detector import NumpyBackend

W = 10


def make_spec(factor: float = 2.0, calibration: int = 400) -> DetectorSpec:
    return DetectorSpec(("value",), W, 1, calibration, np.array([1e-9]), 3, 2,
                        np.array([0.15, 0.03, 0.045]), 1.0, factor, 0.25)


def make_pipe(params: UnivariateParams, calibration: int = 400,
              label: str | None = None) -> UnivariatePipeline:
    spec = make_spec(calibration=calibration)
    return UnivariatePipeline("s", "dev", spec, UnivariateDetector(spec, NumpyBackend(), params),
                              RuleParams(), params, channel_label=label)


def run(x: np.ndarray, params: UnivariateParams, block: int = 50
        ) -> tuple[list[AlertEvent], UnivariatePipeline]:
    pipe = make_pipe(params)
    ts = np.arange(x.shape[0], dtype=np.float64)
    alerts: list[AlertEvent] = []
    for a in range(0, x.shape[0], block):
        alerts += pipe.process_block(x[a : a + block, None], ts[a : a + block]).alerts
    return alerts, pipe


def ramp(amplitude: float, n: int = 20000, start: int = 1000, seed: int = 1) -> np.ndarray:
    """Unit white noise plus a linear ramp of ``amplitude`` sigmas from ``start`` to the end."""
    noise = np.random.default_rng(seed).normal(size=n)
    return noise + np.concatenate([np.zeros(start), np.linspace(0, amplitude, n - start)])


# -- gaps and irregular timestamps -----------------------------------------------------------


def test_a_gap_restarts_the_window_and_no_window_bridges_it() -> None:
    pipe = make_pipe(UnivariateParams(gap_factor=5.0), calibration=100)
    rng = np.random.default_rng(0)
    ts = np.concatenate([np.arange(300.0), 1000.0 + np.arange(100.0)])  # a 700 s gap at 300
    out = pipe.process_block(rng.normal(size=(400, 1)), ts)
    assert pipe.gaps == 1
    scored = out.end_index[~np.isnan(out.scores)]
    after = scored[scored >= 300]
    # the first window after the gap ends W samples into it: none holds samples of both sides
    assert after.min() == 300 + W - 1
    assert not np.isin(np.arange(300, 300 + W - 1), scored).any()


def test_irregular_intervals_are_not_gaps() -> None:
    pipe = make_pipe(UnivariateParams(gap_factor=5.0), calibration=100)
    rng = np.random.default_rng(1)
    ts = np.cumsum(rng.uniform(0.3, 2.5, size=500))  # jitter up to 8x, never 5x the median
    out = pipe.process_block(rng.normal(size=(500, 1)), ts)
    assert pipe.gaps == 0
    assert np.count_nonzero(~np.isnan(out.scores)) == 400  # every window after calibration


def test_a_gap_during_calibration_does_not_shorten_it() -> None:
    pipe = make_pipe(UnivariateParams(), calibration=100)
    rng = np.random.default_rng(2)
    ts = np.concatenate([np.arange(50.0), 500.0 + np.arange(150.0)])
    out = pipe.process_block(rng.normal(size=(200, 1)), ts)
    assert pipe.gaps == 1 and out.calibrated is not None
    assert out.end_index[~np.isnan(out.scores)].min() == 100  # row 100: first after the 100


def test_non_finite_values_and_backward_timestamps_are_rejected_and_skipped() -> None:
    pipe = make_pipe(UnivariateParams(), calibration=50)
    rng = np.random.default_rng(3)
    x = rng.normal(size=(120, 1))
    ts = np.arange(120.0)
    x[70, 0] = np.nan
    ts[80] = 10.0  # before the previous reading
    out = pipe.process_block(x, ts)
    assert pipe.rejected == 2
    assert not np.isin([70, 80], out.end_index).any()
    assert np.isin([69, 71, 79, 81], out.end_index).all()


# -- bounded drift adaptation ----------------------------------------------------------------


def test_pure_noise_raises_nothing() -> None:
    assert run(ramp(0.0), UnivariateParams())[0] == []


def test_a_slow_benign_drift_within_the_bound_is_followed_not_alarmed() -> None:
    drift = ramp(2.0)  # 2 sigmas over 19,000 samples; bound 3 sigmas
    assert run(drift, UnivariateParams(adapt_rate=0.0))[0], "without adaptation it alarms"
    alerts, pipe = run(drift, UnivariateParams(adapt_rate=0.01, drift_bound=3.0))
    assert alerts == []
    assert pipe.baseline == pytest.approx(2.0, abs=0.3)


def test_a_slow_ramp_fault_beyond_the_bound_is_still_alarmed() -> None:
    fault = ramp(12.0)
    alerts, pipe = run(fault, UnivariateParams(adapt_rate=0.01, drift_bound=3.0))
    assert alerts
    assert pipe.origin is not None
    mu0, sigma = float(pipe.origin.scaler.mean[0]), float(pipe.origin.scaler.scale[0])
    assert abs(pipe.baseline - mu0) <= 3.0 * sigma + 1e-9
    # an unbounded adaptation learns the same fault away: the bound is what keeps the alarm
    assert run(fault, UnivariateParams(adapt_rate=0.01, drift_bound=1e9))[0] == []


def test_windows_near_the_threshold_do_not_move_the_baseline() -> None:
    pipe = make_pipe(UnivariateParams(adapt_rate=0.5, adapt_below=0.5), calibration=100)
    rng = np.random.default_rng(4)
    pipe.process_block(rng.normal(size=(100, 1)), np.arange(100.0))
    before = pipe.baseline
    pipe.process_block(np.full((30, 1), 50.0), 100.0 + np.arange(30.0))  # far above threshold
    assert pipe.baseline == before


def test_flat_calibration_floor_is_the_sensor_quantum() -> None:
    x = np.full(400, 20.0)
    x[::50] = 20.1
    assert univariate_floor(x, 1e-9, 1e-3) == pytest.approx(0.1)
    assert univariate_floor(np.full(400, 20.0), 1e-9, 1e-3) == pytest.approx(0.02)
    pipe = make_pipe(UnivariateParams(), calibration=400)
    rng = np.random.default_rng(5)
    flat = 20.0 + 0.1 * (rng.uniform(size=(2000, 1)) < 0.02)
    out = pipe.process_block(flat, np.arange(2000.0))
    assert out.calibrated is not None and out.calibrated.scaler.scale[0] >= 0.1 - 1e-12


# -- explanation -----------------------------------------------------------------------------


def test_alert_explains_expected_value_and_deviation() -> None:
    x = np.random.default_rng(6).normal(loc=20.0, scale=0.5, size=(1000, 1))
    x[700:] += 4.0  # +8 sigmas
    pipe = make_pipe(UnivariateParams(), label="bearing_temp")
    alerts = pipe.process_block(x, np.arange(1000.0)).alerts
    assert len(alerts) == 1
    ex = alerts[0].explanation
    assert ex is not None
    end = int(alerts[0].window_end)  # timestamps are row numbers
    assert 700 <= end < 720
    assert ex.expected == pytest.approx(20.0, abs=0.15)
    assert ex.observed == pytest.approx(float(x[end - W + 1 : end + 1, 0].mean()), abs=1e-4)
    assert ex.deviation == pytest.approx(ex.observed - ex.expected)
    assert pipe.calibration is not None
    assert ex.deviation_sigma == pytest.approx(ex.deviation / pipe.calibration.scaler.scale[0])
    assert ex.deviation_sigma > 4
    assert [t.channel for t in alerts[0].top_channels] == ["bearing_temp"]
    assert [c.channel for c in pipe.flush()[0].channels] == ["bearing_temp"]


def _alert(explanation: Explanation | None) -> Alert:
    return Alert("d:s:1", "d", "s", 1, "m", 1, 3.0, 2.0, 0.0, 1.0, 2.0,
                 (TopChannel("a", 0.7), TopChannel("b", 0.3)), explanation=explanation)


def test_multichannel_payload_is_unchanged_and_univariate_adds_explanation() -> None:
    plain = _alert(None).to_payload()
    assert json.dumps(plain, separators=(",", ":")) == (
        '{"schema":2,"event":"raised","episode_id":"d:s:1","alert_id":"d:s:1","device_id":"d","stream":"s","seq":1,'
        '"model":{"name":"m","version":1},"score":3.0,"threshold":2.0,'
        '"window_start":"1970-01-01T00:00:00.000Z","window_end":"1970-01-01T00:00:01.000Z",'
        '"raised_at":"1970-01-01T00:00:02.000Z","top_channels":[{"channel":"a",'
        '"contribution":0.7},{"channel":"b","contribution":0.3}]}')
    explained = _alert(Explanation(20.0, 24.5, 4.5, 9.0)).to_payload()
    assert explained["explanation"] == {"expected": 20.0, "observed": 24.5, "deviation": 4.5,
                                        "deviation_sigma": 9.0}
    assert {k: v for k, v in explained.items() if k != "explanation"} == plain
    body = AlertBody.model_validate(explained)
    assert body.explanation is not None and body.explanation.deviation == 4.5
    assert AlertBody.model_validate(plain).explanation is None


# -- channel mapping -------------------------------------------------------------------------


class _Stream:
    def __init__(self, channel: str | None) -> None:
        self.name, self.channel = "temp", channel


def test_channel_mapping() -> None:
    pkg = ("value",)
    assert univariate_channel(_Stream("t2"), "m", pkg, ("t1", "t2")) == ("t2",)
    assert univariate_channel(_Stream(None), "m", pkg, ("t1",)) == ("t1",)
    assert univariate_channel(_Stream(None), "m", pkg, ("x", "value")) == ("value",)
    with pytest.raises(ConfigError, match="name the one to score"):
        univariate_channel(_Stream(None), "m", pkg, ("t1", "t2"))
    with pytest.raises(ConfigError, match="not a channel of the source"):
        univariate_channel(_Stream("t9"), "m", pkg, ("t1", "t2"))


def test_a_multichannel_spec_is_refused() -> None:
    spec = DetectorSpec(("a", "b"), W, 1, 100, np.ones(2), 3, 2, np.ones(6), 1.0, 2.0)
    with pytest.raises(ValueError, match="one channel"):
        UnivariateDetector(spec, NumpyBackend(), UnivariateParams())


def test_build_detector_keeps_the_univariate_floors_for_a_one_channel_package() -> None:
    # model updates build their candidate with it: a plain detector would calibrate a flat
    # channel on the manifest's 1e-9 floor instead of the sensor quantum
    flat = np.full((400, 1), 20.0)
    flat[::50] = 20.1
    det = build_detector(make_spec(), NumpyBackend(), UnivariateParams())
    assert isinstance(det, UnivariateDetector)
    assert det.calibrate(flat).scaler.scale[0] >= 0.1 - 1e-12
    plain = build_detector(make_spec(), NumpyBackend(), None)
    assert not isinstance(plain, UnivariateDetector)
    assert plain.calibrate(flat).scaler.scale[0] < 0.1
