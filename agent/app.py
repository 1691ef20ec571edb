"""Composition root: build every component from the config, run, stop cleanly.

Threads: one per source (its supervisor), paho's network loop and the MQTT outbox drain, and
with ``[mqtt.sparkplug]`` a second paho loop and the Sparkplug B worker; the pipeline runs in
the thread that calls :meth:`Agent.run` (the main thread under the CLI, where signals arrive).
Sources hand readings over a bounded queue; a full queue blocks the source
(backpressure) rather than dropping a reading.

Start-up order (what READY=1 means): the config is valid (checked before the Agent is built),
the store is open and every model package is loaded and passed its golden vectors (the
constructor; EXTEND_TIMEOUT_USEC before each model so a slow load or compile does not hit
``TimeoutStartSec``), one warm-up inference per stream ran (:meth:`Agent.run`), the publisher,
uploader and sources are started; then READY=1. About once a second the main loop calls
:meth:`agent.monitor.Monitor.tick` (health, gauges, WATCHDOG=1 only while every stage makes
progress, STATUS=).

Shutdown (SIGTERM/SIGINT, or every source has ended): STOPPING=1, stop the sources, score
what is queued, close open aggregate intervals, wait up to ``SHUTDOWN_FLUSH_S`` for the outbox to
drain, publish ``offline``, close the store. Alerts not acknowledged by then stay in the outbox for
the next start. When every source has ended by itself, :meth:`Agent.run` returns 0 if each
reached the end of its finite input, and ``EX_UNAVAILABLE`` (69, :mod:`agent.exitcodes`) if at
least one failed for good (a sensor source's fatal error, a camera file that cannot be read), so
systemd's ``Restart=on-failure`` sees the failure; one ERROR line names the failed sources.

Reload (SIGHUP, ``systemctl reload``): the config file is read and checked again (schema, and
every model package loads); when invalid every problem is logged and the agent keeps running as
it was. When valid: RELOADING=1, the running agent stops as on shutdown (its outbox stays in the
store) and a new one is built from the new config and run in the same process, keeping the
/metrics endpoint. If the new agent cannot be built after all, the previous config is used again.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, TextIO

import numpy as np

from agent import __version__
from agent.config.loader import load_config
from agent.config.schema import AgentConfig, StreamConfig, resolve_model_path
from agent.disk_budget import DiskBudget, default_parts
from agent.errors import AgentError, ConfigError, ModelError, StoreError
from agent.exitcodes import EX_OK, EX_UNAVAILABLE
from agent.health import StallPolicy, camera_stall_policy, stall_policy
from agent.httpd import OpsServer
from agent.inference.base import Backend
from agent.inference.deadline import DeadlineGuard, DegradeParams
from agent.inference.image_package import load_image_package
from agent.inference.package import ModelPackage, load_package, saturation_fallback
from agent.inference.select import record_selection, registry_opener, select_backend
from agent.logs import ALWAYS, reset_rate_limits, setup_logging
from agent.metrics import Metrics
from agent.monitor import Monitor, WatchedCamera, WatchedSource
from agent.pipeline.detector import Calibration, FeatureDeviationDetector
from agent.pipeline.episodes import UpdateParams
from agent.pipeline.restore import CalibrationKey, StoredCalibration, calibration_key, refusal
from agent.pipeline.stream import AlertEvent, StreamPipeline
from agent.pipeline.univariate import (
    UnivariatePipeline,
    build_detector,
    univariate_channel,
)
from agent.preflight import preflight
from agent.publish.homeassistant import HomeAssistantDiscovery
from agent.publish.keeper import AlertKeeper
from agent.publish.mqtt import MqttPublisher
from agent.publish.state import StatePublisher
from agent.publish.stream_state import StateBoard
from agent.records import Aggregate, Alert, Float32Array, Reading, iso_utc
from agent.secret_files import private_umask, secure_state
from agent.services.camera import CameraStream, build_camera_stream
from agent.services.episode_book import EpisodeBook, recorded_identity
from agent.services.fleet_transport import session_for
from agent.services.health_reporter import HealthReporter, summarize
from agent.services.model_slot import ModelSlot
from agent.services.model_store import ModelStore
from agent.services.package_guard import (
    HIGH_WATER_FILE,
    HighWater,
    PackageGuard,
    load_keys_dir,
    load_rollback_policy,
)
from agent.services.samples import SampleCollector, SampleUploader, config_hash
from agent.services.snapshot_service import SnapshotService, build_snapshots
from agent.services.stream_feed import StateFeed
from agent.services.stream_rules import stream_rule_params
from agent.services.supervisor import SourceSupervisor
from agent.services.updater import StreamHandle, Updater
from agent.services.uploader import Uploader, read_token
from agent.sources.base import Source
from agent.sources.camera import CameraConfig
from agent.sources.camera_watch import ScoredFile
from agent.sources.registry import build_source
from agent.sources.replay import ReplayConfig
from agent.sources.simulator import SimulatorConfig
from agent.sources.valid_range import ValidRange
from agent.store.parts import RepeatPolicy
from agent.store.sqlite import Store
from agent.systemd import Notifier, watchdog_interval_s
from cloud_sync.health import HealthSummary
from cloud_sync.package import TrustedKeys

if TYPE_CHECKING:
    from agent.publish.sparkplug_edge import SparkplugEdgeNode

log = logging.getLogger("agent")

QUEUE_SIZE = 65_536
BATCH_MAX = 4_096
SHUTDOWN_FLUSH_S = 10.0
#: Longest the queued readings are scored for after a stop signal (the whole shutdown must stay
#: inside systemd's TimeoutStopSec (60 s) of systemd/edge-agent.service; a full 65,536-reading
#: queue behind a failing disk took over 30 s under load, and SIGKILL then loses the outbox
#: flush too). Readings left are dropped, counted in
#: ``edge_agent_dropped_total{kind="reading", reason="shutdown"}`` and logged once.
SHUTDOWN_DRAIN_S = 8.0
UPLOAD_STOP_S = 5.0
#: Seconds between two heartbeats (health, gauges, watchdog decision).
HEARTBEAT_S = 1.0
#: Start-up time asked of systemd (EXTEND_TIMEOUT_USEC) before each model load and warm-up.
START_STEP_S = 120.0


class _TimedBackend:
    """Wrap a backend to observe ``inference_seconds`` per call (per window: call / batch)."""

    def __init__(self, inner: Backend, observe: Callable[[float], None]) -> None:
        self._inner = inner
        self._observe = observe
        self.name = inner.name
        self.precision = inner.precision

    def run(self, windows: Float32Array) -> Float32Array:
        t0 = time.perf_counter()
        out = self._inner.run(windows)
        self._observe((time.perf_counter() - t0) / max(1, windows.shape[0]))
        return out


@dataclass
class _Stream:
    config: StreamConfig
    package: ModelPackage
    pipeline: StreamPipeline
    order: np.ndarray  # source column index for each model channel
    supervisor: SourceSupervisor
    backend: Backend
    policy: StallPolicy
    pending: list[Reading] = field(default_factory=list)
    slot: ModelSlot | None = None  # model-update handoff (pipeline thread syncs it per block)


class Agent:
    """The running agent.

    Args:
        config: A config whose paths are already absolute (``AgentConfig.resolved``).
        metrics: Metrics registry holder.
        console: Where alerts are printed when ``agent.console_alerts`` is on.
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
        console: TextIO | None = sys.stdout,
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
        self.queue: queue.Queue[Reading] = queue.Queue(maxsize=QUEUE_SIZE)
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
            self.uploader = _build_uploader(config, self.store, self.metrics, clock)
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
            self.sparkplug = _build_sparkplug(config, names, self.metrics)
            self.sparkplug.attach(self.board)
        self.streams: dict[str, _Stream] = {}
        #: Camera streams score in their own threads; alerts/aggregates come back on a queue.
        self.cameras: dict[str, CameraStream] = {}
        self.image_events: queue.Queue[AlertEvent | Aggregate | ScoredFile] = queue.Queue()
        self._updates = _open_model_store(config) if config.updater.enabled else None
        for sc in config.streams:
            self.notifier.extend_timeout(START_STEP_S, f"loading the model of stream {sc.name}")
            self.notifier.watchdog()  # a reload builds under a running watchdog: progress
            if sc.source.kind == "camera":
                self.cameras[sc.name] = build_camera_stream(
                    sc, config.agent.device_id, config.store.aggregate_interval_s,
                    self.image_events.put, self.stop_event, self.metrics,
                    cache_dir=state_dir / "openvino-cache", store=self.store)
                continue
            self.streams[sc.name] = self._build_stream(sc, given.get(sc.name))
        self.updater: Updater | None = None
        if self._updates is not None:
            self.updater = _build_updater(self, *self._updates)
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
            self.samples = _build_samples(self)
        self.health_reporter: HealthReporter | None = None
        if self.uploader is not None and config.fleet.health_interval_s > 0:
            self.health_reporter = _build_health_reporter(self)
        self._lifecycle_setup(config)
        self.alerts_raised = 0
        self.aggregates_written = 0
        self.aggregates_dropped = 0
        self.readings_dropped = 0
        #: Stores alerts; delivers those the store refuses over MQTT from memory.
        self.keeper = AlertKeeper(self.store, self.publisher, self.metrics)
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
            cameras={n: WatchedCamera(c, _camera_policy(config, n))
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

    def _build_stream(self, sc: StreamConfig, source: Source | None = None) -> _Stream:
        if isinstance(sc.source, CameraConfig):  # built by build_camera_stream instead
            msg = f"streams.{sc.name}: a camera stream is not a sensor stream"
            raise ConfigError(msg, problems=[msg])
        installed = None
        if self._updates is not None:  # a package installed by the updater, verified again
            installed = self._updates[0].load_active(sc.name, self._updates[1])
        package = (installed[0] if installed is not None
                   else load_package(resolve_model_path(sc.model, Path.cwd())))
        # the fastest runtime that passes the golden vectors, guarded by the latency budget
        selection = select_backend(package, sc.backend, sc.precision, opener=registry_opener(
            cache_dir=Path(self.config.agent.state_dir) / "openvino-cache"))
        record_selection(self.metrics, sc.name, selection)
        guard = DeadlineGuard(sc.name, selection.backends,
                              DegradeParams(package.manifest.latency_budget_ms_p99 / 1e3),
                              self.metrics)
        backend: Backend = guard
        fallback, input_range = saturation_fallback(package, selection.chosen.candidate.artefact)
        hist = self.metrics.inference_seconds.labels(stream=sc.name, backend=backend.name)
        spec = package.detector_spec(
            window=sc.window,
            hop=sc.hop,
            calibration_samples=sc.calibration_samples,
            threshold_quantile=sc.threshold_quantile,
        )
        if source is None:
            source = build_source(sc.source, sc.name)
        elif source.stream != sc.name:
            msg = f"streams.{sc.name}: the given source stamps stream {source.stream!r}"
            raise ConfigError(msg, problems=[msg])
        univariate = package.univariate_params()
        source_channels = (univariate_channel(sc, package.label, spec.channels, source.channels)
                           if univariate is not None else spec.channels)
        if sc.channel is not None and univariate is None:
            msg = (f"streams.{sc.name}.channel: model {package.label} has "
                   f"{len(spec.channels)} channels; 'channel' maps a one-channel package only")
            raise ConfigError(msg, problems=[msg])
        missing = [c for c in source_channels if c not in source.channels]
        if missing:
            msg = (
                f"streams.{sc.name}: model {package.label} needs channels {missing} that the "
                f"source does not provide (source channels: {list(source.channels)})"
            )
            raise ConfigError(msg, problems=[msg])
        order = np.array([source.channels.index(c) for c in source_channels], dtype=np.int64)
        r = sc.rules
        preset = _preset_calibration(package, self.config.agent.device_id, sc.name)
        restored = None if preset is not None else self._restore_calibration(
            sc, calibration_key(package.manifest, spec, backend.precision))
        start_cal = preset if restored is None else restored.calibration
        rule_params = stream_rule_params(r, package.manifest.univariate)
        timed = _TimedBackend(backend, hist.observe)
        pipeline: StreamPipeline
        if univariate is not None:
            pipeline = UnivariatePipeline(
                sc.name, self.config.agent.device_id, spec,
                build_detector(spec, timed, univariate, fallback=fallback,
                               input_range=input_range),
                rule_params, univariate, self.config.store.aggregate_interval_s,
                r.top_channels, start_cal, channel_label=source_channels[0])
        else:
            pipeline = StreamPipeline(
                sc.name,
                self.config.agent.device_id,
                spec,
                FeatureDeviationDetector(spec, timed, fallback=fallback,
                                         input_range=input_range),
                rule_params,
                aggregate_interval_s=self.config.store.aggregate_interval_s,
                top_channels=r.top_channels,
                calibration=start_cal,
            )
        if restored is not None:  # a model update calibrates its candidate on these readings
            pipeline.calibration_samples = restored.readings
        guard.on_stride = lambda k: setattr(pipeline.windower, "hop", spec.hop * k)
        try:
            valid = ValidRange(source.channels,
                               {r.channel: (r.low, r.high) for r in sc.valid_range})
        except ValueError as exc:
            msg = f"streams.{sc.name}.valid_range: {exc}"
            raise ConfigError(msg, problems=[msg]) from None
        supervisor = SourceSupervisor(source, self._enqueue, self.metrics, self.stop_event,
                                      valid_range=valid)
        self.metrics.model_info.labels(stream=sc.name).info(
            {"name": package.manifest.name, "version": str(package.manifest.version),
             "backend": backend.name, "precision": backend.precision}
        )
        self.metrics.calibrating.labels(stream=sc.name).set(0 if start_cal else 1)
        if start_cal is not None:
            self.metrics.threshold.labels(stream=sc.name).set(start_cal.threshold)
        log.info(
            "stream %s: source %s, model %s (%s/%s, window %d, hop %d), %s",
            sc.name, sc.source.kind, package.label, backend.name, backend.precision,
            spec.window, spec.hop,
            f"calibration from the package (threshold {preset.threshold:.3f})" if preset
            else "calibration restored" if restored
            else f"calibrating on the first {spec.calibration_samples} readings",
            extra={**ALWAYS, "stream": sc.name, "model_version": package.manifest.version},
        )
        policy = stall_policy(sc.source, package.manifest.input.sample_rate_hz, sc.stall_after_s)
        slot = None
        if self._updates is not None:
            slot = ModelSlot(sc.name, package, lambda p: self._model_changed(sc.name, p))
        return _Stream(sc, package, pipeline, order, supervisor, backend, policy, slot=slot)

    def _restore_calibration(
        self, sc: StreamConfig, key: CalibrationKey
    ) -> StoredCalibration | None:
        """The stream's stored calibration when it fits ``key`` (else one INFO line why)."""
        try:
            stored = self.store.calibration(sc.name)
        except StoreError as exc:
            log.warning("stream %s: stored calibration unreadable (%s); calibrating afresh",
                        sc.name, exc)
            return None
        if stored is None:
            return None
        why = ("streams.recalibrate_on_start is set" if sc.recalibrate_on_start
               else refusal(stored, key, self.clock(), sc.calibration_max_age_s))
        if why is not None:
            log.info("stream %s: stored calibration not restored (%s); calibrating afresh",
                     sc.name, why)
            return None
        log.info("stream %s: calibration restored (fitted %s, threshold %.3f)", sc.name,
                 iso_utc(stored.fitted_at), stored.calibration.threshold)
        return stored

    def _save_calibration(self, s: _Stream, package: ModelPackage) -> None:
        """Store the stream's calibration in force for the next start (pipeline thread)."""
        cal, det = s.pipeline.calibration, s.pipeline.detector
        if cal is None:
            return
        readings = s.pipeline.calibration_samples  # far-out readings left out: may be < N
        rec = StoredCalibration(
            s.config.name, calibration_key(package.manifest, det.spec, det.backend.precision),
            cal, self.clock(),
            det.spec.calibration_samples if readings is None else len(readings), readings,
        )
        try:
            self.store.save_calibration(rec)
        except StoreError as exc:
            log.error("stream %s: calibration not stored (the next start calibrates again): %s",
                      s.config.name, exc)

    def _model_changed(self, name: str, package: ModelPackage) -> None:
        """A model update swapped the model in force (pipeline thread)."""
        s = self.streams[name]
        self._save_calibration(s, package)
        s.pipeline.windower.hop = s.pipeline.spec.hop  # a degraded stride ends with the model
        self.metrics.model_info.labels(stream=name).info(
            {"name": package.manifest.name, "version": str(package.manifest.version),
             "backend": s.backend.name, "precision": s.backend.precision}
        )
        self.metrics.model_version.labels(stream=name).set(package.manifest.version)
        self.metrics.threshold.labels(stream=name).set(s.pipeline.threshold)
        if name in self.collectors:
            self.collectors[name].set_model(package.manifest.name, package.manifest.version)

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

    def _enqueue(self, reading: Reading) -> None:
        # Backpressure: block the source while the pipeline is behind; never drop.
        while not self.stop_event.is_set():
            try:
                self.queue.put(reading, timeout=0.5)
                return
            except queue.Full:
                continue

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
        self.feed.health({comp.name.removeprefix("source:"): comp.state
                          for comp in report.components if comp.name.startswith("source:")})

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
                self._process(s)

    def _process(self, s: _Stream) -> None:
        readings, s.pending = s.pending, []
        values = np.stack([r.values for r in readings])[:, s.order]
        ts = np.fromiter((r.ts for r in readings), dtype=np.float64, count=len(readings))
        mono = readings[-1].received_mono
        received = np.fromiter((r.received_mono for r in readings), dtype=np.float64,
                               count=len(readings))
        was_calibrating = s.pipeline.calibrating
        if s.slot is not None:  # model updates happen here, between two blocks
            s.package = s.slot.sync(s.pipeline)
        out = s.pipeline.process_block(values, ts, mono, received)
        if s.slot is not None:  # a new model that failed at run time was swapped back
            s.package = s.slot.sync(s.pipeline)
        name = s.config.name
        for step in out.clock_steps:
            self.metrics.clock_steps_total.labels(stream=name, direction=step.direction).inc()
            log.warning("stream %s: timestamps stepped %s by %.1f s at %s (wall clock set by NTP "
                        "or a missing RTC, or a gap in the input); the open aggregate interval "
                        "was closed and alert cooldowns count monotonic time across the step",
                        name, step.direction, abs(step.size_s), iso_utc(step.at_ts),
                        extra={**ALWAYS, "stream": name})
        if was_calibrating and out.calibrated is not None:
            self.metrics.calibrating.labels(stream=name).set(0)
            self.metrics.threshold.labels(stream=name).set(out.calibrated.threshold)
            fitted = s.pipeline.calibration_samples
            log.info("stream %s: calibrated on %d readings, threshold %.3f", name,
                     s.pipeline.spec.calibration_samples if fitted is None else len(fitted),
                     out.calibrated.threshold, extra={"stream": name})
            if out.calibration_outliers:
                self.metrics.calibration_outliers_total.labels(stream=name).inc(
                    out.calibration_outliers)
                log.warning("stream %s: %d far-out reading(s) left out of the calibration",
                            name, out.calibration_outliers, extra=ALWAYS)
            self._save_calibration(s, s.package)
        collector = self.collectors.get(name)
        if collector is not None:  # retraining samples: calibration block, normal windows
            if out.calibrated is not None and s.pipeline.calibration_samples is not None:
                collector.add_calibration(s.pipeline.calibration_samples)
                if self.samples is not None:
                    self.samples.notify()
            collector.observe(values, out.end_index, out.scores, out.threshold)
        if out.nonfinite_scores:
            self.metrics.nonfinite_scores_total.labels(stream=name).inc(out.nonfinite_scores)
            log.warning("stream %s: %d window(s) scored non-finite (a reading the model cannot "
                        "represent); scored off-scale", name, out.nonfinite_scores,
                        extra={"stream": name})
        n_scored = int(np.count_nonzero(~np.isnan(out.scores)))
        if n_scored:
            self.metrics.windows_total.labels(stream=name).inc(n_scored)
            if mono:
                self.metrics.read_to_score_seconds.labels(stream=name).observe(
                    time.monotonic() - mono
                )
        finite = out.scores[np.isfinite(out.scores)]
        m = s.package.manifest
        self.feed.scored(name, float(finite[-1]) if finite.size else None, out.threshold,
                         model_name=m.name, model_version=m.version,
                         skipping=s.pipeline.windower.hop > s.pipeline.spec.hop)
        for event in out.events:
            self._raise(s, event)
        for agg in out.aggregates:
            self._write_aggregate(agg)

    def _drain_images(self) -> None:
        """Store the alerts and aggregates the camera streams produced, then mark the watched
        folders' files whose alerts they were (main thread)."""
        while True:
            try:
                item = self.image_events.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, AlertEvent):
                self._raise(self.cameras[item.stream], item)
            elif isinstance(item, ScoredFile):
                item.commit()
            else:
                self._write_aggregate(item)

    def _raise(self, s: _Stream | CameraStream, event: AlertEvent) -> None:
        """Store one episode event (raised, updated, cleared) and hand it on."""
        device = self.config.agent.device_id
        m = s.package.manifest
        episodic = (s.pipeline.rules.params.clear_windows > 0)
        plan = self.episodes.plan(event, episodic)
        if plan is None:
            return
        # a camera's raised event carries a snapshot of its frame (not updated / cleared)
        snaps = (self.snapshots if isinstance(s, CameraStream) and event.frame is not None
                 and event.kind == "raised" else None)

        def make(seq: int) -> Alert:
            return Alert(
                alert_id=f"{device}:{event.stream}:{seq}",
                device_id=device,
                stream=event.stream,
                seq=seq,
                model_name=m.name,
                model_version=m.version,
                score=event.score,
                threshold=event.threshold,
                window_start=event.window_start,
                window_end=event.window_end,
                raised_at=self.clock(),
                top_channels=event.top_channels,
                origin=event.origin,
                explanation=event.explanation,
                event=event.kind,
                episode_id=plan.episode_id,
                peak_score=event.peak_score,
                reason=event.reason,
                snapshot=(None if snaps is None
                          else snaps.ref(event.stream, f"{device}:{event.stream}:{seq}")),
            )

        # A refused alert goes over MQTT from memory (or is counted lost): agent.publish.keeper.
        alert, stored = self.keeper.add(event.stream, make, plan.mark, plan.seq)
        if alert is None:
            return
        self.episodes.stored(event, alert.alert_id, plan)
        if plan.mark.open or plan.mark.close:
            self.feed.episode(event.stream, self.episodes.open.get(event.stream))
        self.metrics.alert_events_total.labels(stream=event.stream, event=event.kind).inc()
        if event.kind == "raised":
            self.alerts_raised += 1
            self.metrics.alerts_total.labels(stream=event.stream).inc()
        if snaps is not None and isinstance(s, CameraStream):
            snaps.submit(alert, event, s)
        if self.publisher is not None:
            self.publisher.notify(alert.alert_id, event.received_mono or None)
        if self.uploader is not None and stored:
            self.uploader.notify()
        if self.console is not None:
            print(alert.console_line(), file=self.console, flush=True)

    def _write_aggregate(self, agg: Aggregate) -> None:
        try:
            self.store.add_aggregate(agg, self._repeat.get(agg.stream, "same_readings"))
            self.aggregates_written += 1
        except StoreError as exc:
            self.aggregates_dropped += 1
            self.metrics.dropped_total.labels(kind="aggregate", reason="store_error").inc()
            log.error("stream %s: aggregate not stored: %s", agg.stream, exc,
                      extra={"stream": agg.stream})
            return
        self.keeper.persist_seq()

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
        """Stop sources, score what is queued, flush aggregates and the outbox, close.

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
                    self._raise(s, ended)
            for agg in s.pipeline.flush():
                self._write_aggregate(agg)
        for c in self.cameras.values():
            c.join(timeout=5.0)
            for agg in c.flush():
                self.image_events.put(agg)
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


def _build_sparkplug(config: AgentConfig, streams: list[str], metrics: Metrics
                     ) -> SparkplugEdgeNode:
    """The Sparkplug B edge node (``[mqtt.sparkplug]`` enabled); ConfigError without protobuf."""
    try:
        from agent.publish.sparkplug_edge import (  # noqa: PLC0415 - protobuf only when used
            SparkplugEdgeNode,
        )
    except ImportError as exc:
        msg = (f"mqtt.sparkplug.enabled needs protobuf ({exc}); install "
               "'edge-anomaly-agent[sparkplug]'")
        raise ConfigError(msg, problems=[msg]) from None
    return SparkplugEdgeNode(config.mqtt, config.agent.device_id, streams, metrics,
                             Path(config.agent.state_dir))


def _camera_policy(config: AgentConfig, name: str) -> StallPolicy:
    """The stall policy of camera stream ``name`` (its ``camera`` source config)."""
    sc = next(s for s in config.streams if s.name == name)
    assert isinstance(sc.source, CameraConfig)
    return camera_stall_policy(sc.source, sc.stall_after_s)


def _preset_calibration(package: ModelPackage, device_id: str, stream: str) -> Calibration | None:
    """The package's cloud-fitted calibration when it was fitted for this device and stream."""
    preset = package.preset_calibration()
    fitted = package.manifest.calibration
    if preset is None or fitted is None:
        return None
    if (fitted.fitted_on.device_id, fitted.fitted_on.stream) != (device_id, stream):
        log.warning(
            "stream %s: model %s carries a calibration fitted for %s/%s, not this device; "
            "calibrating on the device instead",
            stream, package.label, fitted.fitted_on.device_id, fitted.fitted_on.stream,
        )
        return None
    return preset


