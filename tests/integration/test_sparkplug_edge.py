"""The Sparkplug B edge node against a real mosquitto and a protobuf-decoding Sparkplug host.

The StateBoard is fed directly (the pipeline's feed is another component). The connection is
killed through :class:`tests.integration.mqtt_proxy.MqttProxy` (``cut``: both sockets reset,
no DISCONNECT), so the broker publishes the node's will. Every wait polls with a deadline.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from agent.metrics import Metrics
from agent.publish.mqtt_config import MqttConfig, SparkplugConfig
from agent.publish.sparkplug_edge import BDSEQ_FILE, SparkplugEdgeNode
from agent.publish.stream_state import StateBoard, StreamState
from agent.sparkplug_b import BOOLEAN, DOUBLE, INT64, STRING, Payload, rebirth_payload
from tests.conftest import MosquittoBroker
from tests.integration.mqtt_proxy import MqttProxy
from tests.integration.sparkplug_host import SparkplugHost, SpMsg, wait_until

pytestmark = pytest.mark.integration

DEVICE = "gw1"
GROUP = "plant1"
NCMD = f"spBv1.0/{GROUP}/NCMD/{DEVICE}"
METRICS = {"Anomaly/Score": DOUBLE, "Anomaly/Threshold": DOUBLE, "Anomaly/Active": BOOLEAN,
           "Status": STRING, "Model/Version": INT64}


def state(stream: str, status: str = "normal", score: float | None = 0.5,
          threshold: float | None = 1.0, version: int = 3) -> StreamState:
    return StreamState(stream, "sensor", status, score, threshold, "ae", version,  # type: ignore[arg-type]
                       f"{DEVICE}:{stream}:1" if status == "anomalous" else None, 1.7e9)


@pytest.fixture
def hosts(mosquitto: MosquittoBroker) -> Iterator[Callable[[], SparkplugHost]]:
    made: list[SparkplugHost] = []

    def make() -> SparkplugHost:
        made.append(SparkplugHost(mosquitto))
        return made[-1]

    yield make
    for h in made:
        h.close()


@pytest.fixture
def nodes() -> Iterator[list[SparkplugEdgeNode]]:
    made: list[SparkplugEdgeNode] = []
    yield made
    for n in made:
        n.stop()


def make_node(port: int, state_dir: Path, made: list[SparkplugEdgeNode], board: StateBoard,
              registry: CollectorRegistry, streams: tuple[str, ...] = ("pump1", "pump2"),
              protocol: str = "5", **sparkplug: Any) -> SparkplugEdgeNode:
    config = MqttConfig(host="127.0.0.1", port=port, keepalive_s=5, reconnect_min_s=1,
                        reconnect_max_s=1, protocol=protocol,  # type: ignore[arg-type]
                        sparkplug=SparkplugConfig(enabled=True, group_id=GROUP,
                                                  **{"min_data_interval_s": 0.0, **sparkplug}))
    node = SparkplugEdgeNode(config, DEVICE, list(streams), Metrics(registry), state_dir,
                             logger=logging.getLogger("test.sparkplug"))
    node.attach(board)
    made.append(node)
    node.start()
    return node


def births(host: SparkplugHost, n_before: int = 0) -> tuple[SpMsg, list[SpMsg]]:
    """The NBIRTH after the first ``n_before`` messages and the DBIRTHs after it."""
    msgs = host.messages()[n_before:]
    i = next(k for k, m in enumerate(msgs) if m.verb == "NBIRTH")
    return msgs[i], [m for m in msgs[i + 1:] if m.verb == "DBIRTH"]


def check_dbirth(msg: SpMsg) -> set[int]:
    assert msg.qos == 0 and not msg.retain
    assert {m.name for m in msg.payload.metrics} == set(METRICS)
    for m in msg.payload.metrics:
        assert m.datatype == METRICS[m.name], m.name
        assert m.HasField("alias") and m.HasField("timestamp")
    return {int(m.alias) for m in msg.payload.metrics}


def test_births_data_and_ndeath_as_the_will(
    mosquitto: MosquittoBroker, tmp_path: Path, hosts: Callable[[], SparkplugHost],
    nodes: list[SparkplugEdgeNode],
) -> None:
    host = hosts()
    proxy = MqttProxy((mosquitto.host, mosquitto.port))
    board = StateBoard()
    board.update(state("pump1"))
    registry = CollectorRegistry()
    make_node(proxy.port, tmp_path, nodes, board, registry)
    wait_until(lambda: len(host.messages("DBIRTH")) == 2, 20, "NBIRTH and 2 DBIRTHs",
               lambda: str(host.verbs()))

    nbirth, dbirths = births(host)
    assert nbirth.topic == f"spBv1.0/{GROUP}/NBIRTH/{DEVICE}"
    assert nbirth.qos == 0 and not nbirth.retain
    assert nbirth.payload.seq == 0 and nbirth.payload.timestamp > 0
    assert nbirth.value("bdSeq") == 0  # a fresh state directory: the first session
    rebirth = nbirth.metric("Node Control/Rebirth")
    assert rebirth.datatype == BOOLEAN and rebirth.boolean_value is False
    assert [m.device for m in dbirths] == ["pump1", "pump2"]
    assert [m.payload.seq for m in dbirths] == [1, 2]
    aliases = [check_dbirth(m) for m in dbirths]
    assert not aliases[0] & aliases[1] and int(rebirth.alias) not in aliases[0] | aliases[1]
    assert dbirths[0].value("Anomaly/Score") == 0.5
    assert dbirths[0].value("Status") == "normal"
    assert dbirths[0].value("Model/Version") == 3.0
    assert dbirths[1].metric("Anomaly/Score").is_null  # no state yet

    board.update(state("pump1", "anomalous", score=2.5))
    wait_until(lambda: host.messages("DDATA", "pump1"), 10, "DDATA of pump1")
    ddata = host.messages("DDATA", "pump1")[0]
    assert ddata.payload.seq == 3 and ddata.qos == 0
    by_alias = {int(m.alias): m for m in ddata.payload.metrics}
    assert all(not m.name and not m.datatype for m in ddata.payload.metrics)  # alias only
    born = {int(m.alias): m.name for m in dbirths[0].payload.metrics}
    changed = {born[a]: m for a, m in by_alias.items()}
    assert set(changed) == {"Anomaly/Score", "Anomaly/Active", "Status"}
    assert changed["Anomaly/Score"].double_value == 2.5
    assert changed["Anomaly/Active"].boolean_value is True
    assert changed["Status"].string_value == "anomalous"

    before = len(host.messages())
    proxy.cut()  # no DISCONNECT: the broker publishes the will
    wait_until(lambda: host.messages("NDEATH"), 20, "the NDEATH will")
    ndeath = host.messages("NDEATH")[0]
    assert [m.name for m in ndeath.payload.metrics] == ["bdSeq"]
    assert ndeath.value("bdSeq") == nbirth.value("bdSeq")
    assert not ndeath.payload.HasField("seq")
    wait_until(lambda: len(host.messages("NBIRTH")) == 2, 30, "the NBIRTH after reconnecting")
    again, dbirths = births(host, before)
    assert again.value("bdSeq") == 1 and again.payload.seq == 0
    wait_until(lambda: len(births(host, before)[1]) == 2, 10, "DBIRTHs after reconnecting")
    assert births(host, before)[1][0].value("Status") == "anomalous"  # the present state
    assert (tmp_path / BDSEQ_FILE).is_file()
    proxy.close()


def test_rebirth_on_ncmd_by_name_or_alias_and_bad_commands_are_counted(
    mosquitto: MosquittoBroker, tmp_path: Path, hosts: Callable[[], SparkplugHost],
    nodes: list[SparkplugEdgeNode],
) -> None:
    host = hosts()
    registry = CollectorRegistry()
    board = StateBoard()
    make_node(mosquitto.port, tmp_path, nodes, board, registry)
    wait_until(lambda: len(host.messages("DBIRTH")) == 2, 20, "first births")
    first, _ = births(host)

    host.send(NCMD, b"\xff\xfe not protobuf")
    host.send(NCMD, rebirth_payload(1_700_000_000_000))  # by name
    wait_until(lambda: len(host.messages("NBIRTH")) == 2, 10, "rebirth after NCMD (name)")
    wait_until(lambda: len(host.messages("DBIRTH")) == 4, 10, "DBIRTHs of the rebirth")
    second = host.messages("NBIRTH")[1]
    assert second.value("bdSeq") == first.value("bdSeq")  # same MQTT session
    assert second.payload.seq == 0

    by_alias = Payload(timestamp=1_700_000_000_000)
    m = by_alias.metrics.add(alias=int(first.metric("Node Control/Rebirth").alias),
                             timestamp=1_700_000_000_000)
    m.boolean_value = True
    host.send(NCMD, bytes(by_alias.SerializeToString()))
    wait_until(lambda: len(host.messages("NBIRTH")) == 3, 10, "rebirth after NCMD (alias)")

    def count(result: str) -> float:
        v = registry.get_sample_value("edge_agent_sparkplug_commands_total", {"result": result})
        return v or 0.0

    assert count("rejected") == 1 and count("rebirth") == 2


def test_ddeath_on_removal_ndeath_on_stop_and_bdseq_survives_a_restart(
    mosquitto: MosquittoBroker, tmp_path: Path, hosts: Callable[[], SparkplugHost],
    nodes: list[SparkplugEdgeNode],
) -> None:
    host = hosts()
    board = StateBoard()
    board.update(state("pump2"))
    node = make_node(mosquitto.port, tmp_path, nodes, board, CollectorRegistry())
    wait_until(lambda: len(host.messages("DBIRTH")) == 2, 20, "first births")
    board.remove("pump2")
    wait_until(lambda: host.messages("DDEATH", "pump2"), 10, "DDEATH of pump2")
    assert host.messages("DDEATH", "pump2")[0].payload.seq == 3

    node.stop()  # a clean stop publishes the NDEATH itself
    wait_until(lambda: host.messages("NDEATH"), 10, "NDEATH on stop")
    assert host.messages("NDEATH")[0].value("bdSeq") == 0

    make_node(mosquitto.port, tmp_path, nodes, StateBoard(), CollectorRegistry())
    wait_until(lambda: len(host.messages("NBIRTH")) == 2, 20, "NBIRTH of the restarted node")
    assert host.messages("NBIRTH")[1].value("bdSeq") == 1


def test_score_only_changes_wait_for_the_data_interval(
    mosquitto: MosquittoBroker, tmp_path: Path, hosts: Callable[[], SparkplugHost],
    nodes: list[SparkplugEdgeNode],
) -> None:
    host = hosts()
    board = StateBoard()
    board.update(state("pump1"))
    make_node(mosquitto.port, tmp_path, nodes, board, CollectorRegistry(), streams=("pump1",),
              min_data_interval_s=3600.0)
    wait_until(lambda: host.messages("DBIRTH"), 20, "DBIRTH")
    board.update(state("pump1", score=0.7))  # held back: only the score changed
    board.update(state("pump1", score=0.8, threshold=1.2))  # threshold: at once
    wait_until(lambda: host.messages("DDATA"), 10, "DDATA")
    ddata = host.messages("DDATA")
    assert len(ddata) == 1
    values = sorted(m.double_value for m in ddata[0].payload.metrics)
    assert values == [0.8, 1.2]  # the latest score travels with the threshold


def test_the_node_speaks_mqtt_3_1_1_too(
    mosquitto: MosquittoBroker, tmp_path: Path, hosts: Callable[[], SparkplugHost],
    nodes: list[SparkplugEdgeNode],
) -> None:
    host = hosts()
    node = make_node(mosquitto.port, tmp_path, nodes, StateBoard(), CollectorRegistry(),
                     streams=("pump1",), protocol="3.1.1")
    wait_until(lambda: host.messages("DBIRTH", "pump1"), 20, "births over MQTT 3.1.1")
    node.stop()
    wait_until(lambda: host.messages("NDEATH"), 10, "NDEATH on stop")
    assert host.messages("NDEATH")[0].value("bdSeq") == host.messages("NBIRTH")[0].value("bdSeq")
