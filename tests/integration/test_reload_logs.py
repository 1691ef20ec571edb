"""The log lines an operator needs, from the real ``edge-agent`` process: state changes pass the
30 s de-duplication (issue: after a SIGHUP the restarted components' start lines and the final
``stopped: ...`` summary were swallowed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.integration.test_ops import (
    NotifySocket,
    _free_port,
    _write_config,
    notify,  # noqa: F401 - the fixture
)


def test_start_lines_and_summaries_after_each_sighup_reload(
    tmp_path: Path, notify: NotifySocket  # noqa: F811 - the fixture
) -> None:
    cfg = tmp_path / "agent.toml"
    _write_config(cfg, tmp_path / "state", _free_port())
    env = dict(os.environ, NOTIFY_SOCKET=str(notify.path))
    env.pop("WATCHDOG_USEC", None)
    with (tmp_path / "stderr.log").open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agent.cli", "run", "--config", str(cfg)],
            env=env, stdout=subprocess.DEVNULL, stderr=err,
        )
        try:
            ready = notify.wait_for("READY", timeout=60)
            for _ in range(2):  # two reloads, well inside the 30 s window
                proc.send_signal(signal.SIGHUP)
                deadline = time.monotonic() + 60
                while not notify.times("READY", after=ready + 1e-6):
                    assert time.monotonic() < deadline, "no READY after the reload"
                    time.sleep(0.05)
                ready = notify.times("READY", after=ready + 1e-6)[0]
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    lines = (tmp_path / "stderr.log").read_text().splitlines()

    def count(text: str) -> int:
        return sum(text in line for line in lines)

    assert count("SIGHUP received") == 2
    assert count("is valid; restarting") == 2
    assert count("stream demo: source simulator") == 3, lines  # each agent's start line
    assert count("running as device") == 3
    assert count("stopped: ") == 3, lines  # two reloads and the final stop
    assert count("stopping on SIGTERM; shutting down") == 1
    assert not [line for line in lines if "suppressed" in line]