def _open_model_store(config: AgentConfig) -> tuple[ModelStore, TrustedKeys]:
    """``<state_dir>/models`` and the pinned keys of ``[updater]``; ConfigError on bad keys."""
    assert config.updater.trusted_keys_dir is not None  # UpdaterConfig requires it when enabled
    keys = load_keys_dir(config.updater.trusted_keys_dir, "updater.trusted_keys_dir")
    return ModelStore(Path(config.agent.state_dir) / "models"), keys


def _build_updater(agent: Agent, store: ModelStore, keys: TrustedKeys) -> Updater:
    """The model updater over the agent's streams (``[updater]`` and ``[fleet]`` enabled)."""
    from cloud_sync.client import FleetClient  # noqa: PLC0415 - requests only when enabled

    config, fc = agent.config, agent.config.fleet
    assert fc.url is not None
    client = FleetClient(fc.url, read_token(fc), session_for(fc),
                         connect_timeout_s=fc.connect_timeout_s,
                         read_timeout_s=fc.read_timeout_s, clock=agent.clock)
    handles = {}
    for name, s in agent.streams.items():
        assert s.slot is not None
        rec = store.active(name)
        handles[name] = StreamHandle(
            name, s.slot, s.pipeline, s.config.threshold_quantile,
            installed=rec if rec is not None and Path(rec.path) == s.package.path else None,
        )

    def wrap(stream: str, backend: Backend) -> Backend:
        hist = agent.metrics.inference_seconds.labels(stream=stream, backend=backend.name)
        return _TimedBackend(backend, hist.observe)

    uc = config.updater
    guard = PackageGuard(
        HighWater(store.root / HIGH_WATER_FILE),
        load_rollback_policy(uc.rollback_keys_dir, uc.rollback_max_age_s, keys),
        config.agent.device_id, uc.max_archive_bytes, agent.clock,
    )
    return Updater(uc, client, store, handles, config.agent.device_id, keys,
                   agent.metrics, wrap_backend=wrap, clock=agent.clock, guard=guard,
                   abort=client.abort)


