"""Newcomer findings against the real fleet and agent: a ``device_id`` that is not the enrolled
name is explained (both ids, which to change), and ``status`` does not show a disabled MQTT as
green."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from agent.app import Agent
from agent.cli import format_health
from agent.config.loader import parse_config
from agent.metrics import Metrics
from agent.services.uploader import Uploader
from agent.store.sqlite import Store
from agent.systemd import Notifier
from cloud_sync.client import FleetClient
from tests.integration.fleet_peer import FleetProcess
from tests.unit.test_store import make_alert

pytestmark = pytest.mark.integration


def test_a_device_id_that_is_not_the_enrolled_name_is_explained_once(
    tmp_path: Path, fleet: FleetProcess, caplog: pytest.LogCaptureFixture,
) -> None:
    # the fleet enrolled "gw1"; the agent's config says "line1-gw01"
    m = Metrics(CollectorRegistry())
    store = Store(tmp_path / "agent.db", metrics=m)
    store.add_alert(make_alert(1, device="line1-gw01"))
    up = Uploader(store, FleetClient(fleet.url, fleet.token, read_timeout_s=5), "line1-gw01", m,
                  interval_s=0.1, backoff_initial_s=0.1, backoff_max_s=0.1)
    with caplog.at_level(logging.ERROR, logger="agent.uploader"):
        for _ in range(3):
            up.run_once()
    up.close()
    store.close()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines  # once, not per attempt
    assert "'line1-gw01'" in lines[0] and "device_id = 'gw1'" in lines[0]
    assert "re-enrolling does not help" in lines[0]
    assert "edge-fleet device add" not in lines[0]


def test_status_shows_a_disabled_mqtt_as_off_not_green(tmp_path: Path) -> None:
    text = f"""
[agent]
state_dir = "{tmp_path / 'state'}"
console_alerts = false
[[streams]]
name = "demo"
[streams.source]
kind = "simulator"
speed = 0
duration_s = 30
"""
    agent = Agent(parse_config(text, env={}), Metrics(), console=None, notifier=Notifier(""))
    assert agent.run() == 0
    out = format_health("http://127.0.0.1:9100", agent.monitor.report().to_json())
    mqtt = [ln for ln in out.splitlines() if ln.split()[1:2] == ["mqtt"]]
    assert len(mqtt) == 1
    assert mqtt[0].split()[0] == "off" and "disabled" in mqtt[0], out
