"""MQTT in with ``expected_interval_s``: readings counted missed from the payload timestamps."""

from __future__ import annotations

import json
from types import SimpleNamespace

from prometheus_client import CollectorRegistry

from agent.errors import RecordError
from agent.metrics import Metrics
from agent.records import Reading
from agent.sources.mqtt_in import MqttInSource
from agent.sources.mqtt_in_config import MqttInConfig


def _feed(stamps: list[float | str], **extra: object) -> tuple[MqttInSource, list[Reading],
                                                              list[RecordError], Metrics]:
    config = MqttInConfig.model_validate({"format": "json", "topics": ["t"],
                                          "fields": {"p": "p"}, "timestamp_field": "ts",
                                          "expected_interval_s": 2.0, **extra})
    source = MqttInSource(config, "s")
    metrics = Metrics(CollectorRegistry())
    source.set_metrics(metrics)
    out: list[Reading] = []
    rejected: list[RecordError] = []
    for ts in stamps:
        msg = SimpleNamespace(topic="t", payload=json.dumps({"p": 1.0, "ts": ts}).encode())
        source._on_message(None, msg, out.append, rejected.append)
    return source, out, rejected, metrics


def test_gaps_count_the_readings_between() -> None:
    # 2 s cadence: 102 -> 106 skips one (104); 106 -> 108.9 (1.45 intervals) is jitter, no
    # gap; 108.9 -> 116.9 skips three
    source, out, _, metrics = _feed([100.0, 102.0, 106.0, 108.9, 116.9])
    assert len(out) == 5
    assert source.missed == 1 + 3
    assert metrics.registry.get_sample_value(
        "edge_agent_polls_missed_total", {"stream": "s", "reason": "gap"}) == 4


def test_repeats_and_late_messages_move_nothing_back() -> None:
    # QoS 1 may deliver 104 twice; a late 102 after 104 must not make 104 -> 106 look like more
    source, out, _, _ = _feed([100.0, 102.0, 104.0, 104.0, 102.0, 106.0])
    assert len(out) == 6
    assert source.missed == 0


def test_a_value_out_of_range_arrived_and_is_no_gap() -> None:
    # rejected for its value, yet its timestamp says it came: 100, (102 rejected), 104
    source, out, rejected, _ = _feed([100.0, 102.0, 104.0], max={"p": 0.5})
    assert out == [] and [e.reason for e in rejected] == ["out_of_range"] * 3
    assert source.missed == 0
