"""ModbusSource against pymodbus's own server: over TCP, and over RTU on a socat pty pair.

Every test runs the source under the real SourceSupervisor (counters, outage reporting) and
reads a real server: :class:`agent.sources.modbus_sim.SimServer` (pymodbus ModbusTcpServer /
ModbusSerialServer) or, for the server that never answers, a plain socket that accepts and
reads but never writes.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.sources.modbus import ModbusSource
from agent.sources.modbus_config import ModbusConfig
from agent.sources.modbus_map import encode_float32
from agent.sources.modbus_sim import SimServer
from tests.conftest import _free_port
from tests.integration.supervised import Supervised
from tests.integration.test_serial_pty import SOCAT, Socat, wait_for

pytestmark = pytest.mark.integration

MAP: list[dict[str, Any]] = [
    {"name": "pressure", "address": 0, "type": "float32"},
    {"name": "temp", "address": 2, "type": "int16", "scale": 0.1},
    {"name": "count", "address": 3, "type": "uint32", "word_order": "little"},
    {"name": "status_run", "address": 5, "type": "bool", "bit": 0},
    {"name": "status_mode", "address": 5, "type": "bits", "bit": 4, "bits": 3},
    {"name": "far", "address": 40, "type": "uint16", "min": 0, "max": 1000},
    {"name": "door", "table": "coil", "address": 1, "type": "bool"},
]


def fill(server: SimServer) -> None:
    server.set_holding(0, encode_float32(2.5))
    server.set_holding(2, [(-123) & 0xFFFF])  # int16 -12.3 after scale
    server.set_holding(3, [0x5678, 0x1234])  # uint32 0x12345678, low word first
    server.set_holding(5, [0b1010001])  # bit 0 = 1, bits 4..6 = 0b101
    server.set_holding(40, [77])


EXPECTED = [2.5, -12.3, 0x12345678, 1.0, 5.0, 77.0, 1.0]


class Running(Supervised):
    """A ModbusSource under a real SourceSupervisor, collecting readings."""

    def __init__(self, **overrides: Any) -> None:
        fields: dict[str, Any] = {
            "poll_interval_s": 0.05, "timeout_s": 0.3, "reconnect_initial_s": 0.05,
            "reconnect_max_s": 0.2, "channels": MAP,
        }
        fields.update(overrides)
        self.config = ModbusConfig.model_validate(fields, strict=False)
        super().__init__(ModbusSource(self.config, "plc"), "plc", join_s=5.0)


@pytest.fixture
def server() -> Iterator[SimServer]:
    sim = SimServer(_free_port(), coils=[False, True, False, False])
    fill(sim)
    sim.start()
    yield sim
    sim.stop()


def test_tcp_map_is_coalesced_decoded_and_timed(server: SimServer) -> None:
    run = Running(port=server.port)
    try:
        assert [(b.table, b.address, b.count) for b in run.source.blocks] == [
            ("coil", 1, 1), ("holding", 0, 6), ("holding", 40, 1)]
        assert wait_for(lambda: len(run.readings) >= 5)
        assert run.readings[-1].values.tolist() == pytest.approx(EXPECTED)
        assert run.source.channels == tuple(ch["name"] for ch in MAP)
        assert run.metric("edge_agent_poll_jitter_seconds_count") >= 5
        assert run.metric("edge_agent_poll_duration_seconds_count") >= 5
        stamps = [r.ts for r in run.readings]
        assert stamps == sorted(stamps)
    finally:
        run.close()


def test_tcp_server_stops_and_returns(server: SimServer) -> None:
    run = Running(port=server.port)
    try:
        assert wait_for(lambda: len(run.readings) >= 3)
        server.stop()
        assert wait_for(lambda: run.sup.outage is not None)
        before = len(run.readings)
        assert wait_for(lambda: run.metric("edge_agent_source_errors_total") >= 3)
        server.start()
        assert wait_for(lambda: len(run.readings) >= before + 5, timeout=10.0)
        assert run.sup.outage is None
        assert run.metric("edge_agent_polls_missed_total", reason="unreachable") >= 1
        # every reading the source accepted reached the consumer, and all are whole
        assert run.metric("edge_agent_readings_total") == len(run.readings)
        assert all(r.values.tolist() == pytest.approx(EXPECTED) for r in run.readings)
    finally:
        run.close()


def test_exception_responses_and_range_are_rejected_by_reason(server: SimServer) -> None:
    run = Running(port=server.port)
    try:
        assert wait_for(lambda: len(run.readings) >= 2)
        server.exception_code = 2
        assert wait_for(lambda: run.rejected("exception_illegal_address") >= 3)
        server.exception_code = 6
        assert wait_for(lambda: run.rejected("exception_device_busy") >= 3)
        server.exception_code = None
        server.set_holding(40, [5000])  # above max 1000
        assert wait_for(lambda: run.rejected("out_of_range") >= 3)
        server.set_holding(0, encode_float32(float("nan")))
        server.set_holding(40, [7])
        assert wait_for(lambda: run.rejected("non_finite") >= 3)
        server.set_holding(0, encode_float32(1.0))
        count = len(run.readings)
        assert wait_for(lambda: len(run.readings) >= count + 3)
        assert run.readings[-1].values[0] == 1.0 and run.readings[-1].values[5] == 7.0
        assert run.sup.outage is None and run.sup.is_alive()
    finally:
        run.close()


def test_illegal_address_from_the_map(server: SimServer) -> None:
    far = [*MAP, {"name": "beyond", "address": 300}]  # the server has 256 registers
    run = Running(port=server.port, channels=far)
    try:
        assert wait_for(lambda: run.rejected("exception_illegal_address") >= 3)
        assert run.readings == []
    finally:
        run.close()


def _late_response_is_never_a_later_answer(server: SimServer, **transport: Any) -> None:
    server.stamp_register = 10
    run = Running(channels=[{"name": "request", "address": 10}], timeout_s=0.4, **transport)
    try:
        assert wait_for(lambda: len(run.readings) >= 3, timeout=10.0)
        for _ in range(3):
            server.delay_s, server.delay_count = 0.6, 1
            before = run.rejected("timeout")
            assert wait_for(lambda b=before: run.rejected("timeout") > b, timeout=10.0)
            count = len(run.readings)
            assert wait_for(lambda c=count: len(run.readings) >= c + 3, timeout=10.0)
        accepted = {int(r.values[0]) for r in run.readings}
        assert len(server.delayed) == 3
        assert not accepted & set(server.delayed), (sorted(accepted), server.delayed)
    finally:
        run.close()


def test_tcp_late_response_is_never_taken_for_a_later_request(server: SimServer) -> None:
    _late_response_is_never_a_later_answer(server, port=server.port)


class Silent:
    """A TCP server that accepts connections and reads requests but never answers."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.sock.settimeout(0.1)
        conns = []
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            conn.setblocking(False)
            conns.append(conn)
        for conn in conns:
            conn.close()
        self.sock.close()


