"""StreamPipeline against bad data: far-out readings in the calibration period, windows whose
score is not finite, readings outside a valid range (NumPy fake backend; no I/O)."""

from __future__ import annotations

import dataclasses
import logging
import threading

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from agent.config.loader import dump_config, parse_config
from agent.config.schema import AgentConfig, StreamConfig
from agent.errors import ConfigError
from agent.metrics import Metrics
from agent.pipeline.image import ImagePipeline, ImageSpec
from agent.pipeline.restore import refusal
from agent.pipeline.rules import RuleParams
from agent.pipeline.stream import OFF_SCALE
from agent.records import Frame, Reading
from agent.services.supervisor import SourceSupervisor
from agent.sources.base import Emit, Reject
from agent.sources.serial import SerialConfig
from agent.sources.valid_range import ValidRange, ValidRangeConfig
from tests.unit.test_calibration_restore import NOW, _stored
from tests.unit.test_detector import noise
from tests.unit.test_stream import T0, N, make_pipeline


def test_a_far_out_reading_is_left_out_of_the_calibration() -> None:
    x = noise(N, 3)
    clean = make_pipeline(calibration_samples=N - 1)
    clean_out = clean.process_block(np.delete(x, 123, axis=0), T0 + np.arange(N - 1.0))
    x[123, 1] = 1e20  # a broken transmitter, once
    p = make_pipeline()
    out = p.process_block(x, T0 + np.arange(float(N)))
    assert out.calibration_outliers == 1
    assert p.calibration_samples is not None and p.calibration_samples.shape[0] == N - 1
    # fitted on the same readings as a stream that never sent it
    assert clean.calibration_samples is not None
    np.testing.assert_array_equal(p.calibration_samples, clean.calibration_samples)
    assert p.threshold == clean.threshold and np.isfinite(p.threshold)
    assert clean_out.calibration_outliers == 0


def test_a_window_scoring_non_finite_is_counted_and_alerts() -> None:
    p = make_pipeline()
    x = noise(N + 200, 4)
    x[N + 100, 0] = 3e38  # a float32 holds it; the scaled value does not
    out = p.process_block(x, T0 + np.arange(float(N + 200)))
    assert out.nonfinite_scores > 0
    live = out.scores[~np.isnan(out.scores)]
    assert np.isfinite(live).all() and (live == OFF_SCALE).sum() == out.nonfinite_scores
    assert len(out.alerts) == 1
    alert = out.alerts[0]
    assert alert.score == OFF_SCALE and alert.window_start <= T0 + N + 100 <= alert.window_end
    assert alert.top_channels[0].channel == "voltage"
    assert alert.top_channels[0].contribution == 1.0


class _Emits:
    stream = "s"
    channels = ("a", "b")

    def run(self, emit: Emit, reject: Reject, stop: threading.Event) -> None:
        for v in ([1.0, 2.0], [1.0, 60.0], [1e39, 2.0], [3.0, 4.0]):
            emit(Reading("s", 0.0, np.array(v)))
        stop.wait()


def test_readings_outside_the_valid_range_are_rejected_at_the_source() -> None:
    metrics = Metrics(CollectorRegistry())
    stop = threading.Event()
    out: list[Reading] = []
    sup = SourceSupervisor(_Emits(), out.append, metrics, stop, logging.getLogger("t"),
                           valid_range=ValidRange(("a", "b"), {"b": (0.0, 50.0)}))
    sup.start()
    try:
        for _ in range(200):
            if len(out) == 2:
                break
            stop.wait(0.01)
    finally:
        stop.set()
        sup.join(2.0)
    assert [r.values.tolist() for r in out] == [[1.0, 2.0], [3.0, 4.0]]
    rejected = metrics.registry.get_sample_value(
        "edge_agent_records_rejected_total", {"stream": "s", "reason": "out_of_range"})
    assert rejected == 2


