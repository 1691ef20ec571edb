"""IntervalAggregator: per-channel stats vs numpy, alignment, flush, score/alert counting."""

from __future__ import annotations

import math

import numpy as np
import pytest

from agent.pipeline.aggregates import IntervalAggregator
from agent.records import Aggregate

CHANNELS = ("voltage", "current", "temp")
T0 = 1_699_999_980.0  # a multiple of 10, 15 and 60


def make(interval_s: float = 60.0) -> IntervalAggregator:
    return IntervalAggregator("gw1", "pump1", CHANNELS, interval_s)


def check_against_numpy(agg: Aggregate, values: np.ndarray) -> None:
    assert agg.count == values.shape[0]
    for i, st in enumerate(agg.channels):
        col = values[:, i]
        assert st.channel == CHANNELS[i]
        assert st.count == col.size
        assert st.min == col.min()
        assert st.max == col.max()
        assert st.mean == pytest.approx(col.mean(), rel=1e-12)
        assert st.std == pytest.approx(col.std(), rel=1e-9)


def test_stats_match_numpy_with_large_offsets() -> None:
    rng = np.random.default_rng(0)
    n = 6000
    values = np.column_stack([
        rng.normal(230.0, 0.05, n),  # mains voltage, tiny noise on a large offset
        rng.normal(1e6, 1e-3, n),  # a huge offset with tiny noise
        rng.normal(20.0, 3.0, n),
    ])
    ts = T0 + np.arange(n) * 0.01  # 60 s exactly: one interval
    a = make()
    # fed in random blocks, as a source would
    cuts = np.sort(rng.choice(np.arange(1, n), 40, replace=False))
    out: list[Aggregate] = []
    for v, t in zip(np.split(values, cuts), np.split(ts, cuts), strict=True):
        out += a.add_readings(v, t)
    assert out == []
    [agg] = a.flush()
    check_against_numpy(agg, values)
    assert agg.interval_start == T0
    assert agg.interval_s == 60.0
    assert (agg.device_id, agg.stream) == ("gw1", "pump1")


def test_naive_sumsq_would_fail_here() -> None:
    # guard that the previous test is meaningful: the textbook E[x²] − E[x]² formula loses the
    # std of 1e6 ± 1e-3 entirely in float64
    rng = np.random.default_rng(0)
    x = rng.normal(1e6, 1e-3, 6000)
    naive = math.sqrt(max((x * x).mean() - x.mean() ** 2, 0.0))
    assert abs(naive - x.std()) / x.std() > 1e-3


def test_intervals_are_aligned_to_multiples_of_interval() -> None:
    a = make(10.0)
    ts = np.array([T0 + 3.0, T0 + 9.999, T0 + 10.0, T0 + 17.0])
    values = np.arange(12.0).reshape(4, 3)
    out = a.add_readings(values, ts)
    assert [g.interval_start for g in out] == [T0]
    assert out[0].count == 2
    assert out[0].aggregate_id == f"gw1:pump1:{int(T0 * 1000)}"
    [last] = a.flush()
    assert last.interval_start == T0 + 10.0
    check_against_numpy(last, values[2:])


def test_one_block_spanning_several_intervals_with_gaps() -> None:
    rng = np.random.default_rng(1)
    # 1 Hz samples over 0..59 s and 120..179 s; interval 15 s -> 8 intervals (a gap of 4)
    ts = T0 + np.concatenate([np.arange(0.0, 60.0), np.arange(120.0, 180.0)])
    values = rng.normal(230.0, 1.0, size=(ts.size, 3))
    a = make(15.0)
    out = a.add_readings(values, ts) + a.flush()
    starts = [g.interval_start - T0 for g in out]
    assert starts == [0.0, 15.0, 30.0, 45.0, 120.0, 135.0, 150.0, 165.0]
    for g in out:
        sel = (ts >= g.interval_start) & (ts < g.interval_start + 15.0)
        check_against_numpy(g, values[sel])
    assert sum(g.count for g in out) == ts.size


def test_blocks_and_single_samples_give_the_same_aggregates() -> None:
    rng = np.random.default_rng(2)
    ts = T0 + np.cumsum(rng.uniform(0.0, 3.0, 400))
    values = rng.normal(230.0, 2.0, size=(400, 3))
    whole = make(30.0)
    out_whole = whole.add_readings(values, ts) + whole.flush()
    single = make(30.0)
    out_single = []
    for i in range(400):
        out_single += single.add_readings(values[i : i + 1], ts[i : i + 1])
    out_single += single.flush()
    assert [g.interval_start for g in out_whole] == [g.interval_start for g in out_single]
    for g1, g2 in zip(out_whole, out_single, strict=True):
        assert g1.count == g2.count
        for c1, c2 in zip(g1.channels, g2.channels, strict=True):
            assert (c1.min, c1.max) == (c2.min, c2.max)
            assert c1.mean == pytest.approx(c2.mean, rel=1e-12)
            assert c1.std == pytest.approx(c2.std, rel=1e-9)


def test_flush_closes_the_open_interval_once() -> None:
    a = make()
    assert a.flush() == []
    a.add_readings(np.ones((3, 3)), T0 + np.arange(3.0))
    [g] = a.flush()
    assert g.count == 3
    assert all(st.std == 0.0 for st in g.channels)
    assert a.flush() == []


def test_clock_stepping_back_counts_into_the_open_interval() -> None:
    a = make(10.0)
    a.add_readings(np.ones((1, 3)), np.array([T0 + 25.0]))
    out = a.add_readings(np.full((2, 3), 3.0), np.array([T0 + 5.0, T0 + 26.0]))
    assert out == []
    [g] = a.flush()
    assert g.interval_start == T0 + 20.0
    assert g.count == 3


def test_scores_and_alerts_are_counted_into_the_open_interval() -> None:
    a = make(10.0)
    a.add_readings(np.ones((5, 3)), T0 + np.arange(5.0))
    a.add_scores(np.array([math.nan, math.nan, 0.5]), 0)  # NaN = calibrating: not counted
    a.add_scores(np.array([2.5, 1.0]), 1)
    out = a.add_readings(np.ones((5, 3)), T0 + 10.0 + np.arange(5.0))
    a.add_scores(np.array([0.25]), 2)
    out += a.flush()
    first, second = out
    assert (first.windows, first.max_score, first.alert_count) == (3, 2.5, 1)
    assert (second.windows, second.max_score, second.alert_count) == (1, 0.25, 2)


def test_interval_without_scored_windows_has_nan_max_score() -> None:
    a = make(10.0)
    a.add_readings(np.ones((5, 3)), T0 + np.arange(5.0))
    a.add_scores(np.full(4, math.nan), 0)
    a.add_scores(np.zeros(0), 0)
    [g] = a.flush()
    assert g.windows == 0
    assert math.isnan(g.max_score)
    assert g.alert_count == 0


def test_negative_scores_are_a_valid_max() -> None:
    a = make(10.0)
    a.add_readings(np.ones((2, 3)), T0 + np.arange(2.0))
    a.add_scores(np.array([-3.0, -2.0]), 0)
    [g] = a.flush()
    assert g.max_score == -2.0 and g.windows == 2


def test_empty_block_emits_nothing() -> None:
    a = make()
    assert a.add_readings(np.zeros((0, 3)), np.zeros(0)) == []
    assert a.flush() == []


@pytest.mark.parametrize("interval", [0.0, -1.0])
def test_interval_must_be_positive(interval: float) -> None:
    with pytest.raises(ValueError, match="interval_s"):
        make(interval)
