"""Shared pytest fixtures. One section per peer; keep each section self-contained."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

# --- MQTT: a real mosquitto broker ---------------------------------------------------------------

MOSQUITTO_BIN = os.environ.get("MOSQUITTO_BIN", "/usr/sbin/mosquitto")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


class MosquittoBroker:
    """A mosquitto process on a fixed free port; ``stop``/``start`` keep the port.

    Args:
        binary: The mosquitto executable.
        workdir: Holds the generated config, the log and (with persistence) the database.
        persistence: Keep sessions and queued QoS 1 messages across ``stop``/``start``
            (mosquitto saves them on SIGTERM).
        extra_config: Lines appended to the config, e.g. a second (TLS) listener.
        extra: More lines of mosquitto.conf (the same as ``extra_config``).
    """

    def __init__(self, binary: str, workdir: Path, *, persistence: bool = False,
                 extra_config: Sequence[str] = (), extra: tuple[str, ...] = ()) -> None:
        self.binary = binary
        self.host = "127.0.0.1"
        self.port = _free_port()
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / "mosquitto.log"
        self.config_path = workdir / "mosquitto.conf"
        lines = [
            f"listener {self.port} {self.host}",
            "allow_anonymous true",
            f"persistence {'true' if persistence else 'false'}",
            "log_dest stdout",
            "log_type all",
        ]
        if persistence:
            lines += [f"persistence_location {workdir}/", "persistence_file mosquitto.db"]
        lines += extra  # e.g. "max_packet_size 600"
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            lines.append("user root")  # otherwise it drops to 'mosquitto' and cannot write here
        lines += extra_config
        self.config_path.write_text("\n".join(lines) + "\n")
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout_s: float = 5.0) -> None:
        """Start the broker and wait until the port accepts connections."""
        if self.running:
            return
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                [self.binary, "-c", str(self.config_path)], stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"mosquitto exited early:\n{self.log_tail()}")
            if _accepts(self.host, self.port):
                return
            time.sleep(0.02)
        self.kill()
        raise RuntimeError(f"mosquitto did not listen on {self.port} in {timeout_s} s")

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop gracefully (SIGTERM; saves persistence) and wait for the process to exit."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def kill(self) -> None:
        """Kill at once (SIGKILL): no persistence saved, connections reset."""
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait()
            self._proc = None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _require_mosquitto() -> str:
    binary = MOSQUITTO_BIN if os.path.exists(MOSQUITTO_BIN) else shutil.which("mosquitto")
    if binary is None:
        reason = f"mosquitto broker not found at {MOSQUITTO_BIN} nor on PATH"
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (CI must install it: apt-get install mosquitto)")
        pytest.skip(f"{reason}; install it (apt-get install mosquitto) to run MQTT tests")
    return binary


def _broker(tmp_path: Path, name: str, *, persistence: bool) -> Iterator[MosquittoBroker]:
    broker = MosquittoBroker(_require_mosquitto(), tmp_path / name, persistence=persistence)
    broker.start()
    try:
        yield broker
    finally:
        broker.kill()


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[MosquittoBroker]:
    """A running mosquitto on 127.0.0.1:<free port>, no persistence; killed at teardown."""
    yield from _broker(tmp_path, "mosquitto", persistence=False)


@pytest.fixture
def mosquitto_persistent(tmp_path: Path) -> Iterator[MosquittoBroker]:
    """Like ``mosquitto`` but with persistence: sessions and queued messages survive a restart."""
    yield from _broker(tmp_path, "mosquitto-persistent", persistence=True)
