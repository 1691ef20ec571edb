"""OpcuaSource against a real asyncua server, under the real SourceSupervisor.

The server (:class:`tests.integration.opcua_peer.OpcuaPeer`) runs in a thread of this process;
anonymous for most tests, Basic256Sha256 SignAndEncrypt with self-signed certificates for the
secure one; stopped and restarted on the same port for the reconnect test; a plain socket that
accepts and never answers for the silent-server test.
"""

from __future__ import annotations

import datetime as dt
import math
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.sources.opcua import OpcuaSource
from agent.sources.opcua_config import OpcuaConfig
from tests.conftest import _free_port
from tests.integration.opcua_peer import OpcuaPeer, make_certificate
from tests.integration.supervised import Supervised
from tests.integration.test_serial_pty import wait_for

pytest.importorskip("asyncua")
pytestmark = pytest.mark.integration

NODES: list[dict[str, Any]] = [
    {"channel": "pressure", "node_id": "ns=2;s=Pump1.Pressure", "min": -10.0, "max": 100.0},
    {"channel": "flow", "browse_path": "0:Objects/2:Pump1/2:Flow"},
]


class Running(Supervised):
    """An OpcuaSource under a real SourceSupervisor, collecting readings."""

    def __init__(self, endpoint: str, nodes: list[dict[str, Any]] | None = None,
                 **overrides: Any) -> None:
        fields: dict[str, Any] = {
            "endpoint": endpoint, "nodes": nodes or NODES, "publishing_interval_ms": 50,
            "sampling_interval_ms": 20, "timeout_s": 1.0, "watchdog_s": 0.3,
            "reconnect_initial_s": 0.1, "reconnect_max_s": 0.5,
        }
        fields.update(overrides)
        self.config = OpcuaConfig.model_validate(fields, strict=False)
        super().__init__(OpcuaSource(self.config, "plc"), "plc")


@pytest.fixture
def peer() -> Iterator[OpcuaPeer]:
    server = OpcuaPeer(_free_port()).start()
    yield server
    server.stop()


def test_data_changes_become_readings_with_source_timestamps(peer: OpcuaPeer) -> None:
    run = Running(peer.endpoint)
    try:
        assert wait_for(lambda: len(run.readings) >= 1, timeout=15)
        assert run.source.channels == ("pressure", "flow")
        stamp = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.timezone.utc)
        peer.write("Pressure", 4.5, source_ts=stamp)
        peer.write("Flow", 12.25, source_ts=stamp + dt.timedelta(seconds=1))
        assert wait_for(lambda: [4.5, 12.25] in run.values(), timeout=10)
        last = next(r for r in run.readings if r.values.tolist() == [4.5, 12.25])
        assert last.ts == pytest.approx((stamp + dt.timedelta(seconds=1)).timestamp())
        assert run.sup.outage is None
        assert run.metric("edge_agent_readings_total") == len(run.readings)
    finally:
        run.close()


def test_one_node_mapped_to_two_channels_feeds_both(peer: OpcuaPeer) -> None:
    # the same node for two channels: each channel gets its values (it used to feed only the
    # last one, so the reading never had every channel and nothing was ever emitted)
    twice = {"channel": "pressure_copy", "node_id": "ns=2;s=Pump1.Pressure"}
    run = Running(peer.endpoint, nodes=[*NODES, twice])
    try:
        assert wait_for(lambda: len(run.readings) >= 1, timeout=15)
        assert run.source.channels == ("pressure", "flow", "pressure_copy")
        peer.write("Pressure", 3.5)
        assert wait_for(lambda: any(v[0] == v[2] == 3.5 for v in run.values()), timeout=10)
    finally:
        run.close()


def test_bad_uncertain_wrong_type_and_out_of_range_are_rejected(peer: OpcuaPeer) -> None:
    label = {"channel": "label", "node_id": "ns=2;s=Pump1.Label"}
    run = Running(peer.endpoint)
    typed = Running(peer.endpoint, nodes=[*NODES, label])
    try:
        assert wait_for(lambda: len(run.readings) >= 1, timeout=15)
        peer.write("Pressure", 1.0, status="BadSensorFailure")
        assert wait_for(lambda: run.rejected("status_bad") >= 1, timeout=10)
        peer.write("Pressure", 2.0, status="UncertainLastUsableValue")
        assert wait_for(lambda: run.rejected("status_uncertain") >= 1, timeout=10)
        peer.write("Pressure", 500.0)  # above max 100
        assert wait_for(lambda: run.rejected("out_of_range") >= 1, timeout=10)
        peer.write("Pressure", 7.0)
        assert wait_for(lambda: any(v[0] == 7.0 for v in run.values()), timeout=10)
        assert not any(v[0] in (1.0, 2.0, 500.0) for v in run.values())
        # a string node never yields a reading; the stream stays up
        assert wait_for(lambda: typed.rejected("wrong_type") >= 1, timeout=15)
        assert typed.readings == [] and typed.sup.outage is None
    finally:
        run.close()
        typed.close()


