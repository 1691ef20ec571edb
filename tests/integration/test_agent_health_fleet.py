"""Device health end to end: a real ``edge-agent run`` (a simulator stream, ``[fleet]`` with a
short ``health_interval_s``) reports to a real ``edge-fleet serve --offline-after 4``.

Its reports turn the enrolled device ``online`` (with the agent's own version and streams) and
keep it online for longer than the silence limit while it runs; once the agent stops, the fleet
lists it ``offline`` no sooner than ``--offline-after`` past its last contact, and the
housekeeping sweep records it (one ``device_offline`` webhook, received by a real HTTP server).
tests/fleet/test_fleet_health.py covers the same route with the device client alone.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from agent import __version__
from tests.fleet.live import Receiver, wait_for
from tests.integration.fleet_peer import ADMIN_TOKEN, FleetProcess

pytestmark = pytest.mark.integration

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
OFFLINE_AFTER_S = 4.0
#: The agent's model load and first report on a loaded 2-core machine.
START_S = 180.0
#: The sweep runs every Settings.housekeeping_s (10 s); then the webhook is delivered.
SWEEP_S = 60.0


def _agent_command() -> list[str]:
    exe = shutil.which("edge-agent")
    return [exe] if exe else [sys.executable, "-m", "agent.cli"]


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[FleetProcess]:
    proc = FleetProcess(tmp_path / "fleet", serve_args=["--offline-after", str(OFFLINE_AFTER_S)])
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def _device(fleet: FleetProcess) -> dict[str, Any]:
    listed = requests.get(f"{fleet.url}/v1/devices?device=gw1", headers=ADMIN, timeout=10)
    listed.raise_for_status()
    devices = listed.json()["devices"]
    assert len(devices) == 1, devices
    return dict(devices[0])


def _when(iso: str) -> float:
    return dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def _last_contact(d: dict[str, Any]) -> float:
    return max(_when(t) for t in (d["last_seen"], d["health_received_at"]) if t)


def test_a_real_agents_reports_keep_it_online_and_its_silence_turns_it_offline(
    tmp_path: Path, fleet: FleetProcess,
) -> None:
    receiver = Receiver().start()
    hook = requests.post(f"{fleet.url}/v1/webhooks", headers=ADMIN, timeout=10, json={
        "url": receiver.url, "events": ["device_offline"], "secret": "health-e2e-" + "s" * 16})
    assert hook.status_code == 201, hook.text
    assert _device(fleet)["state"] == "unknown"  # enrolled, never heard from
    config = tmp_path / "agent.toml"
    config.write_text(f"""
[agent]
device_id = "gw1"
state_dir = "{tmp_path / 'state'}"
console_alerts = false
[[streams]]
name = "pump1"
model = "builtin:skab-wstat"
[streams.source]
kind = "simulator"
speed = 1.0
[fleet]
enabled = true
url = "{fleet.url}"
token_env = "EDGE_TEST_TOKEN"
interval_s = 0.5
health_interval_s = 0.5
""")
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
    env["EDGE_TEST_TOKEN"] = fleet.token
    err = tmp_path / "agent.stderr"
    with err.open("wb") as fh:
        proc = subprocess.Popen([*_agent_command(), "run", "--config", str(config)],
                                stdout=subprocess.DEVNULL, stderr=fh, env=env, cwd=tmp_path)
    try:
        def online() -> dict[str, Any] | None:
            assert proc.poll() is None, err.read_text(errors="replace")[-3000:]
            d = _device(fleet)
            # the first report can come before the stream's source has started
            return d if d["state"] == "online" and d["health"]["streams"] else None

        first = wait_for(online, "gw1 online from the agent's health report", START_S)
        health = first["health"]
        assert health["device_id"] == "gw1" and health["agent_version"] == __version__
        assert first["agent_version"] == __version__
        assert [s["stream"] for s in health["streams"]] == ["pump1"]
        assert [(m["stream"], m["name"]) for m in health["models"]] == [("pump1", "skab-wstat")]
        # it stays online past the silence limit while the agent runs: the reports go on
        received = {first["health_received_at"]}
        until = time.monotonic() + 2.5 * OFFLINE_AFTER_S
        while time.monotonic() < until:
            d = _device(fleet)
            assert d["state"] == "online", d
            received.add(d["health_received_at"])
            time.sleep(0.5)
        assert len(received) >= 4, received  # about one report every 0.5 s

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, err.read_text(errors="replace")[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    try:
        stopped = _device(fleet)
        last = _last_contact(stopped)
        off = wait_for(lambda: (d := _device(fleet))["state"] == "offline" and d,
                       "gw1 offline after the agent stopped", 60)
        seen_off = time.time()
        assert off["health_received_at"] == stopped["health_received_at"]  # no report since
        # listed offline only once --offline-after has passed since the last contact
        assert seen_off - last >= OFFLINE_AFTER_S, (seen_off, last)
        # the sweep marks it offline too, once: one device_offline webhook
        wait_for(lambda: receiver.got, "the device_offline webhook", SWEEP_S)
        time.sleep(1.0)
        events = [r.json for r in receiver.got]
        assert len(events) == 1, events
        assert events[0]["event"] == "device_offline", events
        payload = events[0]["data"]
        assert payload["device_id"] == "gw1", events
        assert abs(_when(payload["last_contact"]) - last) < 1.0, (payload, last)
    finally:
        receiver.stop()
    log = err.read_text(errors="replace")
    assert "Traceback" not in log, log[-3000:]
    assert "health report failed" not in log, log[-3000:]
