"""The plant's protocols to alerts, through ``edge-agent run``: real SKAB rows published to a
real mosquitto (MQTT in, JSON) and served by a real asyncua server (OPC UA), scored by the
shipped model, alerts inside the labelled fault.

Needs ``../shared/datasets`` (SKAB valve1/0.csv; always present in CI).
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from tests.conftest import MosquittoBroker, _free_port
from tests.integration import test_agent_e2e
from tests.integration.opcua_peer import OpcuaPeer
from tests.integration.test_agent_e2e import (
    SKAB_FILE,
    WINDOW_S,
    AgentProcess,
    parse_iso,
    read_skab,
    skab_dir,
    stored_alerts,
    write_config,
)
from tests.integration.test_mqtt_in import Publisher
from tests.integration.test_serial_pty import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.dataset]

#: The ``edge-agent run`` subprocess fixture of the end-to-end tests.
run_agent = test_agent_e2e.run_agent


def _alerts_inside_fault(tmp_path: Path, agent: AgentProcess, lo: float, hi: float) -> None:
    db = tmp_path / "state" / "agent.db"
    assert wait_for(lambda: bool(stored_alerts(db)), timeout=60), agent.stderr()[-3000:]
    for a in stored_alerts(db):
        end = parse_iso(a["payload"]["window_end"])
        assert lo - WINDOW_S <= end <= hi + WINDOW_S, a["payload"]["window_end"]
    assert wait_for(lambda: any(line.startswith("ALERT ") for line in agent.stdout().splitlines()),
                    timeout=30), agent.stdout()[-3000:]  # printed after the alert is stored


def _open_session(port: int, client_id: str, topic: str) -> None:
    """Make the broker hold the agent's persistent session (MQTT 3.1.1 §3.1.2.4: clean session
    0, the agent's client id, its QoS 1 subscription) before the agent starts, so the rows sent
    while the agent is still starting are queued for it, not dropped: the test does not depend
    on how soon the agent subscribes (a machine under load once took longer than a fixed sleep)."""
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
                         clean_session=False, protocol=mqtt.MQTTv311)
    connected, subscribed = threading.Event(), threading.Event()
    client.on_connect = lambda *a: connected.set()
    client.on_subscribe = lambda *a: subscribed.set()
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        assert connected.wait(10), "no CONNACK from the test broker"
        client.subscribe(topic, qos=1)
        assert subscribed.wait(10), "no SUBACK from the test broker"
    finally:
        client.disconnect()
        client.loop_stop()


def test_skab_rows_over_mqtt_json_raise_alerts(
    tmp_path: Path, mosquitto: MosquittoBroker, run_agent: Callable[..., AgentProcess]
) -> None:
    data = read_skab(skab_dir() / SKAB_FILE)
    fields = "".join(f'"{c}" = "{c}"\n' for c in data.channels)
    source = (f'[streams.source]\nkind = "mqtt"\nport = {mosquitto.port}\nformat = "json"\n'
              f'topics = ["plant/pump1/telemetry"]\ntimestamp_field = "ts"\n'
              f'client_id = "edge-in-e2e"\n[streams.source.fields]\n{fields}')
    config = write_config(tmp_path / "agent.toml", source)
    _open_session(mosquitto.port, "edge-in-e2e", "plant/pump1/telemetry")
    agent = run_agent(["run", "--config", str(config)], tmp_path)
    pub = Publisher(mosquitto.port, "skab-pump")
    try:
        db = tmp_path / "state" / "agent.db"
        assert wait_for(db.exists, timeout=30), agent.stderr()[-3000:]
        for ts, row in zip(data.ts, data.values, strict=True):
            pub.send("plant/pump1/telemetry",
                     json.dumps({"ts": ts, **dict(zip(data.channels, row.tolist(), strict=True))}))
        _alerts_inside_fault(tmp_path, agent, data.anomaly_start, data.anomaly_end)
    finally:
        pub.close()
        agent.terminate()
        assert agent.wait(30) == 0, agent.stderr()[-3000:]


def test_skab_rows_over_opcua_raise_alerts(
    tmp_path: Path, run_agent: Callable[..., AgentProcess]
) -> None:
    pytest.importorskip("asyncua")
    data = read_skab(skab_dir() / SKAB_FILE)
    names = tuple(c.replace(" ", "_") for c in data.channels)
    peer = OpcuaPeer(_free_port(), names=names).start()
    # a real PLC's nodes hold the current values when the agent subscribes
    peer.write_many(dict(zip(names, data.values[0].tolist(), strict=True)),
                    dt.datetime.fromtimestamp(data.ts[0] - 1, dt.timezone.utc))
    nodes = "".join(f'[[streams.source.nodes]]\nchannel = "{c}"\n'
                    f'node_id = "ns=2;s=Pump1.{n}"\n' for c, n in zip(data.channels, names,
                                                                       strict=True))
    source = (f'[streams.source]\nkind = "opcua"\nendpoint = "{peer.endpoint}"\n'
              f'publishing_interval_ms = 15\nsampling_interval_ms = 0\nqueue_size = 1\n{nodes}')
    config = write_config(tmp_path / "agent.toml", source)
    agent = run_agent(["run", "--config", str(config)], tmp_path)
    try:
        db = tmp_path / "state" / "agent.db"
        assert wait_for(db.exists, timeout=30), agent.stderr()[-3000:]
        time.sleep(2.0)
        for ts, row in zip(data.ts, data.values, strict=True):
            peer.write_many(dict(zip(names, row.tolist(), strict=True)),
                            dt.datetime.fromtimestamp(ts, dt.timezone.utc))
            time.sleep(0.02)  # about one publishing interval per row
        _alerts_inside_fault(tmp_path, agent, data.anomaly_start, data.anomaly_end)
    finally:
        agent.terminate()
        try:
            assert agent.wait(30) == 0, agent.stderr()[-3000:]
        finally:
            peer.stop()
