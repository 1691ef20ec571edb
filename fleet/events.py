"""Fleet events for webhooks: queue ``alert``, ``device_offline`` and ``rollout_halted``.

* ``alert``: ONE delivery per ingest batch that stored new alerts (a 5,000-record backlog does
  not become 5,000 POSTs): ``data = {"device_id", "count", "alerts": [...]}`` with at most
  :data:`MAX_ALERTS_LISTED` alerts (id, ``event`` - ``raised``, ``updated`` or ``cleared`` -,
  ``episode_id`` - the id of the episode's ``raised`` record -, stream, score, threshold,
  window_start, model; a schema-1 alert is ``raised`` and its own episode). It is
  queued right after the batch's transaction commits (a fleet crash between the two loses
  that notification; the alerts themselves are stored).
* ``device_offline``: ``{"device_id", "last_contact"}``, queued in the sweep's transaction.
* ``rollout_halted``: ``{"rollout_id", "name", "version", "reason"}``, queued in the halting
  transaction.

Which events have subscribers is cached per process for :data:`SUBSCRIBED_TTL_S`, so ingest
pays nothing while no webhook wants alerts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from fleet.db.webhooks import Event, WebhookStore

MAX_ALERTS_LISTED = 100
SUBSCRIBED_TTL_S = 5.0


class Events:
    """Queues events into :class:`WebhookStore`.

    Args:
        store: The webhook queue.
        wake: Called after something was queued (the dispatcher looks at once).
        monotonic: Monotonic clock (subscription cache).
    """

    def __init__(self, store: WebhookStore, wake: Callable[[], object] | None = None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self._wake = wake
        self._monotonic = monotonic
        self._subscribed: set[str] = set()
        self._checked = -SUBSCRIBED_TTL_S

    def wants(self, event: Event) -> bool:
        """Whether a webhook subscribes to ``event`` (cached; see module docstring)."""
        now = self._monotonic()
        if now - self._checked >= SUBSCRIBED_TTL_S:
            self._subscribed = self.store.subscribed()
            self._checked = now
        return event in self._subscribed

    def changed(self) -> None:
        """Webhooks were added or removed in this process: forget the cache."""
        self._checked = -SUBSCRIBED_TTL_S

    def alerts(self, device_id: str, rows: Sequence[dict[str, Any]]) -> int:
        """Queue one ``alert`` event for the new alert rows of one batch (``fleet.ingest``
        rows: id, stream, score, threshold, window_start, model_name, model_version, payload);
        each listed alert carries its lifecycle ``event`` and ``episode_id`` from the payload."""
        if not rows or not self.wants("alert"):
            return 0
        listed = [{
            "id": r["id"], **_episode(r), "stream": r["stream"], "score": r["score"],
            "threshold": r["threshold"], "window_start": _iso(r["window_start"]),
            "model": {"name": r["model_name"], "version": r["model_version"]},
        } for r in rows[:MAX_ALERTS_LISTED]]
        n = self.store.enqueue("alert", {"device_id": device_id, "count": len(rows),
                                         "alerts": listed})
        self._woke(n)
        return n

    def queued(self, n: int) -> None:
        """``n`` deliveries were queued elsewhere (sweep, halt): wake the dispatcher."""
        self._woke(n)

    def _woke(self, n: int) -> None:
        if n and self._wake is not None:
            self._wake()


def _episode(row: dict[str, Any]) -> dict[str, str]:
    """``{"event", "episode_id"}`` of an alert row, as :meth:`fleet.db.records.RecordStore.alerts`
    reads them (a schema-1 alert: ``raised``, its own id)."""
    payload = row.get("payload")
    body = payload if isinstance(payload, dict) else {}
    return {"event": str(body.get("event") or "raised"),
            "episode_id": str(body.get("episode_id") or row["id"])}


def _iso(value: Any) -> Any:
    iso = getattr(value, "isoformat", None)
    return value if iso is None else str(iso()).replace("+00:00", "Z")
