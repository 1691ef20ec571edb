"""Sparkplug B in, from an edge node whose payloads are written byte by byte from the
specification's field numbers (tests.integration.spb_wire), not with the agent's schema: NDATA
(the node's own metrics, no device), DDATA, the agent's rebirth request read back the same way.

A field number that the agent's descriptor (agent/sparkplug_b.py) got wrong would show here as
a missing or wrong value: the publisher and the agent no longer share the mistake.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.conftest import MosquittoBroker
from tests.integration import spb_wire as w
from tests.integration.test_mqtt_in import Publisher, Running
from tests.integration.test_serial_pty import wait_for

pytestmark = pytest.mark.integration

NODE = "spBv1.0/plant1/{kind}/line3"
CHANNELS = {"p": "Node/Pressure", "t": "Node/Temp", "c": "Node/Count", "on": "Node/Running",
            "e": "Node/Energy"}


@pytest.fixture
def pub(mosquitto: MosquittoBroker) -> Iterator[Publisher]:
    p = Publisher(mosquitto.port, "wire-node")
    p.client.subscribe("spBv1.0/plant1/NCMD/line3", qos=0)
    yield p
    p.close()


def now_ms() -> int:
    return int(time.time() * 1000)


def node_birth(pub: Publisher, bd_seq: int = 0) -> None:
    pub.send(NODE.format(kind="NBIRTH"), w.payload(now_ms(), 0, [
        w.Metric(w.UINT64, bd_seq, name="bdSeq"),
        w.Metric(w.DOUBLE, 1.5, name="Node/Pressure", alias=1),
        w.Metric(w.FLOAT, 20.25, name="Node/Temp", alias=2),
        w.Metric(w.INT32, -7, name="Node/Count", alias=3),
        w.Metric(w.BOOLEAN, True, name="Node/Running", alias=4),
        w.Metric(w.INT64, -(2**40), name="Node/Energy", alias=5),
        w.Metric(w.STRING, "P-101", name="Node/Label", alias=6),  # not mapped: ignored
    ]))


def test_ndata_node_metrics_by_alias(mosquitto: MosquittoBroker, pub: Publisher) -> None:
    run = Running(mosquitto.port, format="sparkplug_b", group_id="plant1", edge_node_id="line3",
                  metrics=CHANNELS)
    try:
        assert wait_for(run.connected, timeout=10)
        node_birth(pub)
        assert wait_for(lambda: run.values() == [[1.5, 20.25, -7.0, 1.0, -(2.0**40)]]), \
            run.values()
        ts = now_ms() - 5_000
        pub.send(NODE.format(kind="NDATA"), w.payload(ts, 1, [  # aliases only, as in real NDATA
            w.Metric(w.DOUBLE, 2.5, alias=1, timestamp=ts),
            w.Metric(w.INT32, 42, alias=3, timestamp=ts),
            w.Metric(w.BOOLEAN, False, alias=4, timestamp=ts),
        ]))
        assert wait_for(lambda: [2.5, 20.25, 42.0, 0.0, -(2.0**40)] in run.values()), \
            run.values()
        assert run.readings[-1].ts == pytest.approx(ts / 1000)
        # data for a device of this node is not the node's own metrics
        pub.send(f"{NODE.format(kind='DDATA')}/pump1", w.payload(now_ms(), 2, [
            w.Metric(w.DOUBLE, 99.0, alias=1)]))
        pub.send(NODE.format(kind="NDATA"), w.payload(now_ms(), 3, [
            w.Metric(w.FLOAT, 21.5, alias=2)]))
        assert wait_for(lambda: [2.5, 21.5, 42.0, 0.0, -(2.0**40)] in run.values())
        assert not any(v[0] == 99.0 for v in run.values())
        assert run.source.events.get("seq_gap", 0) == 0  # seq 2 went to the device: no gap
        # an alias the birth never announced: rejected, and a rebirth asked for
        pub.send(NODE.format(kind="NDATA"), w.payload(now_ms(), 4, [
            w.Metric(w.DOUBLE, 5.0, alias=77)]))
        assert wait_for(lambda: run.rejected("unknown_alias") >= 1)
        assert wait_for(lambda: any(t.endswith("/NCMD/line3") for t, _ in pub.commands))
        (cmd,) = w.metrics_of(pub.commands[0][1])
        assert cmd[1] == b"Node Control/Rebirth" and cmd[4] == w.BOOLEAN and cmd[14] == 1
        assert run.sup.outage is None
    finally:
        run.close()


def test_ddata_device_metrics_by_alias(mosquitto: MosquittoBroker, pub: Publisher) -> None:
    run = Running(mosquitto.port, format="sparkplug_b", group_id="plant1", edge_node_id="line3",
                  device_id="pump1", metrics={"p": "Inputs/Pressure", "f": "Inputs/Flow"})
    device = NODE.format(kind="{kind}") + "/pump1"
    try:
        assert wait_for(run.connected, timeout=10)
        pub.send(NODE.format(kind="NBIRTH"), w.payload(now_ms(), 0, [
            w.Metric(w.UINT64, 0, name="bdSeq")]))
        pub.send(device.format(kind="DBIRTH"), w.payload(now_ms(), 1, [
            w.Metric(w.DOUBLE, 1.0, name="Inputs/Pressure", alias=1),
            w.Metric(w.FLOAT, 10.0, name="Inputs/Flow", alias=2)]))
        assert wait_for(lambda: run.values() == [[1.0, 10.0]]), run.values()
        pub.send(device.format(kind="DDATA"), w.payload(now_ms(), 2, [
            w.Metric(w.FLOAT, 12.5, alias=2)]))
        assert wait_for(lambda: [1.0, 12.5] in run.values())
        # another device of the node: its messages advance seq, its death is not pump1's
        other = NODE.format(kind="{kind}") + "/pump2"
        pub.send(other.format(kind="DBIRTH"), w.payload(now_ms(), 3, [
            w.Metric(w.DOUBLE, 50.0, name="Inputs/Pressure", alias=1)]))
        pub.send(other.format(kind="DDATA"), w.payload(now_ms(), 4, [
            w.Metric(w.DOUBLE, 51.0, alias=1)]))
        pub.send(other.format(kind="DDEATH"), w.payload(now_ms(), 5, []))
        pub.send(device.format(kind="DDATA"), w.payload(now_ms(), 6, [
            w.Metric(w.DOUBLE, 3.0, alias=1)]))
        assert wait_for(lambda: [3.0, 12.5] in run.values()), run.values()
        assert not any(v[0] in (50.0, 51.0) for v in run.values())
        assert run.source.events.get("seq_gap", 0) == 0  # 0..6 in order over both devices
        assert "rebirth_requested" not in run.source.events
        pub.send(device.format(kind="DDEATH"), w.payload(now_ms(), 7, []))
        pub.send(device.format(kind="DDATA"), w.payload(now_ms(), 8, [
            w.Metric(w.DOUBLE, 4.0, alias=1)]))  # flow unknown since pump1's death
        time.sleep(1.0)
        assert not any(v[0] == 4.0 for v in run.values())
    finally:
        run.close()
