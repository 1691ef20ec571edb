"""Own logic of the MQTT consumers: Sparkplug B payloads and bdSeq file, the edge node's seq and
data rules (with a recording fake paho client), the config rules and Home Assistant ids."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from paho.mqtt.reasoncodes import ReasonCode
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from agent.config.loader import parse_config
from agent.errors import ConfigError
from agent.metrics import Metrics
from agent.preflight import preflight
from agent.publish import sparkplug_payloads as sp
from agent.publish.homeassistant import HomeAssistantDiscovery
from agent.publish.mqtt_config import MqttConfig, SparkplugConfig
from agent.publish.sparkplug_edge import SparkplugEdgeNode
from agent.publish.stream_state import StateBoard, StreamState
from agent.sparkplug_b import Payload, SparkplugError, decode, metric_value, rebirth_payload

# --- payloads ------------------------------------------------------------------------------------


def test_nbirth_has_seq_0_bdseq_and_the_rebirth_metric_ndeath_has_no_seq() -> None:
    birth = decode(sp.node_birth(7, 1000))
    assert birth.seq == 0 and birth.HasField("seq") and birth.timestamp == 1000
    by_name = {m.name: m for m in birth.metrics}
    assert metric_value(by_name["bdSeq"]) == 7
    assert by_name["Node Control/Rebirth"].boolean_value is False
    assert by_name["Node Control/Rebirth"].alias == sp.REBIRTH_ALIAS
    death = decode(sp.node_death(7, 1000))
    assert not death.HasField("seq")
    assert [(m.name, metric_value(m)) for m in death.metrics] == [("bdSeq", 7.0)]


def test_dbirth_names_every_metric_with_nulls_and_ddata_uses_aliases_only() -> None:
    birth = decode(sp.device_birth(1, sp.device_values(None), 5, 1000))
    assert birth.seq == 5
    assert [m.name for m in birth.metrics] == [n for n, _ in sp.DEVICE_METRICS]
    assert all(m.is_null for m in birth.metrics)
    assert [m.alias for m in birth.metrics] == [200, 201, 202, 203, 204]
    data = decode(sp.device_data(1, {"Status": "down", "Model/Version": -1}, 6, 1000))
    assert [(m.name, m.alias) for m in data.metrics] == [("", 203), ("", 204)]
    assert data.metrics[0].string_value == "down"
    data.metrics[1].datatype = 4  # the DBIRTH's datatype: Int64 in two's complement
    assert metric_value(data.metrics[1]) == -1.0


def test_rebirth_requested_by_name_or_alias_only_when_true() -> None:
    assert sp.rebirth_requested(rebirth_payload(1))
    msg = Payload()
    m = msg.metrics.add(alias=sp.REBIRTH_ALIAS)
    m.boolean_value = True
    assert sp.rebirth_requested(bytes(msg.SerializeToString()))
    m.boolean_value = False
    assert not sp.rebirth_requested(bytes(msg.SerializeToString()))
    other = Payload()
    o = other.metrics.add(name="Node Control/Rebirth")
    o.string_value = "true"  # not a Boolean
    assert not sp.rebirth_requested(bytes(other.SerializeToString()))


@pytest.mark.parametrize(("data", "reason"), [(b"\xff" * 10, "bad_payload"),
                                              (b"\x00" * (sp.MAX_COMMAND_BYTES + 1), "too_large")])
def test_bad_ncmd_payloads_raise_with_a_reason(data: bytes, reason: str) -> None:
    with pytest.raises(SparkplugError) as info:
        sp.rebirth_requested(data)
    assert info.value.reason == reason


def test_bdseq_file_starts_at_0_survives_restarts_and_wraps(tmp_path: Path) -> None:
    path = tmp_path / "state" / "sparkplug.bdseq"
    assert sp.BdSeqFile(path).next() == 0
    f = sp.BdSeqFile(path)
    assert [f.next(), f.next()] == [1, 2]
    path.write_text('{"bdSeq": 255}')
    assert sp.BdSeqFile(path).next() == 0
    path.write_text("not json")
    assert sp.BdSeqFile(path).next() == 0


def test_bdseq_file_that_cannot_be_written_counts_on_in_memory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    f = sp.BdSeqFile(blocker / "sparkplug.bdseq")  # its folder is a file
    with caplog.at_level(logging.ERROR):
        assert [f.next(), f.next(), f.next()] == [0, 1, 2]
    assert len([r for r in caplog.records if "cannot save bdSeq" in r.message]) == 1


# --- the edge node's rules, with a fake client ---------------------------------------------------


class _Info:
    rc = 0


class FakeClient:
    """Records publishes; accepts every call the edge node makes."""

    def __init__(self, **kwargs: Any) -> None:
        self.published: list[tuple[str, bytes, int, bool]] = []
        self.will: tuple[str, bytes] | None = None

    def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False) -> _Info:
        self.published.append((topic, payload, qos, retain))
        return _Info()

    def will_set(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False) -> None:
        self.will = (topic, payload)

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: None


def connected_node(tmp_path: Path, interval: float = 0.0) -> tuple[SparkplugEdgeNode,
                                                                   FakeClient, list[float]]:
    now = [100.0]
    config = MqttConfig(sparkplug=SparkplugConfig(enabled=True, group_id="g",
                                                  min_data_interval_s=interval))
    made: list[FakeClient] = []

    def factory(**kw: Any) -> FakeClient:
        made.append(FakeClient(**kw))
        return made[-1]

    node = SparkplugEdgeNode(config, "gw1", ["s1"], Metrics(CollectorRegistry()), tmp_path,
                             client_factory=factory,  # type: ignore[arg-type]
                             monotonic=lambda: now[0])
    client = made[0]
    node._on_pre_connect(client, None)  # type: ignore[arg-type]
    node._on_connect(client, None, None, ReasonCode(2, identifier=0), None)  # type: ignore[arg-type]
    return node, client, now


def state(score: float, status: str = "normal") -> StreamState:
    return StreamState("s1", "sensor", status, score, 1.0, "ae", 1, None, 1.0)  # type: ignore[arg-type]


def test_seq_wraps_after_255_and_nbirth_starts_at_0(tmp_path: Path) -> None:
    node, client, _ = connected_node(tmp_path)
    board = StateBoard()
    node.attach(board)
    node._pass()  # births: NBIRTH seq 0, DBIRTH seq 1
    for i in range(300):
        board.update(state(float(i)))
        node._pass()
    seqs = [decode(p).seq for t, p, _, _ in client.published]
    assert seqs[:3] == [0, 1, 2]
    assert seqs[255:258] == [255, 0, 1]
    assert all(qos == 0 and not retain for _, _, qos, retain in client.published)
    assert client.will is not None and client.will[0] == "spBv1.0/g/NDEATH/gw1"


def test_a_score_only_change_waits_for_the_interval_then_goes_out(tmp_path: Path) -> None:
    node, client, now = connected_node(tmp_path, interval=5.0)
    board = StateBoard()
    board.update(state(0.2))
    node.attach(board)
    node._pass()  # NBIRTH, DBIRTH with the state
    board.update(state(0.3))
    wait = node._pass()
    assert len(client.published) == 2 and 0 < wait <= 5.0  # held back
    now[0] += 5.0
    node._pass()
    assert len(client.published) == 3
    assert [m.double_value for m in decode(client.published[-1][1]).metrics] == [0.3]


# --- config and Home Assistant ids ---------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"homeassistant": {"enabled": True}}, "homeassistant.enabled needs enabled"),
    ({"sparkplug": {"enabled": True}}, "sparkplug.enabled needs sparkplug.group_id"),
    ({"sparkplug": {"group_id": "a/b"}}, "one non-empty topic level"),
    ({"homeassistant": {"discovery_prefix": "ha/+"}}, "must not contain"),
])
def test_consumer_config_rules(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        MqttConfig.model_validate(kwargs)


def test_streams_that_collide_as_home_assistant_ids_are_a_config_error() -> None:
    with pytest.raises(ConfigError, match="both become Home Assistant id 'a_b'"):
        HomeAssistantDiscovery(MqttConfig().homeassistant, None, "gw.1", "edge",  # type: ignore[arg-type]
                               ["a.b", "a_b"], Metrics(CollectorRegistry()))


def test_dotted_names_become_valid_home_assistant_ids() -> None:
    ha = HomeAssistantDiscovery(MqttConfig().homeassistant, None, "Gw.1", "edge",  # type: ignore[arg-type]
                                ["Line.2"], Metrics(CollectorRegistry()))
    assert ha.config_topic("sensor", "Line.2") == "homeassistant/sensor/Gw_1/Line_2_score/config"
    payload = ha.config_payload("sensor", "Line.2")
    assert payload["unique_id"] == "Gw_1_Line_2_score"
    assert payload["default_entity_id"] == "sensor.gw_1_line_2_score"
    assert payload["state_topic"] == "edge/Gw.1/Line.2/state"


def test_check_config_names_colliding_home_assistant_ids(tmp_path: Path) -> None:
    streams = "".join(
        f'[[streams]]\nname = "{n}"\nmodel = "builtin:skab-wstat"\n'
        '[streams.source]\nkind = "simulator"\n' for n in ("a.b", "a_b"))
    text = (f'[agent]\nstate_dir = "{tmp_path}"\n{streams}'
            '[mqtt]\nenabled = true\n[mqtt.sparkplug]\nenabled = true\ngroup_id = "g"\n')
    config = parse_config(text, env={}).resolved(tmp_path)
    problems = [p for p in preflight(config) if p.startswith("mqtt.")]
    assert problems == ["mqtt.homeassistant: streams 'a.b' and 'a_b' both become Home "
                        "Assistant id 'a_b'; rename one"]
