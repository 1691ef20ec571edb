"""Publish while committing, end to end: ``edge-agent run`` killed (SIGKILL) between the publish of
its alerts and their commit, then restarted (:mod:`agent.publish.early`).

The commit is held back with the store writer's test hook (``EDGE_AGENT_TEST_COMMIT_DELAY_S``,
:mod:`agent.store.writer`), so the kill lands after the broker took the alerts and before any of
them is on disk. What must hold: the subscriber got them; the restarted agent issues none of their
ids again (the id ledger reserved them before the publish); every alert the restarted agent
stores is delivered (nothing accepted is lost).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import MosquittoBroker
from tests.integration.test_agent_e2e import (
    ALERTS,
    DEVICE,
    FAST_RULES,
    AgentProcess,
    Subscriber,
    check_payload,
    run_agent,  # noqa: F401 - fixture
    simulator_source,
    stored_alerts,
    subscribers,  # noqa: F401 - fixture
    wait_until,
    write_config,
)

pytestmark = pytest.mark.integration


def _seq(alert_id: str) -> int:
    return int(alert_id.rsplit(":", 1)[1])


def test_kill_between_publish_and_commit_delivers_and_never_reuses_ids(
    tmp_path: Path,
    mosquitto: MosquittoBroker,
    subscribers: Callable[..., Subscriber],  # noqa: F811
    run_agent: Callable[..., AgentProcess],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sub = subscribers(mosquitto, [ALERTS])
    config = write_config(tmp_path / "agent.toml", simulator_source(),
                          broker_port=mosquitto.port, rules=FAST_RULES)
    db = tmp_path / "state" / "agent.db"

    monkeypatch.setenv("EDGE_AGENT_TEST_COMMIT_DELAY_S", "60")
    first = run_agent(["run", "--config", str(config)], tmp_path)
    wait_until(lambda: len(set(sub.alert_ids())) >= 3, 60, "3 alerts published", first.stderr)
    assert stored_alerts(db, ("raised", "updated", "cleared")) == [], (
        "an alert was committed: the kill would not fall between publish and commit")
    first.kill()  # SIGKILL
    monkeypatch.delenv("EDGE_AGENT_TEST_COMMIT_DELAY_S")
    before = set(sub.alert_ids())
    assert stored_alerts(db, ("raised", "updated", "cleared")) == []
    for alert in sub.alerts():
        check_payload(alert)
    # the ids were reserved durably before the publish
    ledger = json.loads((db.parent / "agent.db.ids").read_text())
    assert ledger["s1/reserved"] >= max(_seq(a) for a in before)

    second = run_agent(["run", "--config", str(config)], tmp_path)
    assert second.wait(90) == 0, second.stderr()
    stored = stored_alerts(db)
    assert len(stored) >= 3, "the restarted agent raised too few alerts"
    new_ids = [a["alert_id"] for a in stored]
    assert not before & set(new_ids), "a delivered alert id was issued again"
    assert min(_seq(a) for a in new_ids) > max(_seq(a) for a in before)
    assert all(a["alert_id"].startswith(f"{DEVICE}:s1:") for a in stored)
    # nothing the restarted agent accepted is lost: every stored alert was acknowledged and
    # reached the subscriber
    assert [a["alert_id"] for a in stored if a["published_at"] is None] == []
    wait_until(lambda: set(new_ids) <= set(sub.alert_ids()), 10, "every stored alert received")
