"""More of the plant's protocols to alerts through ``edge-agent run`` (the real CLI in a
subprocess, the shipped model, SKAB valve1/0.csv, alerts inside the labelled fault):

* Sparkplug B in: an edge node whose payloads are written byte by byte from the
  specification's field numbers (:mod:`tests.integration.spb_wire`, nothing shared with the
  agent's own schema) publishes the recording as DDATA to a test-started mosquitto;
* Modbus RTU: pymodbus's own RTU server on one end of a socat pseudo-terminal pair serves the
  recording as holding registers, the agent polls the other end;
* OPC UA with Basic256Sha256 SignAndEncrypt and a user name whose password is read from a file:
  a real asyncua server that offers nothing else (no security None, no anonymous session).

Needs ``../shared/datasets`` (always present in CI).
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.records import Reading
from agent.sources.modbus_sim import SimServer, serve_csv
from tests.conftest import MosquittoBroker, _free_port
from tests.integration import spb_wire as w
from tests.integration import test_agent_e2e
from tests.integration.opcua_peer import OpcuaPeer, make_certificate
from tests.integration.test_agent_e2e import (
    SKAB_FILE,
    AgentProcess,
    parse_iso,
    read_skab,
    skab_dir,
    stored_alerts,
    wait_until,
    write_config,
)
from tests.integration.test_mqtt_in import Publisher
from tests.integration.test_protocol_e2e import _alerts_inside_fault
from tests.integration.test_serial_pty import SOCAT, Socat

pytestmark = [pytest.mark.integration, pytest.mark.dataset]

#: The ``edge-agent run`` subprocess fixture of the end-to-end tests.
run_agent = test_agent_e2e.run_agent


def _stop(agent: AgentProcess) -> None:
    agent.terminate()
    assert agent.wait(30) == 0, agent.stderr()[-3000:]


# --- Sparkplug B -------------------------------------------------------------------------------

NODE = "spBv1.0/plant1/{kind}/line3"


def test_skab_rows_as_sparkplug_b_ddata_raise_alerts(
    tmp_path: Path, mosquitto: MosquittoBroker, run_agent: Callable[..., AgentProcess]
) -> None:
    data = read_skab(skab_dir() / SKAB_FILE)
    names = [f"Pump1/{c}" for c in data.channels]
    metrics = "".join(f'"{c}" = "{n}"\n' for c, n in zip(data.channels, names, strict=True))
    source = (f'[streams.source]\nkind = "mqtt"\nport = {mosquitto.port}\n'
              f'format = "sparkplug_b"\ngroup_id = "plant1"\nedge_node_id = "line3"\n'
              f'device_id = "pump1"\nclient_id = "edge-in-spb-e2e"\n'
              f'[streams.source.metrics]\n{metrics}')
    config = write_config(tmp_path / "agent.toml", source)
    agent = run_agent(["run", "--config", str(config)], tmp_path)
    pub = Publisher(mosquitto.port, "wire-node")
    pub.client.subscribe(NODE.format(kind="NCMD"), qos=0)
    try:
        # The edge node was online before this host: the agent missed its births. The node
        # sends data with no metrics until the agent, seeing data from a device nobody
        # announced, asks for a rebirth (an NCMD); so the births below reach a subscriber.
        deadline, seq = time.monotonic() + 45, 200
        while not pub.commands:
            assert agent.proc.poll() is None, agent.stderr()[-3000:]
            assert time.monotonic() < deadline, "no rebirth request\n" + agent.stderr()[-3000:]
            pub.send(NODE.format(kind="DDATA") + "/pump1", w.payload(int(time.time() * 1000),
                                                                    seq, []))
            seq, _ = seq + 1, time.sleep(0.5)
        rebirth = w.metrics_of(pub.commands[0][1])
        assert pub.commands[0][0] == NODE.format(kind="NCMD")
        assert [(m[1], m.get(14)) for m in rebirth] == [(b"Node Control/Rebirth", 1)]
        born = int(data.ts[0] * 1000) - 1000
        pub.send(NODE.format(kind="NBIRTH"), w.payload(born, 0, [w.Metric(w.UINT64, 0,
                                                                          name="bdSeq")]))
        # the birth names each metric with its alias; data then carries the alias only
        pub.send(NODE.format(kind="DBIRTH") + "/pump1", w.payload(born, 1, [
            w.Metric(w.DOUBLE, 0.0, name=n, alias=10 + i, timestamp=born)
            for i, n in enumerate(names)]))
        for k, (ts, row) in enumerate(zip(data.ts, data.values, strict=True)):
            ms = int(ts * 1000)
            pub.send(NODE.format(kind="DDATA") + "/pump1", w.payload(ms, (k + 2) % 256, [
                w.Metric(w.DOUBLE, float(v), alias=10 + i, timestamp=ms)
                for i, v in enumerate(row.tolist())]))
        _alerts_inside_fault(tmp_path, agent, data.anomaly_start, data.anomaly_end)
        log = agent.stderr()
        for reason in ("unknown_alias", "bad_payload", "wrong_type", "bad_timestamp"):
            assert reason not in log, log[-3000:]
        assert len(pub.commands) == 1  # nothing else made the agent ask for a rebirth
    finally:
        pub.close()
        _stop(agent)


# --- Modbus RTU --------------------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]


def test_run_polls_modbus_rtu_on_a_pty_and_alerts(
    tmp_path: Path, run_agent: Callable[..., AgentProcess]
) -> None:
    if SOCAT is None:
        pytest.skip("socat not installed (apt-get install socat)")
    csv = skab_dir() / SKAB_FILE
    pair = Socat(tmp_path)
    pair.start()
    example = (REPO / "systemd" / "skab-modbus.toml").read_text()
    tcp = 'transport = "tcp"\nhost = "127.0.0.1"\nport = 5020\n'
    assert tcp in example
    # parity N: a Linux pseudo-terminal refuses PARENB (tcsetattr EINVAL)
    rtu = (f'transport = "rtu"\nserial_port = "{pair.dev}"\nbaudrate = 115200\n'
           'parity = "N"\nstopbits = 1\nbytesize = 8\n')
    config = tmp_path / "agent.toml"
    config.write_text(example.replace(tcp, rtu)
                      .replace("\npoll_interval_s = 0.1\ntimeout_s = 0.5\n",
                               "\npoll_interval_s = 0.025\ntimeout_s = 0.2\n"
                               "reconnect_initial_s = 0.1\nreconnect_max_s = 0.5\n")
                      .replace('"../state/skab-modbus"', '"state"'))
    server = SimServer(transport="rtu", serial_port=str(pair.peer), baudrate=115200, parity="N")
    stop = threading.Event()
    data = read_skab(csv)
    first_fault_row = int((data.ts < data.anomaly_start).sum())
    served: list[float] = []  # wall time each row was served (rows are restamped: now)

    def on_row(_row: Reading) -> None:
        served.append(time.time())

    feeder = threading.Thread(target=serve_csv, args=(server, str(csv)),
                              kwargs={"speed": 40.0, "loop": False, "stop": stop,
                                      "on_row": on_row}, daemon=True)
    agent = run_agent(["run", "--config", str(config)], tmp_path)
    try:
        wait_until(lambda: ("pump1: source modbus" in agent.stderr()
                            or agent.proc.poll() is not None), 45, "the stream to start",
                   agent.stderr)
        assert agent.proc.poll() is None, agent.stderr()
        # the device comes up once the agent polls: calibration sees the recording's own rows
        server.start()
        feeder.start()
        wait_until(lambda: "ALERT skab-modbus:pump1" in agent.stdout(), 50, "an alert",
                   lambda: agent.stderr()[-3000:])
        _stop(agent)
        # readings carry the time their response arrived: the alert is about the fault's rows
        alerts = stored_alerts(tmp_path / "state" / "agent.db")
        assert alerts and len(served) > first_fault_row
        for a in alerts:
            assert parse_iso(a["payload"]["window_end"]) >= served[first_fault_row], a["payload"]
    finally:
        stop.set()
        if feeder.is_alive():
            feeder.join(10.0)
        server.stop()
        pair.kill()


# --- OPC UA, Basic256Sha256 SignAndEncrypt, user name and password file --------------------------

CLIENT_URI = "urn:example.org:FreeOpcUa:opcua-asyncio"  # asyncua's client application URI


def test_skab_rows_over_secure_opcua_with_a_password_file_raise_alerts(
    tmp_path: Path, run_agent: Callable[..., AgentProcess]
) -> None:
    pytest.importorskip("asyncua")
    data = read_skab(skab_dir() / SKAB_FILE)
    names = tuple(c.replace(" ", "_") for c in data.channels)
    server_cert = make_certificate(tmp_path, "server", "urn:freeopcua:python:server")
    client_cert, client_key = make_certificate(tmp_path, "client", CLIENT_URI)
    password = tmp_path / "opcua-password"
    password.write_text("pump room 7\n", encoding="utf-8")
    # the server offers Basic256Sha256 SignAndEncrypt and user-name sessions, nothing else
    peer = OpcuaPeer(_free_port(), names=names, secure=True, certificate=server_cert,
                     mode="SignAndEncrypt", users={"edge": "pump room 7"})
    nodes = "".join(f'[[streams.source.nodes]]\nchannel = "{c}"\n'
                    f'node_id = "ns=2;s=Pump1.{n}"\n' for c, n in zip(data.channels, names,
                                                                       strict=True))
    source = (f'[streams.source]\nkind = "opcua"\nendpoint = "{peer.endpoint}"\n'
              f'publishing_interval_ms = 15\nsampling_interval_ms = 0\nqueue_size = 1\n'
              f'security_policy = "Basic256Sha256"\nsecurity_mode = "SignAndEncrypt"\n'
              f'certificate_file = "{client_cert}"\nprivate_key_file = "{client_key}"\n'
              f'server_certificate_file = "{server_cert[0]}"\n'
              f'username = "edge"\npassword_file = "{password}"\n'
              f'reconnect_initial_s = 0.2\nreconnect_max_s = 1.0\n{nodes}')
    config = write_config(tmp_path / "agent.toml", source)
    # both take seconds to start (the agent its model, asyncua its address space): together
    agent = run_agent(["run", "--config", str(config)], tmp_path)
    try:
        peer.start()
        peer.write_many(dict(zip(names, data.values[0].tolist(), strict=True)),
                        dt.datetime.fromtimestamp(data.ts[0] - 1, dt.timezone.utc))
        wait_until(lambda: ("edge", True) in peer.logins or agent.proc.poll() is not None, 45,
                   "the agent's session", agent.stderr)
        assert agent.proc.poll() is None, agent.stderr()[-3000:]
        time.sleep(1.0)  # the subscription follows the session
        for k, (ts, row) in enumerate(zip(data.ts, data.values, strict=True)):
            peer.write_many(dict(zip(names, row.tolist(), strict=True)),
                            dt.datetime.fromtimestamp(ts, dt.timezone.utc))
            time.sleep(0.02)  # about one publishing interval per row
            if k % 50 == 0 and "ALERT " in agent.stdout():
                break  # the fault is found; the rest of the recording adds nothing here
        _alerts_inside_fault(tmp_path, agent, data.anomaly_start, data.anomaly_end)
        assert peer.logins and all(ok for _user, ok in peer.logins), peer.logins
        _stop(agent)
    finally:
        peer.stop()
