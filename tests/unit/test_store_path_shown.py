"""Where the store is: ``run`` logs it at start (one INFO line), ``check-config`` prints it.

A new user could not tell where the agent kept its alerts (the store path is relative to the
state dir, which is relative to the config file). The real CLI process, stopped with SIGTERM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from agent.cli import main

CONFIG = """
[agent]
state_dir = "state"
console_alerts = false
[store]
path = "alerts/gw.db"
[[streams]]
name = "pump"
[streams.source]
kind = "simulator"
"""


def _write(tmp_path: Path) -> tuple[Path, Path]:
    etc = tmp_path / "etc"
    etc.mkdir()
    config = etc / "agent.toml"
    config.write_text(CONFIG, encoding="utf-8")
    return config, etc / "state" / "alerts" / "gw.db"


def test_check_config_prints_the_store_path(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    _, store = _write(tmp_path)
    monkeypatch.chdir(tmp_path)  # relative paths are the config file's, not the shell's
    assert main(["check-config", "etc/agent.toml"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("OK: ")
    assert lines[1] == f"store: {store}"
    assert not store.exists()  # check-config creates nothing


def test_run_logs_the_store_path_at_start(tmp_path: Path) -> None:
    config, store = _write(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent.cli", "run", "--config", str(config)],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env, cwd=tmp_path,
    )
    lines: list[str] = []
    running = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if "running as device" in line:
                running.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert running.wait(240), "".join(lines)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, "".join(lines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    reader.join(10)
    shown = [line for line in lines if " agent: store " in line]
    assert len(shown) == 1, "".join(lines)
    assert " INFO " in shown[0]
    assert f"store {store} (alerts, aggregates)" in shown[0]
    assert store.is_file()