def test_server_that_accepts_and_never_answers() -> None:
    silent = Silent()
    run = Running(port=silent.port, timeout_s=0.2, reconnect_after_timeouts=2)
    try:
        assert wait_for(lambda: run.sup.outage is not None, timeout=10.0)
        assert run.sup.outage is not None and "without a response" in run.sup.outage[0]
        assert run.rejected("timeout") >= 1
        assert silent.accepted >= 2  # a new connection after each timeout
        assert run.readings == []
    finally:
        run.close()
        silent.stop.set()
        silent.thread.join(5.0)


def test_nothing_listening_is_an_outage_not_a_crash() -> None:
    run = Running(port=_free_port())
    try:
        assert wait_for(lambda: run.metric("edge_agent_source_errors_total") >= 3)
        assert run.sup.outage is not None and "cannot connect" in run.sup.outage[0]
        assert run.sup.is_alive()
    finally:
        run.close()


# --- RTU on a socat pseudo-terminal pair -------------------------------------------------------


@pytest.fixture
def rtu(tmp_path: Path) -> Iterator[tuple[Socat, SimServer]]:
    if SOCAT is None:
        pytest.skip("socat not installed (apt-get install socat)")
    pair = Socat(tmp_path)
    pair.start()
    # parity N: a Linux pseudo-terminal refuses PARENB (tcsetattr EINVAL)
    sim = SimServer(transport="rtu", serial_port=str(pair.peer), baudrate=115200, parity="N",
                    coils=[False, True])
    fill(sim)
    sim.start()
    yield pair, sim
    sim.stop()
    pair.kill()