def _build_samples(agent: Agent) -> SampleUploader:
    """Sample collectors for every stream and their uploader (``[samples]`` enabled)."""
    from cloud_sync.client import FleetClient  # noqa: PLC0415 - requests only when enabled

    config, fc = agent.config, agent.config.fleet
    assert fc.url is not None  # AgentConfig requires [fleet] for [samples]
    for name, s in agent.streams.items():
        m = s.package.manifest
        agent.collectors[name] = SampleCollector(
            config.agent.device_id, name, s.pipeline.spec.channels, s.pipeline.spec.window,
            m.input.sample_rate_hz, (m.name, m.version),
            config_hash(s.config.model_dump_json(), s.package.label),
            config.samples.reservoir_size,
        )
    client = FleetClient(fc.url, read_token(fc), session_for(fc),
                         connect_timeout_s=fc.connect_timeout_s,
                         read_timeout_s=fc.read_timeout_s, clock=agent.clock)
    return SampleUploader(client, agent.collectors, config.samples.upload_interval_s)


def _build_health_reporter(agent: Agent) -> HealthReporter:
    """The health reporter of ``[fleet]`` (its own client: a slow health post never holds an
    upload connection)."""
    from cloud_sync.client import FleetClient  # noqa: PLC0415 - requests only when enabled

    fc, uploader = agent.config.fleet, agent.uploader
    assert fc.url is not None and uploader is not None
    client = FleetClient(fc.url, read_token(fc), session_for(fc),
                         connect_timeout_s=fc.connect_timeout_s,
                         read_timeout_s=fc.read_timeout_s, clock=agent.clock)

    def build() -> HealthSummary:
        models = [(n, s.package.manifest.name, s.package.manifest.version)
                  for n, s in agent.streams.items()]
        backlog = agent.store.upload_backlog()
        return summarize(agent.monitor.report(), agent.config.agent.device_id, __version__,
                         backlog, models)

    return HealthReporter(client, build, fc.health_interval_s)


