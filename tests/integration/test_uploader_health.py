"""The ``uploader`` health component while the fleet is down: a real ``edge-fleet serve``
killed with SIGKILL, a real SQLite store, the real client and the agent's monitor.

The component was green through any number of failed attempts (yellow only after an hour of sync
lag); it turns yellow after ``FAILURE_STREAK`` consecutive failures, naming the last error and
the backlog, and green again at the first success.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from agent.health import GREEN, YELLOW, Component
from agent.metrics import Metrics
from agent.monitor import Monitor
from agent.services.upload_failures import FAILURE_STREAK
from agent.services.uploader import Uploader
from agent.store.sqlite import Store
from agent.systemd import Notifier
from cloud_sync.client import FleetClient
from tests.integration.fleet_peer import FleetProcess
from tests.unit.test_store import make_aggregate, make_alert

pytestmark = pytest.mark.integration


def _uploader_component(monitor: Monitor) -> Component:
    report = monitor.tick()
    return next(c for c in report.components if c.name == "uploader")


def test_a_killed_fleet_turns_the_uploader_yellow_after_a_failure_streak(
    tmp_path: Path, fleet: FleetProcess,
) -> None:
    m = Metrics(CollectorRegistry())
    store = Store(tmp_path / "agent.db", metrics=m)
    client = FleetClient(fleet.url, fleet.token, connect_timeout_s=1.0, read_timeout_s=5.0)
    up = Uploader(store, client, "gw1", m, backoff_initial_s=0.1, backoff_max_s=0.5)
    monitor = Monitor({}, list, lambda: (0, 100), store, m, Notifier(""),
                      has_uploader=True, uploader_trouble=up.trouble, watchdog_interval_s=0.0)
    try:
        store.add_alert(make_alert(1))
        up.run_once()
        assert store.upload_backlog() == (0, 0)
        assert _uploader_component(monitor).state == GREEN

        fleet.kill()  # kill -9: connections refused from now on
        store.add_alert(make_alert(2))
        store.add_aggregate(make_aggregate(time.time() - 60.0))  # a fresh one: no lag
        for attempt in range(1, FAILURE_STREAK + 1):
            assert up.run_once() > 0  # a backoff: the attempt failed
            comp = _uploader_component(monitor)
            if attempt < FAILURE_STREAK:
                assert comp.state == GREEN, (attempt, comp)  # a short blip is no alarm
        assert comp.state == YELLOW, comp
        reason = comp.reason or ""
        assert f"{FAILURE_STREAK} consecutive attempts failed" in reason, reason
        assert "1 alert(s) and 1 aggregate(s) wait on the device" in reason, reason
        assert "the last: " in reason and "127.0.0.1" in reason, reason  # the client's error
        assert m.registry.get_sample_value(
            "edge_agent_health_state", {"component": "uploader"}) == 1.0

        fleet.start()
        up.run_once()  # the first success turns it green again
        assert store.upload_backlog() == (0, 0)
        comp = _uploader_component(monitor)
        assert comp.state == GREEN and comp.reason is None, comp
    finally:
        up.close()
        client.close()
        store.close()
