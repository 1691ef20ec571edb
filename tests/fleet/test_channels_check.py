"""The msgspec check of channel texts (fleet/channels.py) against the pydantic twin of the
schema (``fleet.checker``, strict and storable): it may only accept what the twin accepts, and
accepts the ordinary texts the twin accepts (else the fast path would be lost, not correctness).
"""

from __future__ import annotations

import json
import random
from typing import Any

import msgspec
import pytest
from pydantic import Json, ValidationError

from cloud_sync.protocol import Channels, ChannelStatsBody
from fleet.channels import ChannelStats, channels_ok
from fleet.checker import checker

_TWIN = checker(list[Json[Channels]], storable=True)


def _twin_ok(text: str) -> bool:
    try:
        _TWIN.validate_python([text], strict=True)
    except ValidationError:
        return False
    return True


def _channel(rng: random.Random) -> dict[str, Any]:
    def stat() -> Any:
        return rng.choice([None, rng.uniform(-1e12, 1e12), rng.randint(-10**15, 10**15), 0.0,
                           -0.0, 1e-300, 5e-324])

    return {"channel": rng.choice(["a", "vib x", "ünï\"cödé\\", "p" * 128]), "count":
            rng.randint(0, 2**63 - 1), "min": stat(), "max": stat(), "mean": stat(),
            "std": rng.choice([None, 0.0, rng.uniform(0, 1e9), rng.randint(0, 10**9)])}


def test_the_struct_mirrors_the_wire_model() -> None:
    fields = ChannelStatsBody.model_fields
    assert ChannelStats.__struct_fields__ == tuple(fields)
    info = msgspec.structs.fields(ChannelStats)
    assert all(f.required for f in info) and all(f.is_required() for f in fields.values())


def test_random_valid_texts_pass_both() -> None:
    rng = random.Random(4)
    for _ in range(300):
        text = json.dumps([_channel(rng) for _ in range(rng.randint(0, 6))],
                          separators=rng.choice([(",", ":"), (", ", ": ")]),
                          ensure_ascii=rng.random() < 0.5)
        assert _twin_ok(text), text
        assert channels_ok([text]), text


TRICKY = ['NaN', 'Infinity', '-Infinity', '1e400', '-1e400', str(2**63), str(-(2**63) - 1),
          '9223372036854775808.0', '1e19', '-1', '"5"', 'true', 'false', 'null', '1.5', '[]',
          '{}', '""', '"' + "x" * 129 + '"', '"\\ud800"', '"\\udc00x"', '0', '-0.0', '1E3',
          '"a\\u0001"', '"\\u00e9"']
KEYS = ["channel", "count", "min", "max", "mean", "std"]


def _mutations(rng: random.Random) -> list[str]:
    base = {"channel": "a", "count": 1, "min": 0.5, "max": 1.0, "mean": 0.75, "std": 0.1}
    out: list[str] = []
    for key in KEYS:
        for value in TRICKY:
            parts = [f'"{k}":{value if k == key else json.dumps(v)}' for k, v in base.items()]
            out.append("[{" + ",".join(parts) + "}]")
    good = json.dumps([base], separators=(",", ":"))
    out += [good + " x", good + "]", "[" + good, good.replace('"std":0.1', ""),
            good.replace("}", ',"extra":1}'), good.replace("}", ',"channel":"b"}'),
            "[" + ",".join([json.dumps(base)] * 1025) + "]", "null", "5", '"[]"', "",
            good[:-1] + ",[]]", " " + good + "\n", good.replace('"a"', '"a\\/b"')]
    for _ in range(300):  # random byte edits
        chars = list(good)
        for _ in range(rng.randint(1, 3)):
            chars[rng.randrange(len(chars))] = rng.choice('{}[],:"\\0123456789.eE-+ntrufalsNI ')
        out.append("".join(chars))
    return out


@pytest.mark.parametrize("seed", range(3))
def test_msgspec_accepts_only_what_the_twin_accepts(seed: int) -> None:
    for text in _mutations(random.Random(seed)):
        if channels_ok([text]):
            assert _twin_ok(text), text


def test_known_bad_texts_are_refused() -> None:
    base = '[{"channel":"a","count":1,"min":%s,"max":1,"mean":1,"std":0}]'
    for value in ("NaN", "Infinity", "1e400", "9.3e18", '"1"', "true"):
        assert not channels_ok([base % value]), value
    assert not channels_ok(['[{"channel":"\\ud800","count":1,"min":1,"max":1,"mean":1,"std":0}]'])
    assert not channels_ok(['[]', '[]]'])  # one bad text fails the whole list
