"""The ``alert`` webhook body lists each alert with its lifecycle event and episode."""

from __future__ import annotations

import datetime as dt
from typing import Any

from fleet.events import Events

T = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


class _Store:
    """Just the two WebhookStore calls Events makes (unit test of Events' own logic)."""

    def __init__(self) -> None:
        self.queued: list[tuple[str, dict[str, Any]]] = []

    def subscribed(self) -> set[str]:
        return {"alert"}

    def enqueue(self, event: str, data: dict[str, Any]) -> int:
        self.queued.append((event, data))
        return 1


def _row(rid: str, payload: Any) -> dict[str, Any]:
    return {"id": rid, "stream": "pump1", "score": 4.2, "threshold": 3.0, "window_start": T,
            "model_name": "m", "model_version": 3, "payload": payload}


def test_alert_items_carry_event_and_episode_id() -> None:
    store = _Store()
    events = Events(store)  # type: ignore[arg-type]
    rows = [_row("gw1:pump1:1", {"schema": 1}),
            _row("gw1:pump1:2", {"event": "updated", "episode_id": "gw1:pump1:1"}),
            _row("gw1:pump1:3", {"event": "cleared", "episode_id": "gw1:pump1:1"})]
    assert events.alerts("gw1", rows) == 1
    [(event, data)] = store.queued
    assert event == "alert" and data["count"] == 3
    assert [(a["id"], a["event"], a["episode_id"]) for a in data["alerts"]] == [
        ("gw1:pump1:1", "raised", "gw1:pump1:1"),
        ("gw1:pump1:2", "updated", "gw1:pump1:1"),
        ("gw1:pump1:3", "cleared", "gw1:pump1:1")]
    assert data["alerts"][0]["window_start"] == "2026-01-01T00:00:00Z"