def _rtu(pair: Socat) -> dict[str, Any]:
    return {"transport": "rtu", "serial_port": str(pair.dev), "baudrate": 115200,
            "parity": "N", "stopbits": 1, "bytesize": 8}


def test_rtu_reads_and_survives_a_device_restart(rtu: tuple[Socat, SimServer]) -> None:
    pair, server = rtu
    run = Running(**_rtu(pair), timeout_s=0.2, reconnect_after_timeouts=2)
    try:
        assert wait_for(lambda: len(run.readings) >= 3, timeout=10.0)
        assert run.readings[-1].values.tolist() == pytest.approx(EXPECTED)
        server.stop()
        assert wait_for(lambda: run.rejected("timeout") >= 2, timeout=10.0)
        assert wait_for(lambda: run.sup.outage is not None, timeout=10.0)
        count = len(run.readings)
        server.start()
        assert wait_for(lambda: len(run.readings) >= count + 3, timeout=15.0)
        assert run.sup.outage is None
        assert all(r.values.tolist() == pytest.approx(EXPECTED) for r in run.readings)
    finally:
        run.close()


def test_rtu_device_restart_every_poll_slot_is_made_or_counted_missed(
        rtu: tuple[Socat, SimServer]) -> None:
    # While the device is down, each timed-out poll waits timeout_s and then up to
    # late_answer_s for a late answer (about 1 s here, 20 poll slots): the slots it spans and
    # those of the reconnect backoff must show up in edge_agent_polls_missed_total, so that
    # polls made + polls missed covers the outage's poll grid.
    pair, server = rtu
    interval = 0.05
    run = Running(**_rtu(pair), poll_interval_s=interval, timeout_s=0.2,
                  reconnect_after_timeouts=2)
    source = run.source

    def accounted() -> int:
        return int(source.polls + sum(source.missed.values()))

    try:
        assert wait_for(lambda: len(run.readings) >= 10, timeout=10.0)
        t0, before, kept = time.monotonic(), accounted(), len(run.readings)
        server.stop()
        assert wait_for(lambda: run.sup.outage is not None, timeout=10.0)
        time.sleep(1.5)
        server.start()
        assert wait_for(lambda: run.sup.outage is None and len(run.readings) >= kept + 10,
                        timeout=15.0)
        slots, made_or_missed = (time.monotonic() - t0) / interval, accounted() - before
        reconnects = run.metric("edge_agent_source_errors_total")
        # each reconnect restarts the grid (up to one slot lost to rounding), +-2 at the edges
        assert slots - 2 - reconnects <= made_or_missed <= slots + 2, (
            slots, made_or_missed, source.polls, source.missed, reconnects)
        assert source.missed["unreachable"] >= 1
        assert run.metric("edge_agent_polls_missed_total", reason="unreachable") == \
            source.missed["unreachable"]
        # nothing accepted is lost: every poll that was made is a reading or a timeout
        timeouts = run.rejected("timeout")
        assert timeouts >= 2
        assert wait_for(lambda: source.polls - 1 <= len(run.readings) + timeouts <= source.polls)
        assert all(r.values.tolist() == pytest.approx(EXPECTED) for r in run.readings)
    finally:
        run.close()


def test_rtu_line_the_port_refuses_is_named(tmp_path: Path) -> None:
    # parity E on a pty: pymodbus only logs the cause; the outage said "connection refused or
    # unreachable", which is no reason for a serial line
    if SOCAT is None:
        pytest.skip("socat not installed (apt-get install socat)")
    pair = Socat(tmp_path)
    pair.start()
    run = Running(**{**_rtu(pair), "parity": "E", "baudrate": 19200})
    try:
        assert wait_for(lambda: run.sup.outage is not None, timeout=10.0)
        assert run.sup.outage is not None
        assert "cannot open serial port at 19200 8E1" in run.sup.outage[0]
        assert "Invalid argument" in run.sup.outage[0]
    finally:
        run.close()
        pair.kill()


