"""MqttInSource against a real mosquitto, under the real SourceSupervisor.

Publishers are plain paho clients of the test; the Sparkplug B publisher encodes its payloads
with protobuf (the schema of :mod:`agent.sources.sparkplug`) and answers rebirth requests.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import paho.mqtt.client as mqtt
import pytest

from agent.sources import sparkplug as sp
from agent.sources.mqtt_in import MqttInSource
from agent.sources.mqtt_in_config import MqttInConfig
from tests.conftest import MosquittoBroker
from tests.integration.supervised import Supervised
from tests.integration.test_serial_pty import sample, wait_for

pytestmark = pytest.mark.integration


class Running(Supervised):
    """An MqttInSource under a real SourceSupervisor, collecting readings."""

    def __init__(self, port: int, **fields: Any) -> None:
        base: dict[str, Any] = {"port": port, "reconnect_initial_s": 0.1, "reconnect_max_s": 0.5,
                                "keepalive_s": 5}
        self.config = MqttInConfig.model_validate({**base, **fields}, strict=False)
        super().__init__(MqttInSource(self.config, "line"), "line")

    def connected(self, n: int = 1) -> bool:
        return bool(self.source.connects >= n and self.sup.outage is None)


class Publisher:
    """A paho publisher on the broker (QoS 1, waits for each PUBACK)."""

    def __init__(self, port: int, client_id: str = "test-pub") -> None:
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id)
        self.commands: list[tuple[str, bytes]] = []
        self.client.on_message = lambda _c, _u, m: self.commands.append((m.topic, m.payload))
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()

    def send(self, topic: str, payload: bytes | str, qos: int = 1) -> None:
        self.client.publish(topic, payload, qos=qos).wait_for_publish(5)

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


@pytest.fixture
def pub(mosquitto: MosquittoBroker) -> Iterator[Publisher]:
    p = Publisher(mosquitto.port)
    yield p
    p.close()


def test_json_fields_map_to_channels_with_their_timestamp(mosquitto: MosquittoBroker,
                                                          pub: Publisher) -> None:
    run = Running(mosquitto.port, format="json", topics=["plant/+/telemetry"],
                  fields={"p": "pressure", "f": "flow.value"}, timestamp_field="ts",
                  max={"p": 100.0})
    try:
        assert wait_for(run.connected, timeout=10)
        pub.send("plant/pump1/telemetry", json.dumps({"pressure": 2.5, "flow": {"value": 7},
                                                      "ts": 1_767_225_600_000}))
        assert wait_for(lambda: run.values() == [[2.5, 7.0]])
        assert run.readings[0].ts == pytest.approx(1_767_225_600.0)
        pub.send("plant/pump1/telemetry", json.dumps({"pressure": 3.0,
                                                      "ts": "2026-01-01T00:00:01+00:00"}))
        assert wait_for(lambda: [3.0, 7.0] in run.values())  # flow held
        for payload, reason in [(b"\xff\xfe", "bad_payload"), (b"[1, 2]", "bad_payload"),
                                (b'{"other": 1, "ts": 1}', "no_fields"),
                                (b'{"pressure": "high", "ts": 1}', "wrong_type"),
                                (b'{"pressure": 1, "ts": "yesterday"}', "bad_timestamp"),
                                (b'{"pressure": 500, "ts": 1}', "out_of_range"),
                                (json.dumps({"pressure": 1, "pad": "x" * 70_000}).encode(),
                                 "oversized")]:
            pub.send("plant/pump1/telemetry", payload)
            assert wait_for(lambda r=reason: run.rejected(r) >= 1), reason  # type: ignore[misc]
        assert len(run.readings) == 2 and run.sup.outage is None
    finally:
        run.close()


def test_one_number_per_topic(mosquitto: MosquittoBroker, pub: Publisher) -> None:
    run = Running(mosquitto.port, format="number",
                  channel_topics={"t": "pump/temp", "i": "pump/current"})
    try:
        assert wait_for(run.connected, timeout=10)
        pub.send("pump/temp", "21.5")
        pub.send("pump/current", "nan")
        pub.send("pump/current", "overload")
        assert wait_for(lambda: run.rejected("non_finite") >= 1
                        and run.rejected("not_a_number") >= 1)
        assert run.readings == []  # current never had a value
        pub.send("pump/current", b"4.25")
        assert wait_for(lambda: run.values() == [[21.5, 4.25]])
    finally:
        run.close()


def test_persistent_session_reads_what_was_queued_while_away(mosquitto: MosquittoBroker,
                                                              pub: Publisher) -> None:
    fields: dict[str, Any] = {"format": "number", "channel_topics": {"t": "pump/temp"},
                              "client_id": "edge-in-test"}
    first = Running(mosquitto.port, **fields)
    assert wait_for(first.connected, timeout=10)
    pub.send("pump/temp", "1")
    assert wait_for(lambda: first.values() == [[1.0]])
    first.close()  # the agent stops; the broker keeps its session
    for v in (2, 3, 4):
        pub.send("pump/temp", str(v))
    second = Running(mosquitto.port, **fields)
    try:
        assert wait_for(lambda: second.values() == [[2.0], [3.0], [4.0]], timeout=10)
    finally:
        second.close()


def test_broker_restart_reconnects_and_silent_broker_is_reported(mosquitto: MosquittoBroker
                                                                 ) -> None:
    run = Running(mosquitto.port, format="number", channel_topics={"t": "pump/temp"})
    try:
        assert wait_for(run.connected, timeout=10)
        mosquitto.kill()
        assert wait_for(lambda: run.sup.outage is not None, timeout=10)
        mosquitto.start()
        assert wait_for(lambda: run.connected(2), timeout=15)
        pub = Publisher(mosquitto.port)
        try:
            pub.send("pump/temp", "9")
            assert wait_for(lambda: run.values() == [[9.0]])
        finally:
            pub.close()
    finally:
        run.close()
    silent = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    threading.Thread(target=lambda: held.append(silent.accept()[0]), daemon=True).start()
    mute = Running(silent.getsockname()[1], format="number", channel_topics={"t": "x"},
                   keepalive_s=5)
    try:
        assert wait_for(lambda: mute.sup.outage is not None, timeout=15)
        assert "no CONNACK" in str(mute.sup.outage)
    finally:
        mute.close()
        for s in held:
            s.close()
        silent.close()


def test_broker_restart_keeps_every_accepted_reading_and_counts_the_outage(
        mosquitto_persistent: MosquittoBroker) -> None:
    # A device publishes one JSON reading a second (payload timestamps t0 + k). The broker
    # goes down: what the device publishes meanwhile is lost at the device (k = 10..14), and
    # nothing in the protocol tells the agent; only the jump in the timestamps does. The
    # broker comes back with the agent's persistent session, and the device publishes
    # k = 15..24 before the agent is back (reconnect delay 5-10 s): the broker queues them.
    broker = mosquitto_persistent
    t0 = 1_767_225_600.0
    run = Running(broker.port, format="json", topics=["plant/pump1/telemetry"],
                  fields={"p": "pressure"}, timestamp_field="ts", expected_interval_s=1.0,
                  client_id="edge-in-restart", reconnect_initial_s=10.0, reconnect_max_s=10.0)

    def publish(pub: Publisher, ks: range) -> None:
        for k in ks:
            pub.send("plant/pump1/telemetry", json.dumps({"pressure": float(k), "ts": t0 + k}))

    try:
        assert wait_for(run.connected, timeout=10)
        pub = Publisher(broker.port)
        publish(pub, range(10))
        pub.close()
        assert wait_for(lambda: len(run.readings) == 10)
        stopping_at = time.monotonic()
        broker.stop()  # SIGTERM: the broker saves the session and its subscription
        down_at = time.monotonic()
        assert wait_for(lambda: run.sup.outage is not None, timeout=5)
        time.sleep(1.0)
        broker.start()
        up_at = time.monotonic()
        pub = Publisher(broker.port)
        publish(pub, range(15, 25))
        pub.close()
        assert run.source.connects == 1, "the agent was back before the device published"
        assert wait_for(lambda: len(run.readings) == 20, timeout=15), run.values()
        assert run.sup.outage is None and run.source.connects == 2
        # every reading accepted before and after the outage is kept, once, in order
        assert run.values() == [[float(k)] for k in [*range(10), *range(15, 25)]]
        assert [r.ts for r in run.readings] == [t0 + k for k in [*range(10), *range(15, 25)]]
        # what was missed: the five readings the timestamps skip, and one outage with its length
        assert run.source.missed == 5
        assert run.metric("edge_agent_polls_missed_total", reason="gap") == 5
        assert run.metric("edge_agent_source_outages_total") == 1
        down_s = run.metric("edge_agent_source_outage_seconds_total")
        # at least while the broker was surely down; at most from its stop to now
        assert up_at - down_at - 0.5 <= down_s <= time.monotonic() - stopping_at, down_s
    finally:
        run.close()


def test_expected_interval_needs_payload_timestamps() -> None:
    for fields in ({"format": "json", "topics": ["a"], "fields": {"p": "p"}},
                   {"format": "number", "channel_topics": {"p": "a"}}):
        with pytest.raises(ValueError, match="expected_interval_s needs format 'json' with a "
                           "timestamp_field"):
            MqttInConfig.model_validate({**fields, "expected_interval_s": 1.0})


class EdgeNode:
    """A Sparkplug B edge node with one device, publishing births and data with aliases."""

    def __init__(self, pub: Publisher, bd_seq: int = 0) -> None:
        self.pub, self.seq, self.bd_seq = pub, 0, bd_seq
        self.births = 0
        pub.client.subscribe("spBv1.0/plant1/NCMD/line3", qos=0)

    def _payload(self, metrics: list[tuple[str | None, int, float]], seq: int) -> bytes:
        msg = sp.Payload(timestamp=int(time.time() * 1000), seq=seq)
        for name, alias, value in metrics:
            m = msg.metrics.add(alias=alias, datatype=10)
            if name is not None:
                m.name = name
            m.double_value = value
        return bytes(msg.SerializeToString())

    def birth(self) -> None:
        self.births += 1
        nb = sp.Payload(timestamp=int(time.time() * 1000), seq=0)
        m = nb.metrics.add(name="bdSeq", datatype=8)
        m.long_value = self.bd_seq
        self.pub.send("spBv1.0/plant1/NBIRTH/line3", bytes(nb.SerializeToString()))
        self.seq = 0
        self.data("DBIRTH", [("Inputs/Pressure", 1, 1.0), ("Inputs/Flow", 2, 10.0)])

    def data(self, kind: str, metrics: list[tuple[str | None, int, float]],
             skip: int = 0) -> None:
        self.seq = (self.seq + 1 + skip) % 256
        self.pub.send(f"spBv1.0/plant1/{kind}/line3/pump1", self._payload(metrics, self.seq))


def test_sparkplug_b_aliases_seq_gaps_bdseq_and_rebirth(mosquitto: MosquittoBroker,
                                                         pub: Publisher) -> None:
    run = Running(mosquitto.port, format="sparkplug_b", group_id="plant1", edge_node_id="line3",
                  device_id="pump1", metrics={"p": "Inputs/Pressure", "f": "Inputs/Flow"})
    node = EdgeNode(pub)
    try:
        assert wait_for(run.connected, timeout=10)
        node.birth()
        assert wait_for(lambda: run.values() == [[1.0, 10.0]])
        node.data("DDATA", [(None, 1, 2.0)])  # alias only
        assert wait_for(lambda: [2.0, 10.0] in run.values())
        node.data("DDATA", [(None, 2, 11.0)], skip=3)  # three messages lost
        assert wait_for(lambda: run.source.events.get("seq_gap") == 3)
        assert wait_for(lambda: any(t.endswith("/NCMD/line3") for t, _ in pub.commands))
        cmd = sp.decode(pub.commands[0][1])
        assert [(m.name, m.boolean_value) for m in cmd.metrics] == [(sp.REBIRTH_METRIC, True)]
        assert [2.0, 11.0] in run.values()
        node.data("DDATA", [(None, 9, 5.0)])  # an alias nobody announced
        assert wait_for(lambda: run.rejected("unknown_alias") >= 1)
        node.bd_seq = 1
        node.birth()  # a new session of the node
        assert wait_for(lambda: run.source.events.get("bdseq_change") == 1)
        node.seq += 1
        text = sp.Payload(timestamp=int(time.time() * 1000), seq=node.seq)
        t = text.metrics.add(alias=1, datatype=12)  # a String metric on a numeric channel
        t.string_value = "high"
        pub.send("spBv1.0/plant1/DDATA/line3/pump1", bytes(text.SerializeToString()))
        assert wait_for(lambda: run.rejected("wrong_type") >= 1)  # it used to vanish silently
        pub.send("spBv1.0/plant1/DDATA/line3/pump1", b"\x08\x96\x01garbage")
        assert wait_for(lambda: run.rejected("bad_payload") >= 1)
        sample_name = "edge_agent_sparkplug_events_total"
        assert sample(run.metrics, sample_name, stream="line", event="seq_gap") == 3
        assert run.sup.outage is None
    finally:
        run.close()


def test_timestamps_no_clock_can_mean_are_rejected(mosquitto: MosquittoBroker,
                                                   pub: Publisher) -> None:
    # 1e30 ms (JSON) and a uint64 near 2**64 ms (Sparkplug B) were taken as reading times and
    # crashed the agent when it formatted them (OverflowError in the clock-step log line)
    run = Running(mosquitto.port, format="json", topics=["plant/pump1/telemetry"],
                  fields={"p": "pressure"}, timestamp_field="ts")
    spb = Running(mosquitto.port, format="sparkplug_b", group_id="plant1", edge_node_id="line3",
                  device_id="pump1", metrics={"p": "Inputs/Pressure", "f": "Inputs/Flow"},
                  client_id="edge-agent-in-spb")
    node = EdgeNode(pub)
    try:
        assert wait_for(run.connected, timeout=10) and wait_for(spb.connected, timeout=10)
        for ts in (1e30, -1e30, "9999-12-31T23:59:59+00:00"):
            pub.send("plant/pump1/telemetry", json.dumps({"pressure": 1.0, "ts": ts}))
        assert wait_for(lambda: run.rejected("bad_timestamp") >= 2)
        assert wait_for(lambda: len(run.readings) == 1)  # year 9999 is still a time
        node.birth()
        assert wait_for(lambda: spb.values() == [[1.0, 10.0]])
        node.seq += 1
        msg = sp.Payload(timestamp=2**64 - 1, seq=node.seq)
        m = msg.metrics.add(alias=1, datatype=10, timestamp=2**64 - 1)
        m.double_value = 2.0
        pub.send("spBv1.0/plant1/DDATA/line3/pump1", bytes(msg.SerializeToString()))
        assert wait_for(lambda: spb.rejected("bad_timestamp") >= 1)
        assert spb.values() == [[1.0, 10.0]]
        assert run.sup.outage is None and spb.sup.outage is None
    finally:
        run.close()
        spb.close()


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"format": "json", "topics": ["a"]}, "needs fields"),
        ({"format": "number", "channel_topics": {"a": "t"}, "topics": ["x"]}, "does not use"),
        ({"format": "sparkplug_b", "group_id": "g", "metrics": {"a": "m"}}, "edge_node_id"),
        ({"format": "number", "channel_topics": {"a": "t"}, "max": {"b": 1}}, "does not have"),
        ({"format": "sparkplug_b", "group_id": "g/h", "edge_node_id": "n",
          "metrics": {"a": "m"}}, "String should match pattern"),
    ],
)
def test_impossible_configs_are_refused(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MqttInConfig.model_validate(fields)