def test_valid_range_config_round_trips_and_names_bad_bounds() -> None:
    cfg = AgentConfig(streams=[StreamConfig(
        name="a", source=SerialConfig(port="/dev/ttyUSB0", channels=["x", "y"]),
        valid_range=[ValidRangeConfig(channel="y", low=0.0, high=50.0)])])
    assert parse_config(dump_config(cfg), env={}) == cfg
    text = ('[[streams]]\nname = "a"\n[[streams.valid_range]]\nchannel = "y"\nlow = 5.0\n'
            'high = 1.0\n[streams.source]\nkind = "simulator"\n')
    with pytest.raises(ConfigError) as info:
        parse_config(text, env={})
    problems = info.value.problems or []
    assert any("streams[0].valid_range[0]" in p and "must not exceed" in p for p in problems)


def _live(n: int, step_at: int, step_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A live stream at 1 Hz: two offset faults 200 s apart; the wall clock (the readings'
    timestamps) steps by ``step_s`` at reading ``step_at``, the monotonic clock runs on."""
    x = noise(n, 5)
    for start in (N + 100, N + 300):
        x[start:start + 30, 1] += 8 * 0.1
    mono = 1000.0 + np.arange(float(n))
    ts = T0 + np.arange(float(n))
    ts[step_at:] += step_s
    return x, ts, mono


@pytest.mark.parametrize("step_s", [-3600.0, 3600.0])
def test_a_wall_clock_step_keeps_cooldowns_and_closes_the_interval(step_s: float) -> None:
    n = N + 400
    x, ts, mono = _live(n, N + 230, step_s)
    want = make_pipeline().process_block(*_live(n, n, 0.0)[:2])  # the same, no step
    p = make_pipeline()
    outs = [p.process_block(x[a:a + 50], ts[a:a + 50], float(mono[a + 49]), mono[a:a + 50])
            for a in range(0, n, 50)]
    steps = [s for o in outs for s in o.clock_steps]
    assert [(s.direction, s.size_s, s.at_ts) for s in steps] == [
        ("back" if step_s < 0 else "forward", step_s, ts[N + 230])]
    alerts = [a for o in outs for a in o.alerts]
    assert len(alerts) == len(want.alerts) == 2  # the cooldown counts monotonic seconds
    aggs = [g for o in outs for g in o.aggregates] + p.flush()
    assert max(g.count for g in aggs) <= 60
    assert sum(g.count for g in aggs) == n
    closed = [g for g in aggs if g.interval_start <= ts[N + 229] < g.interval_start + 60]
    assert len(closed) == 1 and closed[0].count < 60  # closed at the step, not at its end


class _Scores:
    """An image backend returning scripted scores."""

    name, precision = "fake", "fp32"

    def __init__(self, scores: list[float]) -> None:
        self.scores = scores

    def run(self, x: np.ndarray) -> np.ndarray:
        return np.array([self.scores.pop(0)], np.float32)


def test_a_camera_clock_step_keeps_its_cooldown_and_closes_the_interval() -> None:
    scores = [9.0] + [0.0] * 79 + [9.0]  # two defects 80 s apart (monotonic)
    rules = RuleParams(k=1, n=1, clear_ratio=1.0, clear_windows=1, cooldown_s=60.0)
    p = ImagePipeline("cam", "gw1", ImageSpec(4, 4, 1, (0.0,), (1.0,)), _Scores(scores),  # type: ignore[arg-type]
                      threshold=1.0, rules=rules)
    image = np.zeros((4, 4), np.uint8)
    outs = []
    for i in range(81):
        ts = T0 + i - (3600.0 if i >= 30 else 0.0)  # the wall clock set back an hour
        outs.append(p.process(Frame("cam", ts, image, received_mono=500.0 + i)))
    assert [o.clock_step.direction for o in outs if o.clock_step is not None] == ["back"]
    assert sum(len(o.alerts) for o in outs) == 2
    closed = outs[30].aggregates
    assert len(closed) == 1 and closed[0].count == 30  # T0 opens an interval: frames 0-29


def test_a_stored_calibration_fitted_on_a_far_out_reading_is_not_restored() -> None:
    """One stored before far-out readings were left out (its threshold inflated) calibrates
    afresh at the next start instead of being reused."""
    rec = _stored()
    assert rec.readings is not None and refusal(rec, rec.key, NOW, None) is None
    bad = rec.readings.copy()
    bad[100, 2] = 1e20
    why = refusal(dataclasses.replace(rec, readings=bad), rec.key, NOW, None)
    assert why == "it was fitted on 1 far-out reading(s)"