def test_rtu_late_response_is_never_taken_for_a_later_request(
    rtu: tuple[Socat, SimServer],
) -> None:
    pair, server = rtu
    _late_response_is_never_a_later_answer(server, **_rtu(pair), reconnect_after_timeouts=5)


# --- a hand-made server for malformed answers ------------------------------------------------


class Crafted:
    """A Modbus TCP server that answers each read request with a frame built by ``mode``:
    ``short`` (one register fewer than asked), ``function`` (an answer to function 4) or
    ``garbage`` (bytes that are no Modbus frame)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _answer(self, request: bytes) -> bytes:
        tid, unit, function = request[0:2], request[6], request[7]
        count = int.from_bytes(request[10:12], "big")
        if self.mode == "garbage":
            return b"\xff" * 12
        if self.mode == "function":
            function = 4
        n = count - 1 if self.mode == "short" else count
        pdu = bytes([function, 2 * n]) + b"\x00\x07" * n
        return tid + b"\x00\x00" + (len(pdu) + 1).to_bytes(2, "big") + bytes([unit]) + pdu

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(0.1)
                while not self.stop.is_set():
                    try:
                        request = conn.recv(12)
                    except TimeoutError:
                        continue
                    except OSError:
                        break
                    if len(request) < 12:
                        break
                    conn.sendall(self._answer(request))
        self.sock.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5.0)


@pytest.mark.parametrize(("mode", "reason"), [
    ("short", "short_read"), ("function", "bad_response"), ("garbage", "timeout"),
])
def test_malformed_answers_are_rejected_by_reason(mode: str, reason: str) -> None:
    crafted = Crafted(mode)
    run = Running(port=crafted.port, timeout_s=0.2,
                  channels=[{"name": "a", "address": 0}, {"name": "b", "address": 1}])
    try:
        assert wait_for(lambda: run.rejected(reason) >= 3, timeout=10.0)
        assert run.readings == []
        assert run.sup.is_alive()
    finally:
        run.close()
        crafted.close()


def test_slow_polls_are_overruns_and_skipped_due_times_are_counted(server: SimServer) -> None:
    server.delay_s, server.delay_count = 0.12, 10_000
    run = Running(port=server.port, poll_interval_s=0.05, timeout_s=1.0,
                  channels=[{"name": "a", "address": 0}])
    try:
        assert wait_for(lambda: run.metric("edge_agent_poll_overruns_total") >= 3)
        assert run.metric("edge_agent_polls_missed_total", reason="overrun") >= 3
        assert run.readings  # slow, but every poll is answered and accepted
        assert run.rejected("timeout") == 0
    finally:
        run.close()


def test_rtu_answer_to_a_resent_request_is_never_taken_for_the_next_poll(
    rtu: tuple[Socat, SimServer],
) -> None:
    # Each delayed answer comes 0.9 s after its request timed out, well inside late_answer_s
    # (4 s): the source must wait for it before it sends the resend or the next poll, and drop
    # it. The margins make the outcome independent of load: a stale answer taken would need a
    # thread stalled for about a second. (The drain this replaced lost a race by design.)
    pair, server = rtu
    server.stamp_register = 10
    run = Running(**_rtu(pair), channels=[{"name": "request", "address": 10}], timeout_s=0.3,
                  retries=1, reconnect_after_timeouts=5, late_answer_s=4.0)
    source = run.source
    assert isinstance(source, ModbusSource)
    try:
        assert wait_for(lambda: len(run.readings) >= 3, timeout=10.0)
        for _ in range(2):
            first = server.requests + 1
            server.delay_s, server.delay_count = 1.2, 2  # the request and its resend are late
            assert wait_for(lambda f=first: server.requests >= f + 4, timeout=15.0)
            count = len(run.readings)
            assert wait_for(lambda c=count: len(run.readings) >= c + 3, timeout=10.0)
        accepted = [int(r.values[0]) for r in run.readings]
        assert len(server.delayed) == 4
        assert not set(server.delayed) & set(accepted), (accepted, server.delayed)
        # each delayed answer came and was dropped (a busy machine may add a timeout of its own)
        assert source.late_answers >= 4
        assert run.rejected("timeout") >= 2  # the polls whose request and resend were late
        assert accepted == sorted(set(accepted))  # every reading newer than the one before
    finally:
        run.close()
