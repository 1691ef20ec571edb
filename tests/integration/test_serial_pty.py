"""SerialSource against real pseudo-terminals: pyserial opens the slave, the test is the device.

The port-vanishing test uses ``socat`` to make a symlinked pty pair it can kill and restart, as
a USB serial adapter disappears and comes back.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
import tty
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from agent.metrics import Metrics
from agent.records import Reading
from agent.services.supervisor import SourceSupervisor
from agent.sources.serial import SerialConfig, SerialSource

pytestmark = pytest.mark.integration

CHANNELS = ["a", "b", "c"]


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0, every: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every)
    return predicate()


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    v = metrics.registry.get_sample_value(name, labels)
    return 0.0 if v is None else v


class Running:
    """A SerialSource under a real SourceSupervisor, collecting readings."""

    def __init__(self, port: str, **overrides: object) -> None:
        cfg = SerialConfig(
            port=port,
            channels=CHANNELS,
            read_timeout_s=0.1,
            reconnect_initial_s=0.05,
            reconnect_max_s=0.2,
            max_line_bytes=64,
            **overrides,  # type: ignore[arg-type]
        )
        self.metrics = Metrics(CollectorRegistry())
        self.stop = threading.Event()
        self.readings: list[Reading] = []
        self.readings_before = 0.0
        self.source = SerialSource(cfg, "pty")
        self.sup = SourceSupervisor(
            self.source,
            self.readings.append,
            self.metrics,
            self.stop,
            logging.getLogger("test.serial"),
            backoff_initial_s=0.05,
            backoff_max_s=0.2,
        )
        self.sup.start()

    def rejected(self, reason: str) -> float:
        return sample(
            self.metrics, "edge_agent_records_rejected_total", stream="pty", reason=reason
        )

    def values(self) -> list[list[float]]:
        return [r.values.tolist() for r in self.readings]

    def sync(self, write: Callable[[bytes], object], marker: bytes = b"0,0,0\n") -> None:
        """Send a marker line until it arrives (the port is open), then forget the marker.

        pyserial flushes the input on open, so bytes sent earlier would be lost.
        """
        assert wait_for(
            lambda: bool(write(marker)) and wait_for(lambda: bool(self.readings), 0.1),
            timeout=5.0,
        ), "the source never delivered the marker line"
        time.sleep(0.05)
        self.readings.clear()
        self.readings_before = sample(self.metrics, "edge_agent_readings_total", stream="pty")

    def close(self) -> None:
        self.stop.set()
        self.sup.join(3.0)
        assert not self.sup.is_alive(), "source thread did not stop within 3 s"


@pytest.fixture
def pty_pair() -> Iterator[tuple[int, str]]:
    master, slave = os.openpty()
    tty.setraw(slave)
    path = os.ttyname(slave)
    try:
        yield master, path
    finally:
        for fd in (master, slave):
            with contextlib.suppress(OSError):
                os.close(fd)


def test_fragments_garbage_and_non_finite_over_a_pty(pty_pair: tuple[int, str]) -> None:
    master, path = pty_pair
    run = Running(path)
    try:
        run.sync(lambda b: os.write(master, b))
        for chunk in [b"1.0,2", b".0,3.0\r", b"\n4,5", b",6\n", b"\xff\xfegarbage\n"]:
            os.write(master, chunk)
            time.sleep(0.02)
        os.write(master, b"nan,1,2\n1,1e999,2\n1,x,2\n1,2\n" + b"9" * 200 + b"\n7,8,9\n")
        assert wait_for(lambda: len(run.readings) >= 3)
        assert run.values() == [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]]
        assert wait_for(lambda: run.rejected("too_long") == 1)
        assert run.rejected("not_utf8") == 1
        assert run.rejected("non_finite") == 2
        assert run.rejected("non_numeric") == 1
        assert run.rejected("field_count") == 1
        assert all(r.stream == "pty" and r.ts > 1.6e9 for r in run.readings)
        total = sample(run.metrics, "edge_agent_readings_total", stream="pty")
        assert total - run.readings_before == 3
    finally:
        run.close()


def test_kv_with_timestamps_over_a_pty(pty_pair: tuple[int, str]) -> None:
    master, path = pty_pair
    run = Running(path, format="kv", timestamp_field=True)
    try:
        run.sync(lambda b: os.write(master, b), marker=b"ts=1 a=0 b=0 c=0\n")
        os.write(master, b"ts=1700000000.5 c=3 b=2 a=1 rssi=-60\nts=1700000001 a=1 b=2\n")
        assert wait_for(lambda: len(run.readings) == 1 and run.rejected("missing_channel") == 1)
        assert run.readings[0].ts == 1700000000.5
        assert run.values() == [[1.0, 2.0, 3.0]]
    finally:
        run.close()


def test_stale_partial_line_is_discarded_not_joined(pty_pair: tuple[int, str]) -> None:
    """A line's first half, then a pause longer than the inter-byte timeout, then its second
    half: the halves are not joined into one reading; the stale half is counted."""
    master, path = pty_pair
    run = Running(path, inter_byte_timeout_s=0.5)
    try:
        run.sync(lambda b: os.write(master, b))
        os.write(master, b"1.0,2.0,")
        assert wait_for(lambda: run.rejected("stale_partial") == 1, timeout=10.0), (
            "the stale half line was not discarded on a quiet port"
        )
        os.write(master, b"3.0\n4,5,")
        time.sleep(1.5)  # longer than the timeout: this half goes stale too
        os.write(master, b"6\n7,8,9\n")
        assert wait_for(lambda: len(run.readings) >= 1 and run.rejected("stale_partial") == 2)
        assert run.values() == [[7.0, 8.0, 9.0]]
        assert run.rejected("field_count") == 2  # "3.0" and "6": tails on their own
    finally:
        run.close()


def test_pty_closing_is_survived_and_counted(pty_pair: tuple[int, str]) -> None:
    master, path = pty_pair
    run = Running(path)
    try:
        run.sync(lambda b: os.write(master, b))
        os.close(master)  # the device side vanishes; the pts node goes with it
        assert wait_for(
            lambda: sample(run.metrics, "edge_agent_source_errors_total", stream="pty") >= 3
        ), "expected repeated failed reconnect attempts"
        assert run.sup.is_alive()
        assert sample(run.metrics, "edge_agent_source_up", stream="pty") == 0
    finally:
        run.close()


SOCAT = shutil.which("socat")


class Socat:
    """A socat pty pair with stable symlinks: ``dev`` for the source, ``peer`` for the test."""

    def __init__(self, directory: Path) -> None:
        self.dev = directory / "ttyV0"
        self.peer = directory / "ttyV1"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        assert SOCAT is not None
        self.proc = subprocess.Popen(
            [
                SOCAT,
                f"pty,raw,echo=0,link={self.dev}",
                f"pty,raw,echo=0,link={self.peer}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        assert wait_for(lambda: self.dev.exists() and self.peer.exists(), timeout=5.0)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(5.0)
        self.proc = None


@pytest.mark.skipif(SOCAT is None, reason="socat not installed (apt-get install socat)")
def test_port_vanishes_and_returns_with_socat(tmp_path: Path) -> None:
    socat = Socat(tmp_path)
    socat.start()
    run = Running(str(socat.dev))
    peer: int | None = None
    try:
        peer = os.open(socat.peer, os.O_RDWR | os.O_NOCTTY)

        def delivered(line: bytes, count: int) -> bool:
            assert peer is not None
            os.write(peer, line)  # repeat: bytes sent before the port is (re)opened are flushed
            return wait_for(lambda: len(run.readings) >= count, timeout=0.2)

        assert wait_for(lambda: delivered(b"1,2,3\n", 1), timeout=5.0)
        os.close(peer)
        peer = None

        socat.kill()  # the USB adapter is unplugged
        assert wait_for(
            lambda: sample(run.metrics, "edge_agent_source_errors_total", stream="pty") >= 2
        )
        assert sample(run.metrics, "edge_agent_source_up", stream="pty") == 0
        assert run.sup.is_alive()
        before = len(run.readings)

        socat.start()  # ... and plugged in again
        peer = os.open(socat.peer, os.O_RDWR | os.O_NOCTTY)
        assert wait_for(lambda: delivered(b"7,8,9\n", before + 1), timeout=5.0)
        assert run.readings[-1].values.tolist() == [7.0, 8.0, 9.0]
        assert wait_for(lambda: sample(run.metrics, "edge_agent_source_up", stream="pty") == 1)
        assert run.sup.is_alive()
    finally:
        if peer is not None:
            os.close(peer)
        run.close()
        socat.kill()


# --- line settings -----------------------------------------------------------------------------


def test_line_settings_reach_the_port(pty_pair: tuple[int, str]) -> None:
    import termios  # noqa: PLC0415

    master, path = pty_pair
    run = Running(path, bytesize=7, stopbits=2, xonxoff=True, rtscts=True)
    try:
        run.sync(lambda b: os.write(master, b))
        fd = os.open(path, os.O_RDWR | os.O_NOCTTY)
        try:
            iflag, _oflag, cflag, *_ = termios.tcgetattr(fd)
        finally:
            os.close(fd)
        # (a Linux pty forces CS8 and no parity whatever is asked: bytesize is not visible here)
        assert cflag & termios.CSTOPB
        assert cflag & termios.CRTSCTS
        assert iflag & termios.IXON and iflag & termios.IXOFF
    finally:
        run.close()


def test_rs485_on_a_port_without_it_is_a_config_problem(pty_pair: tuple[int, str]) -> None:
    from agent.errors import ConfigError  # noqa: PLC0415

    _master, path = pty_pair
    cfg = SerialConfig.model_validate(
        {"port": path, "channels": CHANNELS, "rs485": {"delay_before_tx_s": 0.001}},
        strict=False)
    with pytest.raises(ConfigError, match="RS-485 mode not supported by this port"):
        SerialSource(cfg, "pty").run(lambda r: None, lambda e: None, threading.Event())
