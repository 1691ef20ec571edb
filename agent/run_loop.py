"""The agent's run loop and shutdown: start the components, score until stopped, stop cleanly.

:class:`AgentLoop` is the base of :class:`agent.app.Agent`, which builds every component from
the config (the composition root); this module only runs what was built. The start-up order,
the heartbeat and what READY=1 means, and the shutdown order are described in
:mod:`agent.app`.

Threads: the loop runs in the thread that calls :meth:`AgentLoop.run` (the main thread under
the CLI, where signals arrive). It takes the readings the sources put on :attr:`AgentLoop.queue`
in batches of at most :data:`BATCH_MAX`, scores them per stream, and about once a second
(:data:`HEARTBEAT_S`, at least twice per watchdog interval) calls
:meth:`agent.monitor.Monitor.tick`.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from queue import Queue
from typing import TYPE_CHECKING

import numpy as np

from agent import __version__
from agent.errors import StoreError
from agent.exitcodes import EX_OK, EX_UNAVAILABLE
from agent.logs import ALWAYS
from agent.pipeline.stream import AlertEvent
from agent.sources.camera_watch import ScoredFile

if TYPE_CHECKING:
    from agent.config.schema import AgentConfig
    from agent.metrics import Metrics
    from agent.monitor import Monitor
    from agent.publish.keeper import AlertKeeper
    from agent.publish.mqtt import MqttPublisher
    from agent.publish.sparkplug_edge import SparkplugEdgeNode
    from agent.publish.state import StatePublisher
    from agent.publish.stream_state import StateBoard
    from agent.records import Aggregate, Reading
    from agent.sensor_streams import SensorStream
    from agent.services.alerting import Alerting
    from agent.services.baselines import BaselineSaver
    from agent.services.camera import CameraStream
    from agent.services.health_reporter import HealthReporter
    from agent.services.samples import SampleUploader
    from agent.services.scoring import BlockScorer
    from agent.services.snapshot_service import SnapshotService
    from agent.services.stream_feed import StateFeed
    from agent.services.updater import Updater
    from agent.services.uploader import Uploader
    from agent.store.sqlite import Store
    from agent.store.writer import AlertWriter
    from agent.systemd import Notifier

log = logging.getLogger("agent")

#: Readings the sources may queue ahead of the pipeline (a full queue blocks them).
QUEUE_SIZE = 65_536
#: Most readings taken from the queue in one batch.
BATCH_MAX = 4_096
#: Longest wait for the MQTT outbox to drain at shutdown, seconds.
SHUTDOWN_FLUSH_S = 10.0
#: Longest time the queued readings are scored for after a stop signal (the whole shutdown must stay
#: inside systemd's TimeoutStopSec (60 s) of systemd/edge-agent.service; a full 65,536-reading
#: queue behind a failing disk took over 30 s under load, and SIGKILL then loses the outbox
#: flush too). Readings left are dropped, counted in
#: ``edge_agent_dropped_total{kind="reading", reason="shutdown"}`` and logged once.
SHUTDOWN_DRAIN_S = 8.0
#: Longest wait for each fleet-facing service (uploader, updater, samples, health) to stop, s.
UPLOAD_STOP_S = 5.0
#: Seconds between two heartbeats (health, gauges, watchdog decision).
HEARTBEAT_S = 1.0
#: Start-up time asked of systemd (EXTEND_TIMEOUT_USEC) before each model load and warm-up.
START_STEP_S = 120.0


class AgentLoop:
    """Runs and stops the components :class:`agent.app.Agent` built (see the module docstring).

    The attributes below are set by :class:`agent.app.Agent`'s constructor.
    """

    config: AgentConfig
    metrics: Metrics
    notifier: Notifier
    store: Store
    queue: Queue[Reading]
    stop_event: threading.Event
    stop_reason: str
    reload_event: threading.Event
    _reload: Callable[[], AgentConfig | None] | None
    next_config: AgentConfig | None
    streams: dict[str, SensorStream]
    cameras: dict[str, CameraStream]
    image_events: Queue[AlertEvent | Aggregate | ScoredFile]
    publisher: MqttPublisher | None
    writer: AlertWriter | None
    sparkplug: SparkplugEdgeNode | None
    state_publisher: StatePublisher | None
    uploader: Uploader | None
    updater: Updater | None
    samples: SampleUploader | None
    snapshots: SnapshotService | None
    health_reporter: HealthReporter | None
    board: StateBoard
    feed: StateFeed
    keeper: AlertKeeper
    alerting: Alerting
    scorer: BlockScorer
    baselines: BaselineSaver
    monitor: Monitor
    readings_dropped: int

    def _warm_up(self) -> None:
        """One inference per stream on its first golden window (first-call allocations, lazy
        kernel compilation), so the first real window is not the slow one."""
        for s in self.streams.values():
            self.notifier.extend_timeout(START_STEP_S, f"warming up stream {s.config.name}")
            golden = np.asarray(s.package.manifest.golden.inputs[:1], dtype=np.float32)
            t0 = time.perf_counter()
            s.backend.run(golden)
            log.debug("stream %s: warm-up inference %.1f ms", s.config.name,
                      1e3 * (time.perf_counter() - t0))

    @property
    def alerts_raised(self) -> int:
        """Raised events stored or delivered so far (:class:`agent.services.alerting.Alerting`)."""
        return self.alerting.alerts_raised

    @property
    def aggregates_written(self) -> int:
        """Aggregates stored so far."""
        return self.alerting.aggregates_written

    @property
    def aggregates_dropped(self) -> int:
        """Aggregates the store refused so far."""
        return self.alerting.aggregates_dropped

    # -- running --------------------------------------------------------------------------------

    def run(self) -> int:
        """Run until stopped, reloaded or every source has ended; returns the exit code.

        Returns:
            0 (``EX_OK``) when stopped, reloaded or every source reached its end;
            ``EX_UNAVAILABLE`` (69) when every source has ended and at least one failed for
            good. After a reload :attr:`next_config` holds the new config.
        """
        self._warm_up()
        if self.publisher is not None:
            self.publisher.start()
        if self.writer is not None:
            self.writer.start()
        if self.sparkplug is not None:
            self.sparkplug.start()
        if self.state_publisher is not None:
            self.state_publisher.start()
        if self.uploader is not None:
            self.uploader.start()
        if self.updater is not None:
            self.updater.start()
        if self.samples is not None:
            self.samples.start()
        if self.snapshots is not None:
            self.snapshots.start()
        if self.health_reporter is not None:
            self.health_reporter.start()
        for s in self.streams.values():
            s.supervisor.start()
        for c in self.cameras.values():
            c.start()
        self.notifier.ready(f"running {len(self.streams) + len(self.cameras)} stream(s)")
        log.info("store %s (alerts, aggregates%s)", os.path.abspath(self.store.path),
                 ", snapshots" if self.snapshots is not None else "", extra=ALWAYS)
        log.info("agent %s running as device %s", __version__, self.config.agent.device_id,
                 extra=ALWAYS)
        # Tick at least twice per watchdog interval, so pings are never more than 1.5 apart.
        period = min(HEARTBEAT_S, self.monitor.watchdog_interval_s / 2)
        last_heartbeat = -period
        code = EX_OK
        try:
            while not self.stop_event.is_set():
                self._drain_once(timeout=min(0.2, period / 2))
                now = time.monotonic()
                if now - last_heartbeat >= period and not self.stop_event.is_set():
                    last_heartbeat = now
                    self._heartbeat()
                if self.reload_event.is_set():
                    self.reload_event.clear()
                    if self._reload is not None:
                        self.next_config = self._reload()
                        if self.next_config is not None:
                            break
                if (not self.stop_event.is_set() and self._sources_ended()
                        and self.queue.empty()):
                    self._heartbeat()  # the last report shows how each source ended
                    failed = self._failed_sources()
                    if failed:
                        code = EX_UNAVAILABLE
                        log.error("every source has ended, %d failed for good: %s; shutting "
                                  "down with exit code %d", len(failed), "; ".join(failed), code,
                                  extra=ALWAYS)
                    else:
                        log.info("every source is exhausted; shutting down", extra=ALWAYS)
                    break
            else:  # stopped on request (a camera thread ends on stop too: not an exhaustion)
                log.info("%s; shutting down", self.stop_reason, extra=ALWAYS)
        finally:
            self.shutdown(final=self.next_config is None)
        return code

    def _sources_ended(self) -> bool:
        """Every source thread has ended by itself: exhausted, or failed for good."""
        return (all(s.supervisor.done or s.supervisor.error is not None
                    for s in self.streams.values())
                and all(c.done for c in self.cameras.values()))

    def _failed_sources(self) -> list[str]:
        """``"<stream>: <error>"`` for each source that failed for good."""
        return ([f"{n}: {s.supervisor.error}" for n, s in self.streams.items()
                 if s.supervisor.error is not None]
                + [f"{n}: {c.error}" for n, c in self.cameras.items() if c.error is not None])

    def _heartbeat(self) -> None:
        self.metrics.queue_depth.set(self.queue.qsize())
        report = self.monitor.tick(self.alerts_raised)
        for n, c in self.cameras.items():  # cameras score in their own threads
            self.feed.scored(n, c.last_score, c.pipeline.threshold)
        finished = frozenset(
            [n for n, s in self.streams.items() if s.supervisor.done and s.supervisor.error is None]
            + [n for n, c in self.cameras.items() if c.exhausted and c.error is None])
        self.feed.health({comp.name.removeprefix("source:"): comp.state
                          for comp in report.components if comp.name.startswith("source:")},
                         finished)

    def _drain_once(self, timeout: float) -> None:
        self._drain_images()
        try:
            first = self.queue.get(timeout=timeout)
        except queue.Empty:
            return
        batch = [first]
        while len(batch) < BATCH_MAX:
            try:
                batch.append(self.queue.get_nowait())
            except queue.Empty:
                break
        for r in batch:
            self.streams[r.stream].pending.append(r)
        for s in self.streams.values():
            if s.pending:
                self.scorer.process(s)

    def _drain_images(self) -> None:
        """Store the alerts and aggregates the camera streams produced, then mark the watched
        folders' files whose alerts they were (main thread)."""
        while True:
            try:
                item = self.image_events.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, AlertEvent):
                self.alerting.raise_event(self.cameras[item.stream], item)
            elif isinstance(item, ScoredFile):
                item.commit()
            else:
                self.alerting.write_aggregate(item)

    def request_stop(self, reason: str = "stop requested") -> None:
        """Ask the agent to stop (signal handler, tests); ``reason`` goes in the shutdown line."""
        self.stop_reason = reason
        self.stop_event.set()

    def request_reload(self) -> None:
        """Ask the run loop to check the config again (SIGHUP handler, tests)."""
        self.reload_event.set()

    def _drop_queued_readings(self) -> None:
        dropped = 0
        while True:
            try:
                self.queue.get_nowait()
            except queue.Empty:
                break
            dropped += 1
        self.readings_dropped += dropped
        self.metrics.dropped_total.labels(kind="reading", reason="shutdown").inc(dropped)
        log.warning("stopping: %d queued reading(s) not scored within %g s of the stop signal; "
                    "dropped (the pipeline was behind its sources)", dropped, SHUTDOWN_DRAIN_S)

    def shutdown(self, final: bool = True) -> None:
        """Stop sources, score what is queued, flush aggregates, baselines and the outbox, close.

        Args:
            final: The process ends: send STOPPING=1 and close the notifier. False for a
                reload (RELOADING=1 was sent; the next agent's READY=1 ends it).
        """
        if final:
            self.notifier.stopping()
        else:
            self.notifier.reloading()
        self.stop_event.set()
        for s in self.streams.values():
            s.supervisor.join(timeout=5.0)
        drain_until = time.monotonic() + SHUTDOWN_DRAIN_S
        while not self.queue.empty():
            if time.monotonic() >= drain_until:
                self._drop_queued_readings()
                break
            self._drain_once(timeout=0.0)
        for s in self.streams.values():
            if s.supervisor.done and s.supervisor.error is None:  # a recorded input ended
                ended = s.pipeline.end_of_input()
                if ended is not None:
                    self.alerting.raise_event(s, ended)
            for agg in s.pipeline.flush():
                self.alerting.write_aggregate(agg)
        # the univariate streams' adapted baselines, for the next start (fsynced)
        self.baselines.save_all((s.pipeline, s.package) for s in self.streams.values())
        for c in self.cameras.values():
            c.join(timeout=5.0)
            for agg in c.flush():
                self.image_events.put(agg)
            if not c.close():
                log.warning("camera %s: its thread or frame grabber is still running at "
                            "shutdown (a capture read that does not return)", c.name)
        for s in self.streams.values():
            s.pipeline.detector.close()
        self._drain_images()
        if self.next_config is not None:  # a reload: streams leaving the config lose their state
            kept = {sc.name for sc in self.next_config.streams}
            for name in sorted(set(self.streams) | set(self.cameras)):
                if name not in kept:
                    self.board.remove(name)
        if self.state_publisher is not None:
            self.state_publisher.stop()
        if self.snapshots is not None:
            self.snapshots.stop()
        if self.sparkplug is not None:  # its NDEATH before the alerts' 'offline'
            self.sparkplug.stop()
        if self.writer is not None and self.writer.stop(SHUTDOWN_FLUSH_S):
            log.error("alert writer: alerts left uncommitted at shutdown")
        if self.publisher is not None:
            if self.publisher.connected and not self.publisher.flush(SHUTDOWN_FLUSH_S):
                log.warning("outbox not empty at shutdown; the rest is sent at next start")
            self.publisher.stop()
        if self.uploader is not None and not self.uploader.stop(UPLOAD_STOP_S):
            log.warning("fleet upload still busy at shutdown; the rest is sent at next start")
        if self.updater is not None and not self.updater.stop(UPLOAD_STOP_S):
            log.warning("model updater still busy at shutdown")
        if self.samples is not None:
            self.samples.stop(UPLOAD_STOP_S)
        if self.health_reporter is not None:
            self.health_reporter.stop(UPLOAD_STOP_S)
        self.keeper.persist_seq()
        try:
            depth, _ = self.store.outbox_stats()
        except StoreError:
            depth = -1
        k = self.keeper
        log.log(
            logging.WARNING if k.lost_total or self.aggregates_dropped else logging.INFO,
            "stopped: %d alert(s) raised (%d not stored: %d delivered over MQTT from memory, "
            "%d lost), %d aggregate(s) written, %d aggregate(s) not stored, %d alert(s) still "
            "in the outbox", self.alerts_raised, k.not_stored, k.delivered_from_memory,
            k.lost_total, self.aggregates_written, self.aggregates_dropped,
            depth if self.publisher is not None else 0, extra=ALWAYS,
        )
        self.store.close()
        if final:
            self.notifier.close()