def _build_uploader(
    config: AgentConfig, store: Store, metrics: Metrics, clock: Callable[[], float]
) -> Uploader:
    """The fleet client and uploader for ``config.fleet`` (enabled); ConfigError on no token."""
    from cloud_sync.client import FleetClient  # noqa: PLC0415 - requests only when enabled

    fc = config.fleet
    assert fc.url is not None  # FleetConfig requires it when enabled
    current = [read_token(fc)]
    client = FleetClient(
        fc.url, current[0], session_for(fc), connect_timeout_s=fc.connect_timeout_s,
        read_timeout_s=fc.read_timeout_s, clock=clock, gzip_level=fc.gzip_level,
    )

    def refresh_token() -> bool:  # after a 401/403: the operator may have re-enrolled us
        token = read_token(fc)
        if token == current[0]:
            return False
        current[0] = token
        client.set_token(token)
        return True

    return Uploader(
        store, client, config.agent.device_id, metrics, batch_records=fc.batch_records,
        interval_s=fc.interval_s, backoff_max_s=fc.backoff_max_s,
        max_bytes_per_s=fc.max_bytes_per_s, max_in_flight=fc.max_in_flight, clock=clock,
        refresh_token=refresh_token, abort=client.abort, slow_request_s=fc.read_timeout_s,
    )


