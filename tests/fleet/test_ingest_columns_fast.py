"""Schema-2 columns: the fast path (one-call check, columnar rows) against the slow path (each
entry validated as the record it stands for), pure code. Valid batches take the fast path with
the same outcome; one bad value anywhere makes it decline, and the slow path rejects that index.
"""

from __future__ import annotations

import datetime as dt
import json
import random
from typing import Any

import pytest

from fleet.api.body import parse_json
from fleet.ingest import (
    Envelope,
    check_batch,
    column_records,
    prepare,
    prepare_checked,
    prepare_columns,
)
from tests.fleet.wire import T0, aggregate, alert, batch2

NOW = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
Outcome = tuple[dict[str, dict[str, Any]], dict[int, Any]]


def _slow(data: bytes, device: str = "gw1") -> Outcome:
    env = Envelope.model_validate(parse_json(data))
    extra = [] if env.aggregates is None else column_records(device, env.aggregates)
    p = prepare(device, env.records + extra, NOW)
    rows = {row["id"]: {k: v for k, v in row.items() if k != "received_at"}
            for items in p.rows.values() for _, row in items}
    results = {i: r.model_dump() for i, r in p.results.items()} | {
        i: ("repeat", j) for i, j in p.repeats.items()}
    return rows, results


def _fast(data: bytes, device: str = "gw1") -> Outcome | None:
    checked = check_batch(data)
    if checked is None:
        return None
    p = prepare_checked(device, checked["records"], NOW)
    if checked["aggregates"] is not None:
        prepare_columns(device, checked["aggregates"], len(checked["records"]), p)
    rows = {row["id"]: {k: v for k, v in row.items() if k != "received_at"}
            for items in p.rows.values() for _, row in items}
    c = p.columns
    if c is not None:
        for i, rid in enumerate(c.ids):
            rows[rid] = {
                "id": rid, "device_id": device, "stream": c.streams[i],
                "interval_start": c.interval_start[i], "interval_s": c.interval_s[i],
                "count": c.count[i], "channels": json.loads(c.channels[i]),
                "max_score": c.max_score[i], "windows": c.windows[i],
                "alert_count": c.alert_count[i],
            }
    results = {i: r.model_dump() for i, r in p.results.items()} | {
        i: ("repeat", j) for i, j in p.repeats.items()}
    return rows, results


def _random_batch(rng: random.Random, n: int) -> dict[str, Any]:
    aggs = []
    for i in range(n):
        channels = [
            {"channel": f"c{c}", "count": rng.randint(0, 10**15),
             "min": rng.choice([None, rng.uniform(-1e9, 1e9), rng.randint(-5, 5)]),
             "max": rng.uniform(-1, 1), "mean": None, "std": rng.uniform(0, 3)}
            for c in range(rng.randint(0, 4))
        ]
        aggs.append(aggregate("gw1", stream=rng.choice(["pump1", "s2"]), t=T0 + 60 * i,
                              channels=channels, max_score=rng.choice([None, rng.random(), 2]),
                              count=rng.randint(0, 10**6), interval_s=rng.choice([60, 0.5])))
    records = [alert("gw1", seq=1), aggs[0]]  # aggs[0] again in the columns: a repeat
    aggs += [aggs[1], aggregate("gw2", t=T0)]  # in-column repeat; another device's id
    return batch2("gw1", records, aggs)


@pytest.mark.parametrize("seed", range(5))
def test_random_valid_columns_take_the_fast_path_with_the_same_outcome(seed: int) -> None:
    data = json.dumps(_random_batch(random.Random(seed), 40)).encode()
    fast = _fast(data)
    assert fast is not None
    slow = _slow(data)
    assert fast == slow
    _rows, results = fast
    n_records = 2
    assert results[n_records] == ("repeat", 1)  # aggs[0]: first sent as record 1
    assert results[n_records + 40] == ("repeat", n_records + 1)
    assert results[n_records + 41]["status"] == "rejected"


BAD: list[tuple[str, Any]] = [
    ("count", -1), ("count", 2**63), ("count", 1.5), ("max_score", 2**64),
    ("interval_s", 0), ("streams", "a b"), ("windows", None), ("ids", "gw1:pump1"),
    ("interval_start", -1.0), ("channels", "[1]"), ("channels", "{}"), ("channels", "nope"),
    ("channels", '[{"channel":"a\\u0000b","count":1,"min":0,"max":0,"mean":0,"std":0}]'),
    ("channels", '[{"channel":"a","count":1,"min":NaN,"max":0,"mean":0,"std":0}]'),
    ("channels", '[{"channel":"a","count":1,"min":1e999,"max":0,"mean":0,"std":0}]'),
    ("channels", '[{"channel":"a","count":1,"min":0,"max":0,"mean":0,"std":-1}]'),
    ("channels", '[],[]'), ("channels", 5),
]


@pytest.mark.parametrize(("column", "value"), BAD)
def test_one_bad_entry_declines_the_fast_path_and_is_rejected_alone(
    column: str, value: Any
) -> None:
    aggs = [aggregate("gw1", t=T0 + 60 * i) for i in range(4)]
    doc = batch2("gw1", [alert("gw1", seq=1)], aggs)
    doc["aggregates"][column][2] = value
    data = json.dumps(doc).encode()
    assert _fast(data) is None
    rows, results = _slow(data)
    assert set(results) == {3}
    assert results[3]["status"] == "rejected" and results[3]["reason"]
    assert len(rows) == 4  # the alert and the 3 other aggregates


def test_a_lenient_value_declines_the_fast_path_and_is_coerced_as_in_schema_1() -> None:
    doc = batch2("gw1", [], [aggregate("gw1", t=T0), aggregate("gw1", t=T0 + 60)])
    doc["aggregates"]["count"][1] = "5"
    data = json.dumps(doc).encode()
    assert _fast(data) is None
    rows, results = _slow(data)
    assert results == {}
    assert rows[f"gw1:pump1:{int((T0 + 60) * 1000)}"]["count"] == 5
