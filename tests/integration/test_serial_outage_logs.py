"""The reported scenario of the log de-duplication through a real ``edge-agent run`` and a pty
peer: five serial outages, well inside the 30 s de-duplication window, give exactly five
"source down" and five "source recovered" lines (issue 20, item 14: the agent logged 4 and 3;
state changes are never de-duplicated, only repeats of the same message are).

``socat`` makes a pty pair with stable symlinks; killing it makes the port vanish as an
unplugged USB adapter does, starting it again brings it back.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.test_serial_pty import SOCAT, Socat

pytestmark = pytest.mark.integration

OUTAGES = 5
#: The shipped model's channels (SKAB).
CHANNELS = ["Accelerometer1RMS", "Accelerometer2RMS", "Current", "Pressure", "Temperature",
            "Thermocouple", "Voltage", "Volume Flow RateRMS"]


def _until(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.skipif(SOCAT is None, reason="socat not installed (apt-get install socat)")
def test_five_serial_outages_give_five_down_and_five_recovered_lines(tmp_path: Path) -> None:
    socat = Socat(tmp_path)
    socat.start()
    cfg = tmp_path / "agent.toml"
    cfg.write_text(
        f'[agent]\ndevice_id = "gw-test"\nstate_dir = "{tmp_path / "state"}"\n'
        'console_alerts = false\n[mqtt]\nenabled = false\n'
        '[[streams]]\nname = "line1"\n'
        f'[streams.source]\nkind = "serial"\nport = "{socat.dev}"\n'
        f'channels = {json.dumps(CHANNELS)}\nread_timeout_s = 0.1\n'
        'reconnect_initial_s = 0.05\nreconnect_max_s = 0.2\n'
    )
    stderr = tmp_path / "stderr.log"

    def count(text: str) -> int:
        return sum(text in line for line in stderr.read_text().splitlines())

    def feed_until(text: str, n: int) -> Callable[[], bool]:
        def check() -> bool:  # keep writing: bytes sent before the port is opened are flushed
            try:
                fd = os.open(socat.peer, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
            except OSError:
                return False
            try:
                os.write(fd, b"0.2,0.2,1.5,0.1,70,25,230,32\n")
            except OSError:
                pass
            finally:
                os.close(fd)
            return count(text) >= n
        return check

    env = dict(os.environ)
    env.pop("NOTIFY_SOCKET", None)
    with stderr.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "agent.cli", "run", "--config", str(cfg)],
                                env=env, stdout=subprocess.DEVNULL, stderr=err)
    try:
        _until(lambda: count("running as device") == 1, "the agent's start", 60.0)
        started = time.monotonic()
        for i in range(1, OUTAGES + 1):
            socat.kill()  # the adapter is unplugged
            _until(lambda i=i: count("source down") >= i, f"outage {i} logged")  # type: ignore[misc]
            socat.start()  # and plugged in again
            _until(feed_until("source recovered", i), f"recovery {i} logged")
        assert time.monotonic() - started < 30.0, "the outages were not inside the 30 s window"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        socat.kill()
    lines = stderr.read_text().splitlines()
    assert count("stream line1: source down") == OUTAGES, lines
    assert count("stream line1: source recovered") == OUTAGES, lines
    assert count("stopped: ") == 1, lines