def test_non_finite_values_are_rejected_and_counted(peer: OpcuaPeer) -> None:
    run = Running(peer.endpoint, nodes=[{"channel": "flow", "node_id": "ns=2;s=Pump1.Flow"}])
    try:
        assert wait_for(lambda: len(run.readings) >= 1, timeout=15)
        for value in (math.nan, math.inf, -math.inf):
            before = run.rejected("non_finite")
            peer.write("Flow", value)
            assert wait_for(lambda b=before: run.rejected("non_finite") > b, timeout=10)
        peer.write("Flow", 3.5)
        assert wait_for(lambda: [3.5] in run.values(), timeout=10)
        assert run.rejected("non_finite") == 3
        assert all(math.isfinite(v[0]) for v in run.values())
        assert run.sup.outage is None and run.sup.is_alive()
    finally:
        run.close()


def test_server_restart_reconnects_and_resubscribes(peer: OpcuaPeer) -> None:
    run = Running(peer.endpoint)
    try:
        assert wait_for(lambda: len(run.readings) >= 1, timeout=15)
        peer.write("Pressure", 3.0)
        assert wait_for(lambda: any(v[0] == 3.0 for v in run.values()), timeout=10)
        peer.stop()
        assert wait_for(lambda: run.sup.outage is not None, timeout=15)
        peer.start()
        peer.write("Pressure", 9.0)  # a restarted server starts from its initial values
        assert wait_for(lambda: run.sup.outage is None, timeout=20)
        peer.write("Pressure", 8.0)
        assert wait_for(lambda: any(v[0] == 8.0 for v in run.values()), timeout=10)
        assert run.source.connects >= 2
        assert run.metric("edge_agent_polls_missed_total", reason="unreachable") >= 1
        assert run.metric("edge_agent_readings_total") == len(run.readings)
    finally:
        run.close()


def test_unknown_node_is_an_outage_with_its_reason(peer: OpcuaPeer) -> None:
    run = Running(peer.endpoint, nodes=[{"channel": "x", "node_id": "ns=2;s=Pump1.Nope"}])
    try:
        assert wait_for(lambda: run.sup.outage is not None, timeout=15)
        assert "BadNodeIdUnknown" in str(run.sup.outage)
        assert run.readings == []
    finally:
        run.close()


def test_server_that_never_answers_is_reported_and_stop_returns() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    held: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not done.is_set():
            try:
                held.append(listener.accept()[0])  # accepted, read, never answered
            except TimeoutError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    run = Running(f"opc.tcp://127.0.0.1:{port}/", timeout_s=0.5)
    try:
        assert wait_for(lambda: run.sup.outage is not None, timeout=15)
        assert "no answer" in str(run.sup.outage) or "Timeout" in str(run.sup.outage)
    finally:
        run.close()
        done.set()
        t.join(2)
        for s in held:
            s.close()
        listener.close()


def test_basic256sha256_sign_and_encrypt(tmp_path: Path) -> None:
    server_cert = make_certificate(tmp_path, "server", "urn:freeopcua:python:server")
    client_cert, client_key = make_certificate(tmp_path, "client",
                                               "urn:example.org:FreeOpcUa:opcua-asyncio")
    peer = OpcuaPeer(_free_port(), secure=True, certificate=server_cert).start()
    try:
        plain = Running(peer.endpoint)  # security None is not offered: refused
        secure = Running(peer.endpoint, security_policy="Basic256Sha256",
                         security_mode="SignAndEncrypt", certificate_file=str(client_cert),
                         private_key_file=str(client_key),
                         server_certificate_file=str(server_cert[0]))
        try:
            assert wait_for(lambda: len(secure.readings) >= 1, timeout=20)
            peer.write("Flow", 6.5)
            assert wait_for(lambda: any(v[1] == 6.5 for v in secure.values()), timeout=10)
            assert wait_for(lambda: plain.sup.outage is not None, timeout=15)
            assert plain.readings == []
        finally:
            plain.close()
            secure.close()
    finally:
        peer.stop()


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"nodes": [{"channel": "a"}]}, "exactly one of node_id and browse_path"),
        ({"nodes": [{"channel": "a", "node_id": "i=1", "browse_path": "0:Objects"}]},
         "exactly one"),
        ({"nodes": [{"channel": "a", "node_id": "i=1"}, {"channel": "a", "node_id": "i=2"}]},
         "named twice"),
        ({"security_policy": "Basic256Sha256"}, "needs certificate_file"),
        ({"username": "edge"}, "go together"),
        ({"endpoint": "http://x"}, "String should match pattern"),
    ],
)
def test_impossible_configs_are_refused(fields: dict[str, Any], message: str) -> None:
    base: dict[str, Any] = {"endpoint": "opc.tcp://127.0.0.1:4840",
                            "nodes": [{"channel": "a", "node_id": "i=1"}]}
    with pytest.raises(ValueError, match=message):
        OpcuaConfig.model_validate({**base, **fields})