def check_reload(config_file: Path) -> AgentConfig | None:
    """Read and check ``config_file`` for a reload: schema, paths, every model package loads.

    Returns:
        The resolved config, or None when invalid (every problem is logged at ERROR).
    """
    try:
        config = load_config(config_file).resolved(config_file.resolve().parent)
        for sc in config.streams:
            path = resolve_model_path(sc.model, Path.cwd())
            if isinstance(sc.source, CameraConfig):
                load_image_package(path)
            else:
                load_package(path)
    except ConfigError as exc:
        for problem in exc.problems or [str(exc)]:
            log.error("reload refused: %s: %s", config_file, problem, extra=ALWAYS)
        return None
    except AgentError as exc:
        log.error("reload refused: %s: %s", config_file, exc, extra=ALWAYS)
        return None
    log.info("reload: %s is valid; restarting the agent's components with it", config_file,
             extra=ALWAYS)
    return config


def repeat_policy(source: object) -> RepeatPolicy:
    """How a stream's aggregate for an interval the store already holds is stored
    (:data:`agent.store.parts.RepeatPolicy`): a recorded input (replay file, video file, image
    folder) is read again from its start after a restart, so an aggregate with the same
    readings is a copy; a simulator faster than real time rewrites its own timeline, so the
    repeat is a copy; a live source in real time (serial port, camera device or stream URL,
    simulator at ``speed = 1``) only ever sends new readings, so the repeat is the next part.
    """
    if isinstance(source, CameraConfig):  # a watched folder sends only new images
        recorded = source.path is not None or source.folder is not None
        return "same_readings" if recorded and not source.watch else "part"
    if isinstance(source, ReplayConfig):
        return "same_readings"
    if isinstance(source, SimulatorConfig):
        return "part" if source.speed == 1.0 else "ignore"
    return "part"


