"""Send the agent's health to the fleet (``POST /v1/devices/self/health``) every minute.

One thread (``fleet-health``) builds a :class:`cloud_sync.health.HealthSummary` from the
monitor's latest :class:`agent.health.Report` (:func:`summarize`: overall state, the reasons of
the non-green components, each stream's source state, backlog, models, the store's disk use)
and posts it every ``fleet.health_interval_s`` seconds (one attempt each; a failure is logged
once per outage and the next period tries again). A fleet older than the route answers 404/405
(:class:`~cloud_sync.errors.FleetRejected`): the reporter then waits :data:`OLD_FLEET_WAIT_S`
before it tries again, and uploads go on as before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from agent.health import Report
from cloud_sync.errors import FleetError, FleetRejected
from cloud_sync.health import (
    MAX_MODELS,
    MAX_REASON,
    MAX_STREAMS,
    DiskUse,
    HealthSummary,
    ModelHealth,
    StreamHealth,
)

#: Seconds to wait after a fleet answered 404/405 (it has no health route) before trying again.
OLD_FLEET_WAIT_S = 3600.0
_SOURCE = "source:"

log = logging.getLogger("agent.health_reporter")


class HealthClient(Protocol):
    def post_health(self, summary: HealthSummary) -> None: ...


def _clip(text: str) -> str:
    return text.replace("\x00", "")[:MAX_REASON]


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def summarize(
    report: Report,
    device_id: str,
    agent_version: str,
    backlog: tuple[int, int],
    models: Sequence[tuple[str, str, int]],
) -> HealthSummary:
    """The health summary of ``report`` (bounded as :mod:`cloud_sync.health` requires).

    Args:
        report: The monitor's latest report (components ``source:<stream>``, ``store``, ...).
        device_id: This gateway's id.
        agent_version: The agent's version.
        backlog: ``(alerts, aggregates)`` not yet uploaded.
        models: ``(stream, model name, version)`` per stream.

    Raises:
        pydantic.ValidationError: a value the wire schema refuses (a stream name out of pattern).
    """
    streams = [
        StreamHealth(stream=c.name[len(_SOURCE):], state=c.state,
                     reason=None if c.reason is None else _clip(c.reason))
        for c in report.components if c.name.startswith(_SOURCE)
    ][:MAX_STREAMS]
    reasons = [_clip(f"{c.name}: {c.reason}") for c in report.components
               if c.state != "green" and c.reason][:16]
    disk = None
    store = next((c for c in report.components if c.name == "store"), None)
    if store is not None and _int(store.details.get("bytes")) is not None:
        disk = DiskUse(used_bytes=_int(store.details["bytes"]) or 0,
                       budget_bytes=_int(store.details.get("budget_bytes")))
    return HealthSummary(
        device_id=device_id, at=report.at, status=report.overall,
        agent_version=agent_version[:64], reasons=reasons, streams=streams,
        models=[ModelHealth(stream=s, name=n[:64], version=v) for s, n, v in models][:MAX_MODELS],
        backlog_alerts=max(0, backlog[0]), backlog_aggregates=max(0, backlog[1]), disk=disk,
    )


class HealthReporter:
    """Post a health summary every ``interval_s`` from one thread.

    Args:
        client: Posts a summary (one attempt).
        build: Returns the current summary (:func:`summarize` over the monitor's report).
        interval_s: Seconds between two reports (> 0).
        monotonic: Monotonic clock.
    """

    def __init__(
        self, client: HealthClient, build: Callable[[], HealthSummary], interval_s: float,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if not interval_s > 0:
            raise ValueError("interval_s must be positive")
        self.client = client
        self.build = build
        self.interval_s = interval_s
        self._monotonic = monotonic
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False
        self._old_fleet_until: float | None = None
        #: Reports the fleet stored.
        self.sent = 0

    def start(self) -> None:
        """Start the thread."""
        self._thread = threading.Thread(target=self._run, name="fleet-health", daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """Stop the thread (waits up to ``timeout`` seconds)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def send_once(self) -> bool:
        """Build and post one summary; True when the fleet stored it. Never raises for fleet
        failures (logged once per outage)."""
        now = self._monotonic()
        if self._old_fleet_until is not None and now < self._old_fleet_until:
            return False
        try:
            summary = self.build()
        except Exception as exc:  # the store or the report failed: try again next period
            self._fail(exc)
            return False
        try:
            self.client.post_health(summary)
        except FleetRejected as exc:
            if exc.status in (404, 405):
                self._old_fleet_until = now + OLD_FLEET_WAIT_S
                log.warning("the fleet has no health route (HTTP %d: an older fleet); health "
                            "reports paused for %.0f s, uploads go on", exc.status,
                            OLD_FLEET_WAIT_S)
            else:
                self._fail(exc)
            return False
        except FleetError as exc:
            self._fail(exc)
            return False
        if self._failing:
            log.info("health reports reach the fleet again")
        self._failing = False
        self._old_fleet_until = None
        self.sent += 1
        return True

    def _fail(self, exc: Exception) -> None:
        if not self._failing:
            log.warning("health report failed (next try in %.0f s): %s", self.interval_s, exc)
        self._failing = True

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.send_once()
            except Exception:  # the loop must survive anything; uploads do not depend on it
                log.exception("health report failed unexpectedly")
            self._stop.wait(self.interval_s)
