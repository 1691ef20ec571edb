"""Aggregate parts in the SQLite store (real files): an interval flushed at shutdown and
completed by the next process keeps both parts; an identical aggregate stays a duplicate."""

from __future__ import annotations

import dataclasses
import math
import re
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from agent.app import repeat_policy
from agent.metrics import Metrics
from agent.pipeline.aggregates import IntervalAggregator
from agent.records import Aggregate, ChannelStats, aggregate_part_id
from agent.sources.camera import CameraConfig
from agent.sources.replay import ReplayConfig
from agent.sources.serial import SerialConfig
from agent.sources.simulator import SimulatorConfig
from agent.store.parts import part_of
from agent.store.sqlite import Store
from cloud_sync.protocol import AGGREGATE_ID_PATTERN, ID_PATTERN
from tests.unit.test_store import make_aggregate

T0 = 1_700_000_040.0  # an interval start (multiple of 60 s)


def readings(start: float, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return 230.0 + rng.normal(0, 1, (n, 2)), start + np.arange(n, dtype=np.float64) * 0.5


def run(db: Path, ts_from: float, n: int, seed: int, *, flush: bool) -> list[Aggregate]:
    """One agent process: aggregate ``n`` readings from ``ts_from``, store what closes, and the
    open interval too when ``flush`` (SIGTERM); the store is closed at the end."""
    agg = IntervalAggregator("gw1", "pump1", ("v", "i"), 60.0)
    values, ts = readings(ts_from, n, seed)
    out = agg.add_readings(values, ts)
    if flush:
        out += agg.flush()
    with Store(db) as store:
        for a in out:
            store.add_aggregate(a)
    return out


def rows(db: Path) -> list[tuple[str, int]]:
    conn = sqlite3.connect(db)
    try:
        return [(r[0], int(r[1])) for r in conn.execute(
            "SELECT aggregate_id, count FROM aggregates ORDER BY id")]
    finally:
        conn.close()


def test_restart_within_an_interval_keeps_both_parts(tmp_path: Path) -> None:
    db = tmp_path / "agent.db"
    # process 1: 30 s of the interval, then SIGTERM flushes it as a partial aggregate
    run(db, T0, 60, seed=1, flush=True)
    # process 2: the rest of the interval, closed by the first reading of the next one
    run(db, T0 + 31, 59, seed=2, flush=False)
    base = f"gw1:pump1:{round(T0 * 1000)}"
    assert rows(db) == [(base, 60), (f"{base}:1", 58)]
    # a third process within the same interval: part 2
    run(db, T0 + 59.5, 1, seed=3, flush=True)
    assert rows(db)[-1] == (f"{base}:2", 1)


def test_identical_aggregates_are_duplicates_of_any_part(tmp_path: Path) -> None:
    metrics = Metrics(CollectorRegistry())
    with Store(tmp_path / "agent.db", metrics=metrics) as store:
        p0 = make_aggregate(T0)
        p1 = dataclasses.replace(p0, count=7)
        assert store.add_aggregate(p0) is True
        assert store.add_aggregate(p1) is True
        assert store.add_aggregate(p0) is False
        assert store.add_aggregate(p1) is False
        # the same readings scored differently (a replay whose calibration was restored) are
        # the same aggregate: the first row stays
        assert store.add_aggregate(dataclasses.replace(p1, windows=0, max_score=math.nan,
                                                       alert_count=0)) is False
        ids = [a["aggregate_id"] for a in store.aggregates()]
        assert ids == [p0.aggregate_id, f"{p0.aggregate_id}:1"]
        assert store.aggregates()[1]["count"] == 7
        # another interval of the same stream is not a part, and neither is another stream
        assert store.add_aggregate(make_aggregate(T0 + 60)) is True
        assert store.add_aggregate(make_aggregate(T0, stream="pump2")) is True
        assert len(store.aggregates()) == 4
    got = metrics.registry.get_sample_value("edge_agent_aggregates_total", {"stream": "pump1"})
    assert got == 3


def test_streams_without_channels_compare_every_field(tmp_path: Path) -> None:
    # a camera aggregate has no channel statistics: equal frame counts alone are not enough
    cam = dataclasses.replace(make_aggregate(T0, stream="cam1"), channels=())
    with Store(tmp_path / "agent.db") as store:
        assert store.add_aggregate(cam) is True
        assert store.add_aggregate(dataclasses.replace(cam, max_score=9.25)) is True
        assert store.add_aggregate(dataclasses.replace(cam, max_score=math.nan,
                                                       windows=0)) is True
        assert store.add_aggregate(dataclasses.replace(cam, max_score=math.nan,
                                                       windows=0)) is False
        assert store.add_aggregate(cam) is False
        assert len(store.aggregates()) == 3


def test_part_numbers_follow_the_largest_stored_part(tmp_path: Path) -> None:
    db = tmp_path / "agent.db"
    with Store(db) as store:
        for k in range(3):
            store.add_aggregate(dataclasses.replace(make_aggregate(T0), count=10 + k))
    conn = sqlite3.connect(db)
    base = make_aggregate(T0).aggregate_id
    conn.execute("DELETE FROM aggregates WHERE aggregate_id = ?", (f"{base}:1",))
    conn.commit()
    conn.close()
    with Store(db) as store:
        # ids sharing a prefix with the interval's id are not its parts
        other = dataclasses.replace(make_aggregate(T0 * 10), count=5)
        assert other.aggregate_id.startswith(base)
        assert store.add_aggregate(other) is True
        assert store.add_aggregate(dataclasses.replace(make_aggregate(T0), count=99)) is True
    assert rows(db)[-2:] == [(other.aggregate_id, 5), (f"{base}:3", 99)]


def test_part_ids_match_the_wire_patterns() -> None:
    base = make_aggregate(T0).aggregate_id
    assert aggregate_part_id(base, 0) == base
    assert re.match(ID_PATTERN, base) and re.match(AGGREGATE_ID_PATTERN, base)
    for k in (1, 9, 10, 999_999):
        pid = aggregate_part_id(base, k)
        assert re.match(AGGREGATE_ID_PATTERN, pid) and not re.match(ID_PATTERN, pid)
        assert part_of(base, pid) == k
    for k in (-1, 1_000_000):
        with pytest.raises(ValueError, match="out of range"):
            aggregate_part_id(base, k)


def test_repeat_policy_decides_what_a_repeated_interval_is(tmp_path: Path) -> None:
    """A live source's second piece is new even with equal statistics (a tester lost one from a
    seeded simulator); a fast simulator's repeated interval is a copy; a recorded input's is a
    copy only with the same readings."""
    piece = make_aggregate(0)
    other = dataclasses.replace(piece, count=piece.count + 1)
    with Store(tmp_path / "live.db") as store:
        assert store.add_aggregate(piece, "part")
        assert store.add_aggregate(piece, "part")  # same statistics, still new readings
        assert store.add_aggregate(other, "part")
        ids = [a["aggregate_id"] for a in store.aggregates()]
    assert ids == [piece.aggregate_id, *(aggregate_part_id(piece.aggregate_id, k) for k in (1, 2))]
    with Store(tmp_path / "sim.db") as store:
        assert store.add_aggregate(piece, "ignore")
        assert not store.add_aggregate(other, "ignore")
        assert [a["count"] for a in store.aggregates()] == [piece.count]
    with Store(tmp_path / "replay.db") as store:
        assert store.add_aggregate(piece, "same_readings")
        assert not store.add_aggregate(piece, "same_readings")
        assert store.add_aggregate(other, "same_readings")
        assert len(store.aggregates()) == 2


def test_repeat_policy_by_source_kind() -> None:
    assert repeat_policy(SimulatorConfig(speed=1.0)) == "part"
    assert repeat_policy(SimulatorConfig()) == "ignore"  # the demo's 20x
    assert repeat_policy(SimulatorConfig(speed=0)) == "ignore"
    assert repeat_policy(SerialConfig(port="/dev/ttyUSB0", channels=["v"])) == "part"
    assert repeat_policy(ReplayConfig(path="x.csv")) == "same_readings"
    assert repeat_policy(CameraConfig(folder="frames")) == "same_readings"
    assert repeat_policy(CameraConfig(path="line1.avi")) == "same_readings"
    assert repeat_policy(CameraConfig(device=0)) == "part"


def _ulps(x: float, k: int) -> float:
    for _ in range(abs(k)):
        x = math.nextafter(x, math.inf if k > 0 else -math.inf)
    return x


def test_recorded_repeat_differing_only_in_the_last_bits_is_a_duplicate(tmp_path: Path) -> None:
    """The failure seen replaying a SKAB file twice: the same readings, summed in other blocks,
    gave a mean and std a few ULPs apart; that is the same aggregate, not a part."""
    first = dataclasses.replace(make_aggregate(T0), channels=(
        ChannelStats("p", 600, 0.0, 1.0, 0.0489578947368421, 0.2389013361384591),
        ChannelStats("t", 600, 79.1, 79.9, 79.48993461538461, 0.09671703351016174),
        ChannelStats("vib", 0, math.nan, math.nan, math.nan, math.nan),
    ))
    again = dataclasses.replace(first, max_score=7.0, windows=3, channels=(
        ChannelStats("p", 600, 0.0, 1.0, 0.048957894736842096, 0.2389013361384592),
        ChannelStats("t", 600, 79.1, 79.9, _ulps(79.48993461538461, -2),
                     _ulps(0.09671703351016174, 3)),
        ChannelStats("vib", 0, math.nan, math.nan, math.nan, math.nan),
    ))
    with Store(tmp_path / "agent.db") as store:
        assert store.add_aggregate(first, "same_readings") is True
        assert store.add_aggregate(again, "same_readings") is False
        assert [a["aggregate_id"] for a in store.aggregates()] == [first.aggregate_id]


def test_recorded_repeat_with_other_readings_is_still_a_part(tmp_path: Path) -> None:
    """Same count, min and max but a mean or std that really differs: other readings."""
    first = dataclasses.replace(make_aggregate(T0), channels=(
        ChannelStats("p", 600, 0.0, 1.0, 0.0489578947368421, 0.2389013361384591),
    ))
    # one reading of 600 moved by 1e-6 of the range moves the mean by 1.7e-9
    other_mean = dataclasses.replace(first, channels=(
        ChannelStats("p", 600, 0.0, 1.0, 0.0489578947368421 + 1e-6 / 600, 0.2389013361384591),
    ))
    other_std = dataclasses.replace(first, channels=(
        ChannelStats("p", 600, 0.0, 1.0, 0.0489578947368421, 0.2389013361384591 + 1e-9),
    ))
    other_max = dataclasses.replace(first, channels=(
        ChannelStats("p", 600, 0.0, _ulps(1.0, 1), 0.0489578947368421, 0.2389013361384591),
    ))
    with Store(tmp_path / "agent.db") as store:
        assert store.add_aggregate(first, "same_readings") is True
        for agg in (other_mean, other_std, other_max):
            assert store.add_aggregate(agg, "same_readings") is True
        assert store.add_aggregate(first, "same_readings") is False
        ids = [a["aggregate_id"] for a in store.aggregates()]
    assert ids == [first.aggregate_id, *(aggregate_part_id(first.aggregate_id, k)
                                         for k in (1, 2, 3))]


def test_the_same_readings_in_other_blocks_are_stored_once(tmp_path: Path) -> None:
    """The aggregator adds one partial sum per block, and block boundaries follow thread timing:
    the same readings in other blocks give other last bits, and still one aggregate."""
    values, ts = readings(T0, 120, seed=7)  # 60 s at 2 Hz: one interval
    stored = []
    for blocks in ([120], [1, 2, 3, 5, 8, 13, 21, 34, 33], [7] * 17 + [1]):
        agg = IntervalAggregator("gw1", "pump1", ("v", "i"), 60.0)
        a = 0
        for n in blocks:
            assert agg.add_readings(values[a:a + n], ts[a:a + n]) == []
            a += n
        stored += agg.flush()
    assert len({s.aggregate_id for s in stored}) == 1
    assert len({s.channels for s in stored}) > 1  # the last bits really differ
    with Store(tmp_path / "agent.db") as store:
        assert [store.add_aggregate(s, "same_readings") for s in stored] == [True, False, False]
