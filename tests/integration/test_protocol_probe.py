"""``edge-agent probe`` against OPC UA and MQTT-in peers (the Modbus ones: test_modbus_probe.py).

Each probe is the real command (``python -m agent.cli probe``, this checkout on PYTHONPATH) in
its own process, reading an asyncua server started by the test (a thread of the test process)
or a mosquitto started by the test, while the test writes good and bad values: readings are
printed, every rejection with its reason, and the exit status is 1 when nothing was read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import MosquittoBroker, _free_port
from tests.integration.test_mqtt_in import Publisher

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def run_probe(config: Path, seconds: float, *, while_running: Callable[[], None] | None = None,
              as_json: bool = True) -> tuple[int, str, str]:
    """Run ``edge-agent probe`` for ``seconds``; call ``while_running`` repeatedly meanwhile."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "agent.cli", "probe", "--config", str(config),
           "--seconds", str(seconds), *(["--json"] if as_json else [])]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    done = threading.Event()

    def feed() -> None:
        while not done.wait(0.1):
            if while_running is not None:
                while_running()

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        out, err = proc.communicate(timeout=seconds + 120)
    finally:
        done.set()
        feeder.join(10)
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out, err


def events(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def write(tmp_path: Path, source: str) -> Path:
    path = tmp_path / "agent.toml"
    path.write_text(f'[[streams]]\nname = "plc"\n{source}')
    return path


# --- OPC UA ------------------------------------------------------------------------------------


def opcua_source(endpoint: str) -> str:
    return (f'[streams.source]\nkind = "opcua"\nendpoint = "{endpoint}"\n'
            'publishing_interval_ms = 50\nsampling_interval_ms = 0\ntimeout_s = 2.0\n'
            'reconnect_initial_s = 0.2\nreconnect_max_s = 1.0\n'
            '[[streams.source.nodes]]\nchannel = "pressure"\nnode_id = "ns=2;s=Pump1.Pressure"\n'
            'max = 100.0\n'
            '[[streams.source.nodes]]\nchannel = "flow"\n'
            'browse_path = "0:Objects/2:Pump1/2:Flow"\n')


def test_probe_reads_an_opcua_server_and_names_each_rejection(tmp_path: Path) -> None:
    pytest.importorskip("asyncua")
    from tests.integration.opcua_peer import OpcuaPeer  # noqa: PLC0415 - needs asyncua

    peer = OpcuaPeer(_free_port()).start()
    try:
        peer.write("Pressure", 4.5)
        peer.write("Flow", 1.25)
        step = [0]

        def vary() -> None:  # a good value, a Bad status, one above max, in turn
            step[0] += 1
            kind = step[0] % 3
            if kind == 0:
                peer.write("Pressure", 4.5)
            elif kind == 1:
                peer.write("Pressure", 9.0, status="BadSensorFailure")
            else:
                peer.write("Pressure", 500.0)

        rc, out, err = run_probe(write(tmp_path, opcua_source(peer.endpoint)), 8.0,
                                 while_running=vary)
    finally:
        peer.stop()
    assert rc == 0, err[-3000:]
    got = events(out)
    readings = [e["values"] for e in got if "values" in e]
    assert {"pressure": 4.5, "flow": 1.25} in readings
    assert all(r["pressure"] == 4.5 for r in readings)  # nothing bad was taken
    rejected = {e["rejected"]: e["message"] for e in got if "rejected" in e}
    assert "BadSensorFailure" in rejected["status_bad"]
    assert "500" in rejected["out_of_range"]
    (summary,) = [e["summary"] for e in got if "summary" in e]
    assert summary["readings"] == len(readings)
    assert summary["rejected"]["status_bad"] >= 1 and summary["rejected"]["out_of_range"] >= 1


def test_probe_of_an_opcua_endpoint_with_no_server_exits_1(tmp_path: Path) -> None:
    pytest.importorskip("asyncua")
    rc, out, _ = run_probe(write(tmp_path, opcua_source(f"opc.tcp://127.0.0.1:{_free_port()}/")),
                           2.0, as_json=False)
    assert rc == 1
    assert " DOWN " in out
    assert "plc: 0 readings" in out


# --- MQTT in -----------------------------------------------------------------------------------


def mqtt_source(port: int) -> str:
    return (f'[streams.source]\nkind = "mqtt"\nport = {port}\nformat = "json"\n'
            'topics = ["plant/pump1/telemetry"]\nclient_id = "probe-test"\n'
            'reconnect_initial_s = 0.2\nreconnect_max_s = 1.0\nmax = { p = 100.0 }\n'
            '[streams.source.fields]\np = "pressure"\nf = "flow"\n')


def test_probe_reads_mqtt_json_and_names_each_rejection(tmp_path: Path,
                                                        mosquitto: MosquittoBroker) -> None:
    pub = Publisher(mosquitto.port, "probe-pub")
    payloads = [json.dumps({"pressure": 2.5, "flow": 7}), "not json {",
                json.dumps({"pressure": 500, "flow": 7})]
    step = [0]

    def publish() -> None:
        pub.send("plant/pump1/telemetry", payloads[step[0] % 3])
        step[0] += 1

    try:
        rc, out, err = run_probe(write(tmp_path, mqtt_source(mosquitto.port)), 4.0,
                                 while_running=publish)
    finally:
        pub.close()
    assert rc == 0, err[-3000:]
    got = events(out)
    readings = [e["values"] for e in got if "values" in e]
    assert readings and all(r == {"p": 2.5, "f": 7.0} for r in readings), readings[:5]
    rejected = {e["rejected"]: e["message"] for e in got if "rejected" in e}
    assert set(rejected) == {"bad_payload", "out_of_range"}, rejected
    assert "500" in rejected["out_of_range"]
    (summary,) = [e["summary"] for e in got if "summary" in e]
    assert summary["readings"] == len(readings)


def test_probe_of_mqtt_with_only_garbage_exits_1(tmp_path: Path,
                                                 mosquitto: MosquittoBroker) -> None:
    pub = Publisher(mosquitto.port, "probe-pub")
    try:
        rc, out, _ = run_probe(write(tmp_path, mqtt_source(mosquitto.port)), 3.0,
                               while_running=lambda: pub.send("plant/pump1/telemetry", b"\xff"),
                               as_json=False)
    finally:
        pub.close()
    assert rc == 1
    lines = [line for line in out.splitlines() if "REJECTED" in line]
    assert lines and all("REJECTED bad_payload:" in line for line in lines), out[-2000:]
    assert "plc: 0 readings" in out
