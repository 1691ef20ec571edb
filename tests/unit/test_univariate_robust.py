"""The robust adaptive score of univariate streams (agent/pipeline/robust.py through
agent/pipeline/univariate.py): generated series, the agent's own pipeline and alert rules."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from agent.pipeline.detector import DetectorSpec
from agent.pipeline.robust import RobustParams, RobustState, robust_scores, robust_stats
from agent.pipeline.rules import RuleParams
from agent.pipeline.stream import AlertEvent
from agent.pipeline.univariate import UnivariatePipeline
from agent.pipeline.univariate_detector import UnivariateDetector, UnivariateParams
from tests.unit.test_detector import NumpyBackend

W = 5
FLOORS = np.array([0.153, 0.0327, 0.0567])  # the univariate package's floors for W 5
PARAMS = UnivariateParams(adapt_rate=0.01, drift_bound=6.0, threshold_sigma=6.0,
                          scale_rate=0.01, clip=3.0, scale_bound=4.0)
RULE = RuleParams(k=3, n=5, spike_factor=1.0)


def make_pipe(params: UnivariateParams = PARAMS, rule: RuleParams = RULE
              ) -> UnivariatePipeline:
    spec = DetectorSpec(("value",), W, 1, 400, np.array([1e-9]), 3, 1, FLOORS, 1.0, 1.0, 0.0)
    return UnivariatePipeline("s", "dev", spec, UnivariateDetector(spec, NumpyBackend(), params),
                              rule, params)


def run(x: np.ndarray, params: UnivariateParams = PARAMS, block: int = 50
        ) -> tuple[list[AlertEvent], np.ndarray, UnivariatePipeline]:
    """Alerts, the scores ``(T,)`` (NaN unscored) and the pipeline after feeding ``x``."""
    pipe = make_pipe(params)
    ts = np.arange(x.shape[0], dtype=np.float64)
    scores = np.full(x.shape[0], np.nan)
    alerts: list[AlertEvent] = []
    for a in range(0, x.shape[0], block):
        out = pipe.process_block(x[a : a + block, None], ts[a : a + block])
        scores[out.end_index + a] = out.scores
        alerts += out.alerts
    return alerts, scores, pipe


def noise(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=n)


def test_robust_stats_ignore_outlying_calibration_windows() -> None:
    feats = np.random.default_rng(0).normal(size=(400, 3))
    feats[:20] += 50.0  # 5 % of the calibration windows far out
    centre, scale = robust_stats(feats, np.full(3, 0.01))
    assert np.all(np.abs(centre) < 0.3) and np.all(np.abs(scale - 1.0) < 0.25)
    assert np.all(feats.std(axis=0) > 10)  # the plain std would be inflated tenfold


def test_calibration_threshold_is_the_fixed_number_of_robust_sigmas() -> None:
    _, _, pipe = run(noise(600))
    assert pipe.threshold == 6.0
    assert pipe.calibration is not None and pipe.calibration.scores.shape == (400 - W + 1,)
    assert np.quantile(pipe.calibration.scores, 0.5) < 1.5  # median |z| of normal windows


def test_gaussian_noise_with_an_8_sigma_spike_alarms() -> None:
    """The clean series may raise one alert by chance, the spike must raise one where it is."""
    x = noise(6000, seed=1)
    quiet, _, _ = run(x, replace(PARAMS, threshold_sigma=5.0))
    x[3000] += 8.0
    alerts, _, _ = run(x, replace(PARAMS, threshold_sigma=5.0))
    assert len(quiet) <= 1 and not [a for a in quiet if 3000 <= a.window_end < 3000 + W]
    assert [a for a in alerts if 3000 <= a.window_end < 3000 + W]


def test_a_50_row_4_sigma_step_alarms() -> None:
    x = noise(6000, seed=2)
    x[3000:3050] += 4.0
    alerts, _, _ = run(x, replace(PARAMS, threshold_sigma=5.0))
    assert [a.window_end for a in alerts] and 3000 <= alerts[0].window_end < 3000 + W


def test_a_slow_drift_within_the_bound_is_followed_not_alarmed() -> None:
    x = noise(19000, seed=3) + np.concatenate([np.zeros(1000), np.linspace(0, 3.0, 18000)])
    alerts, _, pipe = run(x)
    assert alerts == []
    assert pipe.baseline == pytest.approx(3.0, abs=0.5)  # the level followed the drift


def test_a_slow_fault_beyond_the_bounds_is_still_alarmed() -> None:
    x = noise(19000, seed=4) + np.concatenate([np.zeros(1000), np.linspace(0, 30.0, 18000)])
    alerts, _, pipe = run(x)
    assert alerts != []
    state = pipe.robust_state
    assert state is not None
    assert state.centre[0] == pytest.approx(state.centre0[0] + 6.0)  # the level bound held
    assert state.scale[0] == pytest.approx(4.0 * state.scale0[0])  # the scale bound held


def test_a_seasonal_sine_with_noise_does_not_alarm_constantly() -> None:
    """A daily cycle of ±3 sigmas of noise at one reading a minute; calibration covers 400
    minutes, less than a third of the cycle."""
    t = np.arange(14400)
    x = 3.0 * np.sin(2 * np.pi * t / 1440) + noise(t.size, seed=5)
    alerts, scores, _ = run(x)
    scored = scores[~np.isnan(scores)]
    assert len(alerts) <= 2
    assert np.mean(scored > 6.0) < 0.001


def test_tripled_noise_is_learned_within_the_bound_so_the_stream_is_not_stuck() -> None:
    """A calibration that under-states the noise (it triples after row 1000) alarms at the
    change, then the scales follow: no alarm in the last half."""
    x = noise(12000, seed=6)
    x[1000:] *= 3.0
    alerts, scores, _ = run(x)
    assert alerts != [] or np.nanmax(scores[1000:2000]) > 6.0
    assert all(a.window_end < 6000 for a in alerts)
    assert np.mean(scores[6000:] > 6.0) < 0.001


def test_scores_do_not_depend_on_the_block_size() -> None:
    x = noise(2000, seed=7)
    x[1500] += 8.0
    _, by1, _ = run(x, block=1)
    _, by50, _ = run(x, block=50)
    assert np.allclose(by1, by50, equal_nan=True)


def test_a_spike_moves_the_baseline_by_at_most_the_clip() -> None:
    state = RobustState.start(np.ones(3), np.ones(3))
    p = RobustParams(adapt_rate=0.05, scale_rate=0.05, clip=3.0)
    _, _, after = robust_scores(np.array([[1000.0, 1000.0, 1000.0]]), state, p)
    assert np.allclose(after.centre, 1.0 + 0.05 * 3.0)
    assert np.allclose(after.scale, 1.0 + 0.05 * (np.sqrt(np.pi / 2) * 3.0 - 1.0))


def test_the_explanation_gives_the_adapted_level() -> None:
    x = noise(6000, seed=8) + np.concatenate([np.zeros(1000), np.linspace(0, 2.0, 5000)])
    x[5500] += 10.0
    alerts, _, _ = run(x)
    assert len(alerts) == 1 and alerts[0].explanation is not None
    e = alerts[0].explanation
    assert e.expected == pytest.approx(2.0, abs=0.6)  # the drifted level, not the calibration's
    assert e.deviation == pytest.approx(e.observed - e.expected)


@pytest.mark.parametrize("level", [0.0, 5.0])
def test_a_flat_calibration_learns_the_noise_that_follows_and_still_alarms_a_spike(
        level: float, caplog: pytest.LogCaptureFixture) -> None:
    """A channel flat while calibrating (a stopped machine) scored its later noise thousands
    of sigmas away for ever: the bounds had no reference (a centre of 0, σ_cal at its floor).
    Now it alarms at the change, learns the noise, and a later spike still alarms."""
    x = np.r_[np.full(500, level), level + 0.01 * noise(6000, seed=8)]
    x[5000] += 0.3  # 30 sigmas of the noise that follows
    alerts, scores, pipe = run(x)
    state = pipe.robust_state
    assert state is not None and not state.bounded
    assert "calibration period was flat" in caplog.text
    assert alerts and alerts[0].window_end < 600  # the change from flat
    assert np.mean(scores[3000:4900] > 6.0) < 0.01  # the noise is learned: not stuck in alarm
    assert any(4990 <= a.window_end <= 5010 for a in alerts)  # the spike


def test_a_calibration_with_noise_keeps_its_bounds() -> None:
    _, _, pipe = run(noise(1000, seed=9))
    state = pipe.robust_state
    assert state is not None and state.bounded
