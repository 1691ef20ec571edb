"""Sparkplug B in: births of device ids a stream does not map cost no memory (a publisher that
makes up device ids cannot grow the agent), and the stream's own device still maps."""

from __future__ import annotations

import time
import tracemalloc
from types import SimpleNamespace

import pytest

pytest.importorskip("google.protobuf")

from agent.errors import RecordError
from agent.records import Reading
from agent.sources import sparkplug as sp
from agent.sources.mqtt_in import MqttInSource
from agent.sources.mqtt_in_config import MqttInConfig

TOPIC = "spBv1.0/plant1/{kind}/line3/{device}"


def _birth(n_metrics: int = 20) -> bytes:
    msg = sp.Payload(timestamp=int(time.time() * 1000), seq=1)
    for a in range(n_metrics):
        m = msg.metrics.add(name=f"Inputs/Metric{a:03d}", alias=a + 1, datatype=10)
        m.double_value = float(a)
    return bytes(msg.SerializeToString())


def _data(alias: int, value: float, seq: int) -> bytes:
    msg = sp.Payload(timestamp=int(time.time() * 1000), seq=seq)
    m = msg.metrics.add(alias=alias, datatype=10)
    m.double_value = value
    return bytes(msg.SerializeToString())


def _source() -> tuple[MqttInSource, list[Reading], list[RecordError]]:
    config = MqttInConfig.model_validate({
        "format": "sparkplug_b", "group_id": "plant1", "edge_node_id": "line3",
        "device_id": "pump1", "metrics": {"p": "Inputs/Metric002"}, "request_rebirth": False})
    return MqttInSource(config, "s"), [], []


def _feed(source: MqttInSource, out: list[Reading], rejected: list[RecordError], kind: str,
          device: str, payload: bytes) -> None:
    msg = SimpleNamespace(topic=TOPIC.format(kind=kind, device=device), payload=payload)
    source._on_message(None, msg, out.append, rejected.append)


def test_made_up_device_births_do_not_grow_memory() -> None:
    source, out, rejected = _source()
    birth = _birth()
    _feed(source, out, rejected, "DBIRTH", "pump1", birth)
    for k in range(200):  # warm-up: protobuf and dict internals settle
        _feed(source, out, rejected, "DBIRTH", f"warm{k}", birth)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for k in range(20_000):
            _feed(source, out, rejected, "DBIRTH", f"fake-{k:05d}", birth)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # 20,000 tables of 20 aliases each took about 40 MB when every device's table was kept
    assert grown < 1_000_000, f"{grown} bytes kept for births of devices the stream ignores"
    assert rejected == []
    _feed(source, out, rejected, "DDATA", "pump1", _data(3, 7.5, 2))  # alias 3 = Metric002
    assert [r.values.tolist() for r in out][-1] == [7.5]


def test_the_streams_own_device_maps_after_many_others() -> None:
    source, out, rejected = _source()
    for k in range(1_000):
        _feed(source, out, rejected, "DBIRTH", f"other{k}", _birth(3))
    _feed(source, out, rejected, "DDATA", "pump1", _data(3, 1.0, 2))
    assert source.events.get("data_before_birth") == 1 and out == []
    _feed(source, out, rejected, "DBIRTH", "pump1", _birth(3))
    _feed(source, out, rejected, "DDATA", "pump1", _data(3, 4.0, 4))
    assert [r.values.tolist() for r in out] == [[2.0], [4.0]]
