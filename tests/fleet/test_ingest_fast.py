"""The fast ingest path (one-call check of the body) against the per-record path, pure code.

Whatever the body, the fast path either declines (None: the slow path runs) or produces exactly
the rows and results of the slow path. Random valid batches must take the fast path; a single
bad value anywhere must make it decline.
"""

from __future__ import annotations

import datetime as dt
import json
import random
from typing import Any

import pytest

from fleet.api.body import parse_json
from fleet.checker import checker
from fleet.ingest import Envelope, check_batch, prepare, prepare_checked
from tests.fleet.wire import T0, aggregate, alert, batch

NOW = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)


def _slow(data: bytes, device: str = "gw1") -> tuple[dict[str, Any], dict[int, Any]]:
    env = Envelope.model_validate(parse_json(data))
    p = prepare(device, env.records, NOW)
    return p.rows, {i: r.model_dump() for i, r in p.results.items()} | {
        i: ("repeat", j) for i, j in p.repeats.items()
    }


def _fast(data: bytes, device: str = "gw1") -> tuple[dict[str, Any], dict[int, Any]] | None:
    checked = check_batch(data)
    if checked is None:
        return None
    p = prepare_checked(device, checked["records"], NOW)
    return p.rows, {i: r.model_dump() for i, r in p.results.items()} | {
        i: ("repeat", j) for i, j in p.repeats.items()
    }


def _random_records(rng: random.Random, n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(n):
        if rng.random() < 0.1:
            out.append(alert("gw1", seq=i + 1, score=rng.uniform(-5, 5)))
            continue
        channels = [
            {"channel": f"c{c}", "count": rng.randint(0, 10**15),
             "min": rng.choice([None, rng.uniform(-1e9, 1e9), rng.randint(-5, 5)]),
             "max": rng.uniform(-1, 1), "mean": None, "std": rng.uniform(0, 3)}
            for c in range(rng.randint(0, 4))
        ]
        out.append(aggregate("gw1", stream=rng.choice(["pump1", "s2"]), t=T0 + 60 * i,
                             channels=channels, max_score=rng.choice([None, rng.random()]),
                             count=rng.randint(0, 10**6)))
    if n > 3:
        out.append(out[1])  # an in-batch repeat
        out.append(aggregate("gw2", t=T0))  # another device's record: rejected on both paths
    return out


@pytest.mark.parametrize("seed", range(5))
def test_random_valid_batches_take_the_fast_path_with_the_same_outcome(seed: int) -> None:
    rng = random.Random(seed)
    data = json.dumps(batch("gw1", _random_records(rng, 60))).encode()
    fast = _fast(data)
    assert fast is not None
    assert fast == _slow(data)


BAD_VALUES: list[tuple[str, Any]] = [
    ("count", -1), ("count", "5"), ("count", 2**63), ("count", 1.5), ("max_score", float("nan")),
    ("max_score", float("inf")), ("max_score", 2**64), ("interval_s", 0), ("stream", "a b"),
    ("windows", None), ("channels", [{"channel": "a\x00b", "count": 1, "min": 0, "max": 0,
                                      "mean": 0, "std": 0}]),
    ("extra", 1),
]


@pytest.mark.parametrize(("key", "value"), BAD_VALUES)
def test_one_bad_value_makes_the_fast_path_decline(key: str, value: Any) -> None:
    records = [aggregate("gw1", t=T0), aggregate("gw1", t=T0 + 60, **{key: value})]
    data = json.dumps(batch("gw1", records), allow_nan=True).encode()
    assert _fast(data) is None
    rows, results = _slow(data)
    if (key, value) == ("count", "5"):  # the lenient path coerces it; strict mode declines
        assert [row["count"] for _, row in rows["aggregate"]] == [600, 5]
        return
    assert [i for i, _ in rows["aggregate"]] == [0] and results[1]["status"] == "rejected"


def test_bad_envelopes_decline() -> None:
    for doc in (batch("gw1", [], sent_at="soon"), batch("gw1", [], extra=1),
                batch("gw1", [], backlog={"alerts": 2**63, "aggregates": 0}), [1, 2]):
        assert check_batch(json.dumps(doc).encode()) is None
    assert check_batch(b"{not json") is None


def test_checker_refuses_models_with_validators() -> None:
    from pydantic import BaseModel, field_validator  # noqa: PLC0415

    class M(BaseModel):
        x: int

        @field_validator("x")
        @classmethod
        def _v(cls, v: int) -> int:
            return v

    with pytest.raises(ValueError, match="cannot mirror"):
        checker(M)
