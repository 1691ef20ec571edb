"""Composition root: build every component from the config, run, stop cleanly.

Threads: one per source (its supervisor), paho's network loop and the MQTT outbox drain, and
with ``[mqtt.sparkplug]`` a second paho loop and the Sparkplug B worker; the pipeline runs in
the thread that calls :meth:`Agent.run` (the main thread under the CLI, where signals arrive).
Sources hand readings over a bounded queue (:class:`agent.reading_queue.ReadingQueue`); a full
queue blocks the source (backpressure) rather than dropping a reading, except that the MQTT
input, whose thread also keeps its broker connection alive, is never blocked: it keeps what the
queue has no room for and acknowledges it only once queued (:mod:`agent.sources.mqtt_in_hold`).

Start-up order (what READY=1 means): the config is valid (checked before the Agent is built),
the store is open and every model package is loaded and passed its golden vectors (the
constructor; EXTEND_TIMEOUT_USEC before each model so a slow load or compile does not hit
``TimeoutStartSec``), one warm-up inference per stream ran (:meth:`Agent.run`), the publisher,
uploader and sources are started; then READY=1. About once a second the main loop calls
:meth:`agent.monitor.Monitor.tick` (health, gauges, WATCHDOG=1 only while every stage makes
progress, STATUS=).

Shutdown (SIGTERM/SIGINT, or every source has ended): STOPPING=1, stop the sources, score
what is queued, close open aggregate intervals, store the univariate streams' adapted baselines,
wait up to ``SHUTDOWN_FLUSH_S`` for the outbox to drain, publish ``offline``, close the store.
Alerts not acknowledged by then stay in the outbox for the next start. When every source has
ended by itself, :meth:`Agent.run` returns 0 if each reached the end of its finite input, and
``EX_UNAVAILABLE`` (69, :mod:`agent.exitcodes`) if at least one failed for good (a sensor
source's fatal error, a camera file that cannot be read), so systemd's ``Restart=on-failure``
sees the failure; one ERROR line names the failed sources.

Reload (SIGHUP, ``systemctl reload``): the config file is read and checked again (schema, and
every model package loads); when invalid every problem is logged and the agent keeps running as
it was. When valid: RELOADING=1, the running agent stops as on shutdown (its outbox stays in the
store) and a new one is built from the new config and run in the same process, keeping the
/metrics endpoint. If the new agent cannot be built after all, the previous config is used again.

Where the parts live: sensor streams (package, runtime, pipeline, source supervisor)
:mod:`agent.sensor_streams`; the optional components (fleet uploader, updater, samples, health
reporter, Sparkplug B) :mod:`agent.compose`; alert raising and aggregates
:mod:`agent.services.alerting`; the reload check :mod:`agent.reload`; the state directory lock
:mod:`agent.state_lock`; per-source policies :mod:`agent.source_policies`; the run loop and
shutdown :mod:`agent.run_loop`.
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TextIO

from agent import __version__
from agent.compose import (
    build_health_reporter,
    build_samples,
    build_sparkplug,
    build_updater,
    build_uploader,
    open_model_store,
)
from agent.config.schema import AgentConfig, StreamConfig
from agent.disk_budget import DiskBudget, default_parts
from agent.errors import ConfigError
from agent.inference.choice_memory import ChoiceMemory
from agent.inference.image_select import ImageChoices
from agent.inference.package import ModelPackage
from agent.metrics import Metrics
from agent.monitor import Monitor, WatchedCamera, WatchedSource
from agent.pipeline.episodes import UpdateParams
from agent.pipeline.stream import AlertEvent
from agent.publish.homeassistant import HomeAssistantDiscovery
from agent.publish.keeper import AlertKeeper
from agent.publish.mqtt import MqttPublisher
from agent.publish.state import StatePublisher
from agent.publish.stream_state import StateBoard
from agent.reading_queue import ReadingQueue
from agent.records import Aggregate
from agent.reload import check_reload, run_with_reload
from agent.run_loop import QUEUE_SIZE, START_STEP_S, AgentLoop
from agent.sensor_streams import SensorStream, build_sensor_stream, save_calibration
from agent.services.alerting import Alerting
from agent.services.baselines import BaselineSaver
from agent.services.camera import CameraStream, build_camera_stream
from agent.services.episode_book import EpisodeBook, recorded_identity
from agent.services.health_reporter import HealthReporter
from agent.services.samples import SampleCollector, SampleUploader
from agent.services.scoring import BlockScorer
from agent.services.snapshot_service import SnapshotService, build_snapshots
from agent.services.stream_feed import StateFeed
from agent.services.updater import Updater
from agent.services.uploader import Uploader
from agent.source_policies import camera_policy, repeat_policy
from agent.sources.base import Source
from agent.sources.camera_watch import ScoredFile
from agent.state_lock import lock_state_dir
from agent.store.sqlite import Store
from agent.store.writer import AlertWriter, commit_delay_from_env
from agent.systemd import Notifier, watchdog_interval_s

if TYPE_CHECKING:
    from agent.publish.sparkplug_edge import SparkplugEdgeNode

#: The public names; check_reload, lock_state_dir and repeat_policy live in their own modules
#: (module docstring) and keep this import path.
__all__ = ["Agent", "check_reload", "lock_state_dir", "repeat_policy", "run"]

log = logging.getLogger("agent")

#: The fleet uploader's wiring under its former name (:func:`agent.compose.build_uploader`).
_build_uploader = build_uploader


class Agent(AgentLoop):
    """The running agent: builds every component from the config (running and stopping them:
    :class:`agent.run_loop.AgentLoop`).

    Args:
        config: A config whose paths are already absolute (``AgentConfig.resolved``).
        metrics: Metrics registry holder.
        console: Where alerts are printed when ``agent.console_alerts`` is on (``"stdout"``: the
            ``sys.stdout`` of the moment the agent is made; None: nowhere).
        notifier: systemd notifier.
        clock: Wall clock, epoch seconds UTC.
        sources: Ready-made sources by stream name, used instead of building one from that
            stream's ``source`` config (benchmarks, tests, embedding); the source's channels are
            checked against the model the same way.
        reload: Called on :meth:`request_reload` (in the run loop): returns the new, checked
            config to restart with, or None to keep running (see the module docstring).
        board: The present state of every stream (:class:`agent.publish.stream_state.
            StateBoard`) its consumers (Home Assistant discovery, Sparkplug B) follow; unset =
            a new one.

    Raises:
        ConfigError: a stream's source and model do not fit together, or ``sources`` names
            a stream that is not configured or holds a source stamping another stream name.
        ModelError: a model package is missing, corrupt or fails its golden vectors.
        StoreError: the store cannot be opened.
    """

    def __init__(
        self,
        config: AgentConfig,
        metrics: Metrics | None = None,
        console: TextIO | Literal["stdout"] | None = "stdout",
        notifier: Notifier | None = None,
        clock: Callable[[], float] = time.time,
        sources: Mapping[str, Source] | None = None,
        reload: Callable[[], AgentConfig | None] | None = None,
        board: StateBoard | None = None,
    ) -> None:
        given = dict(sources) if sources is not None else {}
        unknown = sorted(set(given) - {sc.name for sc in config.streams})
        if unknown:
            msg = f"sources given for unknown stream(s) {unknown}"
            raise ConfigError(msg, problems=[msg])
        self.config = config
        self._repeat = {sc.name: repeat_policy(sc.source) for sc in config.streams}
        self.metrics = metrics if metrics is not None else Metrics()
        self.metrics.info.info({"version": __version__, "device_id": config.agent.device_id})
        if console == "stdout":  # looked up now: sys.stdout may be replaced after import
            console = sys.stdout
        self.console = console if config.agent.console_alerts else None
        self.notifier = notifier if notifier is not None else Notifier()
        self.clock = clock
        self.stop_event = threading.Event()
        #: Why the agent was asked to stop (:meth:`request_stop`), for the shutdown line.
        self.stop_reason = "stop requested"
        self.reload_event = threading.Event()
        self._reload = reload
        #: Set when :meth:`run` ended for a reload: the config to build the next agent from.
        self.next_config: AgentConfig | None = None
        self.queue: ReadingQueue = ReadingQueue(QUEUE_SIZE, self.stop_event)
        state_dir = Path(config.agent.state_dir)
        store_path = Path(config.store.path)
        if not store_path.is_absolute():
            store_path = state_dir / store_path
        self.store = Store(
            store_path,
            clock,
            metrics=self.metrics,
            # within the disk budget from the start: it sizes the WAL bound and -reserve file
            budget_bytes=min(config.store.budget_bytes,
                             config.storage.disk_budget_bytes or config.store.budget_bytes),
            uploads=config.fleet.enabled,
        )
        self.uploader: Uploader | None = None
        if config.fleet.enabled:
            self.uploader = build_uploader(config, self.store, self.metrics, clock)
        self.publisher: MqttPublisher | None = None
        if config.mqtt.enabled:
            self.publisher = MqttPublisher(
                config.mqtt, self.store, config.agent.device_id, self.metrics, clock=clock
            )
        #: The present state of every stream (retained state, Home Assistant, Sparkplug B).
        self.board = board if board is not None else StateBoard(log)
        names = [sc.name for sc in config.streams]
        self.discovery: HomeAssistantDiscovery | None = None
        if self.publisher is not None:  # also when disabled: it removes what it had published
            self.discovery = HomeAssistantDiscovery(
                config.mqtt.homeassistant, self.publisher, config.agent.device_id,
                config.mqtt.topic_prefix, names, self.metrics)
            self.discovery.attach(self.board)
        self.sparkplug: SparkplugEdgeNode | None = None
        if config.mqtt.sparkplug.enabled:
            self.sparkplug = build_sparkplug(config, names, self.metrics)
            self.sparkplug.attach(self.board)
        self.streams: dict[str, SensorStream] = {}
        #: Camera streams score in their own threads; alerts/aggregates come back on a queue.
        self.cameras: dict[str, CameraStream] = {}
        self.image_events: queue.Queue[AlertEvent | Aggregate | ScoredFile] = queue.Queue()
        self._updates = open_model_store(config) if config.updater.enabled else None
        image_choices: ImageChoices = {}  # cameras on one model: one backend selection
        peers = Counter(_model_use(sc) for sc in config.streams if sc.source.kind == "camera")
        for sc in config.streams:
            self.notifier.extend_timeout(START_STEP_S, f"loading the model of stream {sc.name}")
            self.notifier.watchdog()  # a reload builds under a running watchdog: progress
            if sc.source.kind == "camera":
                self.cameras[sc.name] = build_camera_stream(
                    sc, config.agent.device_id, config.store.aggregate_interval_s,
                    self.image_events.put, self.stop_event, self.metrics,
                    cache_dir=state_dir / "openvino-cache", store=self.store,
                    choices=image_choices, memory=ChoiceMemory.in_state_dir(state_dir),
                    peers=peers[_model_use(sc)], progress=self._loading(sc.name))
                continue
            self.streams[sc.name] = self._build_stream(sc, given.get(sc.name))
        self.updater: Updater | None = None
        if self._updates is not None:
            self.updater = build_updater(config, self.streams, self.metrics, clock,
                                         *self._updates)
            if self.publisher is not None:
                self.publisher.subscribe(
                    f"{config.mqtt.topic_prefix}/{config.agent.device_id}/"
                    f"{config.updater.notify_topic}", self.updater.notify,
                )
        #: Camera alert snapshots (None: no camera stream, or [snapshots] disabled).
        self.snapshots: SnapshotService | None = build_snapshots(
            config, self.store, self.publisher, self.metrics, clock)
        self.collectors: dict[str, SampleCollector] = {}
        self.samples: SampleUploader | None = None
        if config.samples.enabled:
            self.samples = build_samples(config, self.streams, self.collectors, clock)
        self.health_reporter: HealthReporter | None = None
        if self.uploader is not None and config.fleet.health_interval_s > 0:
            self.health_reporter = build_health_reporter(
                config, self.streams, self.store,
                lambda: self.monitor.report(),  # noqa: PLW0108 - built below
                clock)
        self._lifecycle_setup(config)
        self.readings_dropped = 0
        #: Stores alerts; delivers those the store refuses over MQTT from memory.
        #: Commits alerts published while they are stored (None without MQTT: stored first).
        self.writer: AlertWriter | None = None
        if self.publisher is not None and config.mqtt.enabled:
            self.writer = AlertWriter(self.store, self.publisher.committed,
                                      commit_delay_s=commit_delay_from_env())
        self.keeper = AlertKeeper(self.store, self.publisher, self.metrics, writer=self.writer)
        #: Stores the episode events as alerts and the aggregates, and hands them on.
        self.alerting = Alerting(
            config.agent.device_id, clock, self.store, self.keeper, self.episodes, self.feed,
            self.metrics, self._repeat, snapshots=self.snapshots, publisher=self.publisher,
            uploader=self.uploader, console=self.console)
        #: Saves the univariate streams' adapted baselines (:mod:`agent.services.baselines`).
        self.baselines = BaselineSaver(self.store, clock)
        #: Scores the sensor streams' blocks of readings (:meth:`_drain_once`).
        self.scorer = BlockScorer(self.metrics, self.feed, self.alerting, self.store, clock,
                                  self.collectors, self.samples, self.baselines)
        #: The one disk budget (store, models, OpenVINO cache; snapshots: add_part).
        self.disk = DiskBudget(config.storage.disk_budget_bytes, self.store,
                               default_parts(state_dir), self.metrics,
                               check_interval_s=config.storage.check_interval_s)
        self.monitor = Monitor(
            {n: WatchedSource(s.supervisor, s.policy) for n, s in self.streams.items()},
            lambda: [n for n, s in self.streams.items() if s.pipeline.calibrating],
            lambda: (self.queue.qsize(), QUEUE_SIZE),
            self.store,
            self.metrics,
            self.notifier,
            publisher=self.publisher,
            has_uploader=self.uploader is not None,
            uploader_trouble=None if self.uploader is None else self.uploader.trouble,
            cameras={n: WatchedCamera(c, camera_policy(config, n))
                     for n, c in self.cameras.items()},
            disk=self.disk,
            watchdog_interval_s=watchdog_interval_s(),
            clock=clock,
        )

    # -- construction ---------------------------------------------------------------------------

    def _lifecycle_setup(self, config: AgentConfig) -> None:
        """Episode updates, open episodes of the last run, the state board and its publisher."""
        # self.board (built with the MQTT consumers) is fed from here
        self.feed = StateFeed(self.board, self.metrics, self.clock)
        self.episodes = EpisodeBook({sc.name: recorded_identity(sc.source)
                                     for sc in config.streams})
        lifecycles = {n: s.pipeline.lifecycle for n, s in self.streams.items()}
        lifecycles.update({n: c.pipeline.lifecycle for n, c in self.cameras.items()})
        for sc in config.streams:
            lifecycles[sc.name].params = UpdateParams(sc.rules.update_ratio,
                                                      sc.rules.update_interval_s)
        self.episodes.restore(self.store, lifecycles)
        for n, s in self.streams.items():
            m = s.package.manifest
            self.feed.add(n, "sensor", m.name, m.version, s.pipeline.threshold,
                          self.episodes.open.get(n))
        for n, c in self.cameras.items():
            im = c.package.manifest
            self.feed.add(n, "camera", im.name, im.version, c.pipeline.threshold,
                          self.episodes.open.get(n))
        self.state_publisher: StatePublisher | None = None
        if self.publisher is not None and config.mqtt.state:
            self.state_publisher = StatePublisher(self.board, self.publisher, self.metrics,
                                                  config.mqtt.state_interval_s)

    def _build_stream(self, sc: StreamConfig, source: Source | None = None) -> SensorStream:
        return build_sensor_stream(
            sc, source, config=self.config, metrics=self.metrics, store=self.store,
            clock=self.clock, updates=self._updates, enqueue=self.queue.put_until_stopped,
            offer=self.queue.offer,
            stop_event=self.stop_event, on_model_changed=self._model_changed,
            progress=self._loading(sc.name))

    def _loading(self, name: str) -> Callable[[], None]:
        """Called while a child process ranks the runtimes of stream ``name``: more start-up
        time from systemd, and a watchdog ping (a reload builds under a running watchdog)."""

        def progress() -> None:
            self.notifier.extend_timeout(START_STEP_S, f"ranking the runtimes of stream {name}")
            self.notifier.watchdog()

        return progress

    def _model_changed(self, name: str, package: ModelPackage) -> None:
        """A model update swapped the model in force (pipeline thread)."""
        s = self.streams[name]
        save_calibration(self.store, s, package, self.clock)
        s.pipeline.windower.hop = s.pipeline.spec.hop  # a degraded stride ends with the model
        self.metrics.model_info.labels(stream=name).info(
            {"name": package.manifest.name, "version": str(package.manifest.version),
             "backend": s.backend.name, "precision": s.backend.precision}
        )
        self.metrics.model_version.labels(stream=name).set(package.manifest.version)
        self.metrics.threshold.labels(stream=name).set(s.pipeline.threshold)
        if name in self.collectors:
            self.collectors[name].set_model(package.manifest.name, package.manifest.version)

    # -- running: agent.run_loop.AgentLoop ----------------------------------------------------


def _model_use(sc: StreamConfig) -> tuple[str, str, str]:
    """What camera streams sharing one loaded model have in common: model, precision, backend
    setting (:func:`agent.inference.image_select.open_image_backend`)."""
    return (sc.model, sc.precision, sc.backend)


def run(config: AgentConfig, config_dir: Path, config_file: Path | None = None) -> int:
    """CLI entry: resolve paths, set up logging, signals and /metrics, run the agent.

    SIGTERM and SIGINT stop; SIGHUP reloads ``config_file`` (see the module docstring; without
    a file, SIGHUP is logged and ignored). The process around the agents:
    :func:`agent.reload.run_with_reload`.

    Raises:
        ConfigError, ModelError, StoreError: start-up failed (the CLI maps them to exit codes).
    """
    return run_with_reload(config, config_dir, config_file, Agent)