def lock_state_dir(state_dir: Path) -> TextIO:
    """Take an exclusive lock on ``state_dir/agent.lock`` (one agent per state directory).

    Two agents on one state directory would share one outbox and sequence counter and fight over
    one MQTT client id. The lock (``fcntl.flock``) is released by the kernel when the process
    exits, however it exits.

    Returns:
        The open lock file (keep a reference for the life of the process).

    Raises:
        AgentError: another process holds the lock (its pid is named) or the file cannot be made.
    """
    path = state_dir / "agent.lock"
    try:
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        fh = open(path, "a+", encoding="utf-8",  # noqa: SIM115 - held for the process's life
                  opener=lambda p, f: os.open(p, f, 0o600))
    except OSError as exc:
        raise AgentError(f"cannot create the state lock {path}: {exc}") from exc
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.seek(0)
        holder = fh.read().strip() or "unknown"
        fh.close()
        raise AgentError(
            f"state directory {state_dir} is in use by another edge-agent (pid {holder}); "
            "give each agent its own agent.state_dir"
        ) from None
    try:  # unbuffered: a full disk leaves nothing in a buffer for close() to fail on
        os.ftruncate(fh.fileno(), 0)
        os.pwrite(fh.fileno(), f"{os.getpid()}\n".encode(), 0)
    except OSError as exc:  # e.g. a full disk: the lock is held, only the pid note failed
        log.warning("state lock %s: cannot write this process's pid into it (%s); the lock "
                    "holds, a second agent will not name this one", path, exc)
    return fh


