"""StreamPipeline end to end with the NumPy fake backend: calibration, scores, alerts, aggregates
are the same however the input is split into blocks."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from agent.pipeline.detector import FeatureDeviationDetector
from agent.pipeline.rules import RuleParams
from agent.pipeline.stream import AlertEvent, StreamPipeline
from agent.records import Aggregate
from tests.unit.test_detector import CHANNELS, NOISE, NumpyBackend, make_spec, noise

T0 = 1_699_999_980.0  # a multiple of 60
N = 400
RULES = RuleParams(k=3, n=5, clear_ratio=0.9, clear_windows=5, cooldown_s=60.0)


def make_pipeline(
    hop: int = 1, calibration_samples: int = N, factor: float = 1.5
) -> StreamPipeline:
    spec = make_spec(hop=hop, calibration_samples=calibration_samples, factor=factor)
    return StreamPipeline(
        "pump1", "gw1", spec, FeatureDeviationDetector(spec, NumpyBackend()), RULES,
        aggregate_interval_s=60.0, top_channels=2,
    )


class Run:
    """Everything a pipeline produced over a whole stream, indexed by absolute sample."""

    def __init__(self) -> None:
        self.ends: list[int] = []
        self.scores: list[float] = []
        self.alerts: list[AlertEvent] = []
        self.aggregates: list[Aggregate] = []
        self.calibrated_in_block_ending: int | None = None


def feed(p: StreamPipeline, x: np.ndarray, ts: np.ndarray, cuts: list[int]) -> Run:
    r = Run()
    for a, b in itertools.pairwise(cuts):
        out = p.process_block(x[a:b], ts[a:b])
        assert out.end_index.shape == out.scores.shape
        r.ends += (out.end_index + a).tolist()
        r.scores += out.scores.tolist()
        r.alerts += out.alerts
        r.aggregates += out.aggregates
        if out.calibrated is not None:
            assert r.calibrated_in_block_ending is None
            r.calibrated_in_block_ending = b
    r.aggregates += p.flush()
    return r


def stream_with_step(n: int, step_at: int, channel: int, seed: int) -> np.ndarray:
    x = noise(n, seed)
    x[step_at:, channel] += 8 * NOISE[channel]
    return x


def splits(n: int, kind: str, seed: int = 0) -> list[int]:
    if kind == "one":
        return [0, n]
    if kind == "per_sample":
        return list(range(n + 1))
    rng = np.random.default_rng(seed)
    cuts = [0]
    while cuts[-1] < n:
        cuts.append(min(n, cuts[-1] + int(rng.integers(1, 120))))
    return cuts


@pytest.mark.parametrize("hop", [1, 3])
def test_block_split_does_not_change_anything(hop: int) -> None:
    n = 1500
    x = stream_with_step(n, step_at=900, channel=1, seed=11)
    ts = T0 + np.arange(n) * 0.25  # 4 Hz: several 60 s intervals, one mid-calibration
    runs = {kind: feed(make_pipeline(hop), x, ts, splits(n, kind)) for kind in
            ("one", "per_sample", "random")}
    ref = runs["one"]
    assert ref.ends == list(range(9, n, hop))
    assert len(ref.alerts) >= 1
    for kind, r in runs.items():
        assert r.ends == ref.ends, kind
        np.testing.assert_array_equal(r.scores, ref.scores, err_msg=kind)
        assert r.alerts == ref.alerts, kind
        assert_same_aggregates(r.aggregates, ref.aggregates)


def assert_same_aggregates(got: list[Aggregate], want: list[Aggregate]) -> None:
    """Equal, except mean/std to 1e-12 relative (summation order depends on the blocks)."""
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert (g.interval_start, g.count, g.windows, g.alert_count) == (
            w.interval_start, w.count, w.windows, w.alert_count)
        assert g.max_score == w.max_score or (math.isnan(g.max_score) and math.isnan(w.max_score))
        for cg, cw in zip(g.channels, w.channels, strict=True):
            assert (cg.channel, cg.count, cg.min, cg.max) == (cw.channel, cw.count, cw.min, cw.max)
            assert cg.mean == pytest.approx(cw.mean, rel=1e-12)
            assert cg.std == pytest.approx(cw.std, rel=1e-9)


@pytest.mark.parametrize("kind", ["one", "per_sample", "random"])
def test_calibration_happens_after_exactly_n_samples(kind: str) -> None:
    n = 700
    x = noise(n, seed=12)
    ts = T0 + np.arange(n, dtype=float)
    p = make_pipeline()
    r = feed(p, x, ts, splits(n, kind, seed=3))
    scores = np.array(r.scores)
    ends = np.array(r.ends)
    assert np.all(np.isnan(scores[ends < N]))  # windows ending before sample N: calibrating
    assert np.all(np.isfinite(scores[ends >= N]))  # from sample N on: scored
    assert (ends == N - 1).any() and (ends == N).any()
    assert r.calibrated_in_block_ending is not None
    if kind == "per_sample":
        assert r.calibrated_in_block_ending == N  # the block holding sample N-1
    assert not p.calibrating
    # the calibration saw exactly the first N samples
    assert p.calibration is not None
    np.testing.assert_allclose(p.calibration.scaler.mean, x[:N].mean(0), rtol=1e-12)


def test_threshold_is_nan_while_calibrating() -> None:
    p = make_pipeline()
    x = noise(N, seed=13)
    out = p.process_block(x[: N - 1], T0 + np.arange(N - 1.0))
    assert math.isnan(out.threshold) and p.calibrating and out.calibrated is None
    out = p.process_block(x[N - 1 :], np.array([T0 + N - 1.0]))
    assert out.calibrated is not None
    assert out.threshold == out.calibrated.threshold > 0
    # the window ending at sample N-1 is still a calibration window: unscored
    assert len(out.scores) == 1 and math.isnan(out.scores[0])


@pytest.mark.parametrize("channel", [0, 1, 2])
def test_step_change_raises_alert_naming_the_channel(channel: int) -> None:
    n = 1000
    x = stream_with_step(n, step_at=700, channel=channel, seed=14)
    ts = T0 + np.arange(n, dtype=float)
    r = feed(make_pipeline(), x, ts, splits(n, "random", seed=channel))
    assert len(r.alerts) == 1
    a = r.alerts[0]
    assert a.stream == "pump1"
    assert a.top_channels[0].channel == CHANNELS[channel]
    assert len(a.top_channels) == 2
    assert a.top_channels[0].contribution >= a.top_channels[1].contribution
    assert a.score > a.threshold
    # k=3 of 5: the alert window ends at most a few samples after the step
    assert T0 + 700 <= a.window_end <= T0 + 700 + 5
    assert a.window_end - a.window_start == 9.0
    # the alert is counted in the aggregate of its window's last sample
    [agg] = [g for g in r.aggregates if g.alert_count]
    assert agg.interval_start <= a.window_end < agg.interval_start + 60
    assert agg.alert_count == 1
    assert agg.max_score >= a.score


@pytest.mark.parametrize("stride", [1, 2])
def test_a_short_burst_alerts_at_the_skip_windows_stride_too(stride: int) -> None:
    """The app raises the windower's hop k-fold at the skip_windows level; the rules must count
    each scored window k times (7 of 10 rules; a 3-sample burst lies in 12 windows, 6 of them
    scored at stride 2: fewer than k=7 when counted once)."""
    spec = make_spec(hop=1, calibration_samples=N)
    p = StreamPipeline(
        "pump1", "gw1", spec, FeatureDeviationDetector(spec, NumpyBackend()),
        RuleParams(k=7, n=10, clear_ratio=0.9, clear_windows=5, cooldown_s=0),
        aggregate_interval_s=60.0, top_channels=2,
    )
    n = 1000
    x = noise(n, 14)
    x[700:703, 0] += 8 * NOISE[0]
    ts = T0 + np.arange(n, dtype=float)
    assert feed(p, x[:600], ts[:600], [0, 600]).alerts == []
    p.windower.hop = spec.hop * stride  # what DeadlineGuard.on_stride does in agent.app
    r = feed(p, x[600:], ts[600:], splits(400, "random", seed=1))
    assert len(r.alerts) == 1
    assert T0 + 700 <= r.alerts[0].window_end <= T0 + 712


def test_stationary_noise_raises_no_alert_over_a_long_run() -> None:
    """20,000 samples of i.i.d. noise after calibration: no alert.

    The factor is 2.5, not the shipped package's 1.5: with q = 1.0 over the ~391 overlapping
    calibration windows (about 40 independent ones) the threshold is a noisy estimate, and with
    factor 1.5 about a third of seeds (34 of 100 measured) raise a false alert within 20,000
    samples; with 2.5 none of 100 did, so this seed is not a lucky pick.
    """
    n = 20_000
    x = noise(n, seed=15)
    ts = T0 + np.arange(n, dtype=float)
    p = make_pipeline(factor=2.5)
    r = feed(p, x, ts, splits(n, "random", seed=4))
    assert r.alerts == []
    scores = np.array(r.scores)
    assert np.isfinite(scores[N:]).all()
    assert p.calibration is not None
    assert np.nanmax(scores) < p.calibration.threshold
    assert sum(g.alert_count for g in r.aggregates) == 0


def test_aggregates_count_every_reading_and_scored_window() -> None:
    n = 1000
    x = stream_with_step(n, step_at=700, channel=0, seed=16)
    ts = T0 + 30.0 + np.arange(n) * 0.5  # intervals do not start with the stream
    r = feed(make_pipeline(), x, ts, splits(n, "random", seed=5))
    assert sum(g.count for g in r.aggregates) == n
    assert sum(g.windows for g in r.aggregates) == int(np.isfinite(r.scores).sum())
    assert sum(g.alert_count for g in r.aggregates) == len(r.alerts)
    starts = [g.interval_start for g in r.aggregates]
    assert starts == sorted(starts) and all(s % 60 == 0 for s in starts)
    scores, ends = np.array(r.scores), np.array(r.ends)
    for g in r.aggregates:
        in_g = (ts[ends] >= g.interval_start) & (ts[ends] < g.interval_start + 60)
        live = in_g & np.isfinite(scores)
        assert g.windows == int(live.sum())
        if g.windows:
            assert g.max_score == scores[live].max()
        else:
            assert math.isnan(g.max_score)


def test_restored_calibration_scores_from_the_first_window() -> None:
    first = make_pipeline()
    feed(first, noise(N, seed=17), T0 + np.arange(N, dtype=float), [0, N])
    spec = first.spec
    p = StreamPipeline("pump1", "gw1", spec, first.detector, RULES,
                       calibration=first.calibration)
    assert not p.calibrating
    out = p.process_block(noise(20, seed=18), T0 + 1000 + np.arange(20.0))
    assert len(out.scores) == 11 and np.isfinite(out.scores).all()


@pytest.mark.parametrize("cal", [5, 10])
def test_calibration_samples_must_exceed_window(cal: int) -> None:
    with pytest.raises(ValueError, match="must exceed the window"):
        make_pipeline(calibration_samples=cal)


def test_shape_mismatch_is_rejected() -> None:
    p = make_pipeline()
    with pytest.raises(ValueError):
        p.process_block(np.zeros((5, 2)), T0 + np.arange(5.0))
