"""The heartbeat: health report, liveness gauges, systemd WATCHDOG and STATUS.

:meth:`Monitor.tick` runs in the pipeline thread (the agent's main loop calls it about once a
second), so a stuck pipeline stops the ticks and with them the WATCHDOG=1 pings. Each tick:

1. looks at every stage: each source (:func:`agent.health.source_health`, with the stream's
   :class:`agent.health.StallPolicy`; a camera stream the same way, from
   :meth:`agent.services.camera.CameraStream.health_view`, with its figures and its metrics
   synced), the pipeline (this tick, and the reading queue), the MQTT
   drain thread (its loop passes at least every second; no pass for ``PUBLISHER_STALL_S`` = stuck)
   and, every ``STATS_INTERVAL_S``, the store (outbox depth and oldest age, bytes of budget) and
   the uploader's sync lag; the store is red at once while its statements fail (disk full), with
   how many alerts it refused and how many of those went over MQTT from memory, until
   ``STORE_RECOVERY_S`` pass without a failure;
2. sets ``edge_agent_stage_progress_age_seconds``/``_stage_stalled{stage}``, the outbox gauges
   (also when MQTT is disabled) and ``edge_agent_health_state{component}``;
3. when no stage is stalled: sets ``edge_agent_watchdog_last_ok_timestamp_seconds`` and sends
   WATCHDOG=1 if ``watchdog_interval_s`` has passed since the last ping; a STATUS= line whenever
   the summary changes.

:meth:`Monitor.report` is what ``/healthz`` serves (any thread): the last tick's report, with the
pipeline red when no tick has happened for ``PIPELINE_STALL_S``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from agent.disk_budget import DiskBudget
from agent.errors import StoreError
from agent.health import (
    GREEN,
    RED,
    YELLOW,
    Component,
    Report,
    SourceView,
    StallPolicy,
    rank,
    source_health,
)
from agent.metrics import Metrics
from agent.publish.mqtt import MqttPublisher
from agent.services.supervisor import SourceSupervisor
from agent.store.sqlite import Store
from agent.systemd import Notifier

if TYPE_CHECKING:
    from agent.services.camera import CameraStream

log = logging.getLogger(__name__)

#: No tick (main loop pass) for this long: the pipeline is stuck (seconds).
PIPELINE_STALL_S = 30.0
#: No drain-loop pass of the MQTT publisher for this long: it is stuck (seconds).
PUBLISHER_STALL_S = 30.0
#: Seconds between two store reads (outbox stats, size).
STATS_INTERVAL_S = 5.0
#: Outbox oldest age above which MQTT is yellow while connected (seconds).
OUTBOX_SLOW_S = 60.0
#: Share of the store budget above which the store is yellow.
BUDGET_WARN = 0.9
#: The store stays red this long after its last failed statement (seconds).
STORE_RECOVERY_S = 30.0
#: Sync lag above which the uploader is yellow (seconds).
SYNC_LAG_WARN_S = 3600.0


@dataclass(frozen=True)
class WatchedSource:
    """A source the monitor watches: its supervisor and stall policy."""

    supervisor: SourceSupervisor
    policy: StallPolicy


@dataclass(frozen=True)
class WatchedCamera:
    """A camera stream the monitor watches: the stream and its stall policy."""

    stream: CameraStream
    policy: StallPolicy


class Monitor:
    """Decides liveness and health from the running components.

    Args:
        sources: By stream name.
        calibrating: Returns the names of the streams still calibrating.
        queue_depth: Returns ``(readings queued, capacity)``.
        store: The store (outbox stats and size, read in the calling thread).
        metrics: Where the gauges go.
        notifier: Receives WATCHDOG=1 and STATUS=.
        publisher: The MQTT publisher, None when MQTT is disabled.
        has_uploader: The fleet uploader runs (its sync lag is read from ``metrics``).
        uploader_trouble: Why the uploader needs a look (a hung request), or None
            (:meth:`agent.services.uploader.Uploader.trouble`): yellow with that reason.
        cameras: Camera streams by name (``source:<stream>`` components like the sources).
        disk: The one disk budget (its ``disk`` component, checked at its own interval);
            None = no ``disk`` component.
        watchdog_interval_s: Least seconds between two WATCHDOG=1 pings.
        monotonic: Monotonic clock, seconds.
        clock: Wall clock, epoch seconds UTC.
    """

    def __init__(
        self,
        sources: Mapping[str, WatchedSource],
        calibrating: Callable[[], list[str]],
        queue_depth: Callable[[], tuple[int, int]],
        store: Store,
        metrics: Metrics,
        notifier: Notifier,
        *,
        publisher: MqttPublisher | None = None,
        has_uploader: bool = False,
        uploader_trouble: Callable[[], str | None] | None = None,
        cameras: Mapping[str, WatchedCamera] | None = None,
        disk: DiskBudget | None = None,
        watchdog_interval_s: float = 5.0,
        monotonic: Callable[[], float] = time.monotonic,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.sources = dict(sources)
        self.cameras = dict(cameras or {})
        self._disk = disk
        self._calibrating = calibrating
        self._queue_depth = queue_depth
        self._store = store
        self._metrics = metrics
        self._notifier = notifier
        self._publisher = publisher
        self._has_uploader = has_uploader
        self._uploader_trouble = uploader_trouble
        self.watchdog_interval_s = watchdog_interval_s
        self._monotonic = monotonic
        self._clock = clock
        self._last_tick: float | None = None
        self._last_ping = -math.inf
        self._last_stats = -math.inf
        self._store_component = Component("store", GREEN)
        self._outbox: tuple[int, float] = (0, 0.0)
        self._broker_down_since: float | None = None
        self._status = ""
        self.watchdog_pings = 0
        self._report = Report((), clock())

    # -- the heartbeat --------------------------------------------------------------------------

    def tick(self, alerts_raised: int = 0) -> Report:
        """One heartbeat (call from the pipeline thread); returns the new report."""
        now = self._monotonic()
        self._last_tick = now
        comps: list[Component] = []
        blocked: list[str] = []
        watched_all: list[tuple[Component, bool]] = [
            source_health(stream, self._view(w.supervisor, now), w.policy)
            for stream, w in self.sources.items()
        ]
        for stream, cam in self.cameras.items():
            cam.stream.sync_metrics()
            comp, blocks = source_health(stream, cam.stream.health_view(now), cam.policy)
            comp = replace(comp, details={**comp.details, **cam.stream.health_details()})
            watched_all.append((comp, blocks))
        for comp, blocks in watched_all:
            comps.append(comp)
            stage = comp.name
            age = comp.details.get("last_reading_age_s", 0.0)
            self._metrics.stage_progress_age_seconds.labels(stage=stage).set(
                float(age) if isinstance(age, int | float) else 0.0
            )
            self._metrics.stage_stalled.labels(stage=stage).set(1 if blocks else 0)
            if blocks:
                blocked.append(f"{stage}: {comp.reason}")
        calibrating = self._calibrating()
        comps.append(
            Component("calibration", YELLOW, f"calibrating: {', '.join(calibrating)}")
            if calibrating
            else Component("calibration", GREEN)
        )
        comps.append(self._pipeline(0.0))
        self._metrics.stage_progress_age_seconds.labels(stage="pipeline").set(0.0)
        self._metrics.stage_stalled.labels(stage="pipeline").set(0)
        if now - self._last_stats >= STATS_INTERVAL_S:
            self._last_stats = now
            self._read_store()
        store = self._store_failing(now) or self._store_component
        mqtt, mqtt_stuck = self._mqtt(now)
        comps.append(mqtt)
        if mqtt_stuck:
            blocked.append(f"publisher: {mqtt.reason}")
        comps.append(store)
        if self._disk is not None:
            comps.append(self._disk.component())
        if self._has_uploader:
            comps.append(self._uploader())
        report = Report(tuple(comps), self._clock())
        self._report = report
        for c in comps:
            self._metrics.health_state.labels(component=c.name).set(rank(c.state))
        self._metrics.health_state.labels(component="overall").set(rank(report.overall))
        if not blocked:
            self._metrics.watchdog_last_ok.set(report.at)
            if now - self._last_ping >= self.watchdog_interval_s:
                self._last_ping = now
                if self._notifier.watchdog():
                    self.watchdog_pings += 1
        status = self._summary(report, calibrating, alerts_raised, blocked)
        if status != self._status:
            self._status = status
            self._notifier.status(status)
            if blocked:
                log.error("watchdog withheld: %s", "; ".join(blocked))
        return report

    def report(self) -> Report:
        """The health report for ``/healthz`` (safe from any thread)."""
        report = self._report
        last = self._last_tick
        if last is None:
            return report.replace(Component("pipeline", YELLOW, "starting"))
        age = self._monotonic() - last
        if age > PIPELINE_STALL_S:
            return report.replace(self._pipeline(age))
        return report

    # -- stages ---------------------------------------------------------------------------------

    def _view(self, sup: SourceSupervisor, now: float) -> SourceView:
        return SourceView.observe(
            now, started_mono=sup.started_mono, last_progress_mono=sup.last_progress_mono,
            alive=sup.is_alive(), done=sup.done,
            error=None if sup.error is None else str(sup.error), outage=sup.outage,
            waiting_until_mono=sup.waiting_until_mono)

    def _pipeline(self, age: float) -> Component:
        depth, capacity = self._queue_depth()
        details: dict[str, object] = {"queue_depth": depth, "last_pass_age_s": round(age, 1)}
        if age > PIPELINE_STALL_S:
            reason = f"stuck: the pipeline loop has not run for {age:.0f} s"
            return Component("pipeline", RED, reason, details)
        if depth >= 0.9 * capacity:
            reason = f"behind: {depth} of {capacity} queued readings (sources are throttled)"
            return Component("pipeline", YELLOW, reason, details)
        return Component("pipeline", GREEN, None, details)

    def _read_store(self) -> None:
        try:
            depth, oldest = self._store.outbox_stats()
            used = self._store.size_bytes()
        except StoreError as exc:
            self._store_component = Component("store", RED, f"cannot read the store: {exc}")
            return
        age = 0.0 if oldest is None else max(0.0, self._clock() - oldest)
        if self._publisher is None:
            # MQTT disabled: nothing drains the outbox by design (alerts go to the console and
            # the fleet), so a growing depth is not a stuck delivery and must not alarm.
            depth, age = 0, 0.0
        self._outbox = (depth, age)
        self._metrics.outbox_depth.set(depth)
        self._metrics.outbox_oldest_age_seconds.set(age)
        budget = self._store.budget_bytes
        details: dict[str, object] = {"bytes": used, "budget_bytes": budget}
        if budget:
            details["budget_used_pct"] = round(100 * used / budget, 1)
        quarantined = getattr(self._store, "quarantined", None)
        if quarantined is not None:  # yellow until the next start: an operator looks at it
            details["quarantined"] = quarantined
            self._store_component = Component(
                "store", YELLOW, f"the store was corrupt at start: moved to {quarantined}; "
                "running on a fresh store (unsent alerts of the old one are in that file)",
                details)
            return
        if budget:
            share = used / budget
            if share >= BUDGET_WARN:
                reason = (
                    f"store at {100 * share:.0f}% of its {budget} byte budget "
                    "(aggregates are evicted oldest first past 100%)"
                )
                self._store_component = Component("store", YELLOW, reason, details)
                return
        self._store_component = Component("store", GREEN, None, details)

    def _store_failing(self, now: float) -> Component | None:
        """The store red while its statements fail (and ``STORE_RECOVERY_S`` after), else None."""
        f = self._store.failure()
        if f.last_mono is None or now - f.last_mono > STORE_RECOVERY_S:
            return None
        age = max(0.0, now - f.last_mono)
        lost = self._metrics.registry.get_sample_value(
            "edge_agent_dropped_total", {"kind": "alert", "reason": "store_error"}) or 0.0
        delivered = 0 if self._publisher is None else self._publisher.volatile.delivered
        reason = (
            f"writes failing: {f.last_error}" if age < 2 * STATS_INTERVAL_S
            else f"writes failed {age:.0f} s ago: {f.last_error}"
        )
        if f.alerts_not_stored:
            reason += (f", {f.alerts_not_stored} alert(s) not stored (delivered via MQTT: "
                       f"{delivered}, lost: {int(lost)})")
        details = {**self._store_component.details, "failures": f.count,
                   "last_failure_age_s": round(age, 1),
                   "alerts_not_stored": f.alerts_not_stored,
                   "alerts_delivered_from_memory": delivered}
        return Component("store", RED, reason, details)

    def _mqtt(self, now: float) -> tuple[Component, bool]:
        pub = self._publisher
        depth, age = self._outbox
        details: dict[str, object] = {"outbox_depth": depth, "outbox_oldest_age_s": round(age, 1)}
        budget_pct = self._store_component.details.get("budget_used_pct")
        if budget_pct is not None:
            details["store_budget_used_pct"] = budget_pct
        if pub is None:
            return Component("mqtt", GREEN, None, {"enabled": False, **details}), False
        loop_age = now - (pub.last_loop_mono or now)
        self._metrics.stage_progress_age_seconds.labels(stage="publisher").set(loop_age)
        stuck = not pub.running or loop_age > PUBLISHER_STALL_S
        self._metrics.stage_stalled.labels(stage="publisher").set(1 if stuck else 0)
        if stuck:
            reason = (
                "outbox drain thread has ended" if not pub.running
                else f"stuck: the outbox drain has not run for {loop_age:.0f} s"
            )
            return Component("mqtt", RED, reason, details), True
        if not pub.connected:
            if self._broker_down_since is None:
                self._broker_down_since = now
            down = now - self._broker_down_since
            reason = (
                f"broker {pub.config.host}:{pub.config.port} unreachable for {down:.0f} s; "
                f"{depth} alert(s) wait in the outbox (oldest {age:.0f} s"
                + (f", store at {budget_pct}% of budget)" if budget_pct is not None else ")")
            )
            return Component("mqtt", RED, reason, details), False
        self._broker_down_since = None
        if depth and age > OUTBOX_SLOW_S:
            reason = f"connected, but the oldest of {depth} outbox alert(s) is {age:.0f} s old"
            return Component("mqtt", YELLOW, reason, details), False
        return Component("mqtt", GREEN, None, details), False

    def _uploader(self) -> Component:
        lag = self._metrics.registry.get_sample_value("edge_agent_sync_lag_seconds") or 0.0
        details: dict[str, object] = {"sync_lag_s": round(lag, 1)}
        trouble = None if self._uploader_trouble is None else self._uploader_trouble()
        if trouble is not None:
            return Component("uploader", YELLOW, trouble, details)
        if lag > SYNC_LAG_WARN_S:
            reason = f"the oldest record not yet accepted by the fleet is {lag:.0f} s old"
            return Component("uploader", YELLOW, reason, details)
        return Component("uploader", GREEN, None, details)

    @staticmethod
    def _summary(
        report: Report, calibrating: list[str], alerts: int, blocked: list[str]
    ) -> str:
        text = (
            f"{report.overall}: {len(calibrating)} calibrating, {alerts} alert(s)"
        )
        bad = [f"{c.name} {c.state}" for c in report.components if c.state != GREEN]
        if bad:
            text += "; " + ", ".join(bad)
        if blocked:
            text += "; watchdog withheld"
        return text