def run(config: AgentConfig, config_dir: Path, config_file: Path | None = None) -> int:
    """CLI entry: resolve paths, set up logging, signals and /metrics, run the agent.

    SIGTERM and SIGINT stop; SIGHUP reloads ``config_file`` (see the module docstring; without
    a file, SIGHUP is logged and ignored).

    Raises:
        ConfigError, ModelError, StoreError: start-up failed (the CLI maps them to exit codes).
    """
    config = config.resolved(config_dir)
    problems = preflight(config)
    if problems:
        raise ConfigError(f"{len(problems)} problem(s) in the configuration", problems=problems)
    setup_logging(config.agent.log_level, config.agent.log_format)
    state_lock = lock_state_dir(Path(config.agent.state_dir))  # held until the process exits
    metrics = Metrics()
    notifier = Notifier()
    current: list[Agent] = []
    server: OpsServer | None = None
    if config.agent.metrics_port is not None:
        address, port = config.agent.metrics_address, config.agent.metrics_port
        try:
            server = OpsServer(
                metrics.registry,
                lambda: current[-1].monitor.report(),  # noqa: PLW0108 - the agent changes
                address,
                port,
            )
        except OSError as exc:
            raise AgentError(f"cannot serve /metrics on {address}:{port}: {exc}") from exc
    stopping = threading.Event()

    def _stop(signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        log.info("signal %s received; stopping", name, extra=ALWAYS)
        stopping.set()
        if current:
            current[-1].request_stop(f"stopping on {name}")

    def _hup(signum: int, _frame: FrameType | None) -> None:
        if config_file is None:
            log.warning("SIGHUP ignored: running on the embedded default config (no file)",
                        extra=ALWAYS)
        elif current:
            log.info("SIGHUP received; checking %s", config_file, extra=ALWAYS)
            current[-1].request_reload()

    reload = (lambda: check_reload(config_file)) if config_file is not None else None
    previous: dict[signal.Signals, object] = {}
    for sig, handler in ((signal.SIGTERM, _stop), (signal.SIGINT, _stop),
                         (signal.SIGHUP, _hup)):
        previous[sig] = signal.signal(sig, handler)
    umask = private_umask()  # what the agent writes is 0600/0700 (agent.secret_files)
    secure_state(Path(config.agent.state_dir), Path(config.store.path))
    try:
        try:
            current.append(Agent(config, metrics, notifier=notifier, reload=reload))
        except (ModelError, StoreError) as exc:
            log.error("cannot start: %s", exc)
            raise
        if server is not None:
            server.start()
        while True:
            agent = current[-1]
            if stopping.is_set():
                agent.request_stop("stopping on a signal received during the reload")
            code = agent.run()
            new = agent.next_config
            if new is None or stopping.is_set():
                if new is not None:
                    notifier.stopping()
                return code
            notifier.watchdog()  # the old agent stopped in time: progress
            reset_rate_limits()  # the restarted components' start lines are new events
            try:
                current.append(Agent(new, metrics, notifier=notifier, reload=reload))
                config = new
            except AgentError as exc:
                log.error("reload failed (%s); starting again with the previous config", exc,
                          extra=ALWAYS)
                current.append(Agent(config, metrics, notifier=notifier, reload=reload))
            del current[:-1]
    finally:
        if server is not None:
            server.stop()
        notifier.close()
        with contextlib.suppress(OSError):  # nothing buffered; the flock goes either way
            state_lock.close()  # releases the flock
        os.umask(umask)
        for sig, old_handler in previous.items():
            signal.signal(sig, old_handler)  # type: ignore[arg-type]
