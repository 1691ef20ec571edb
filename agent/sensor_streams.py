"""Sensor streams: one stream's model package, runtime, pipeline and source supervisor, built
from its ``[[streams]]`` config (camera streams: :mod:`agent.services.camera`).

:func:`build_sensor_stream` loads the package (or the one the updater installed), selects the
fastest runtime that passes the golden vectors (:mod:`agent.inference.select`; a ranking
remembered by an earlier start in the state directory opens only the runtimes it keeps:
:mod:`agent.inference.choice_memory`; a first start times them in a child process:
:mod:`agent.inference.rank_child`) behind its
latency guard (:mod:`agent.inference.deadline`), checks the source's channels against the
model, restores a stored calibration when it fits (:mod:`agent.pipeline.restore`) and builds
the pipeline, resuming a univariate stream's adapted baseline (:mod:`agent.services.baselines`);
:func:`save_calibration` stores the calibration in force for the next start.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from agent.config.schema import AgentConfig, StreamConfig, resolve_model_path
from agent.errors import ConfigError, StoreError
from agent.health import StallPolicy, stall_policy
from agent.inference.base import Backend
from agent.inference.choice_memory import ChoiceMemory, selection_key
from agent.inference.deadline import DeadlineGuard, DegradeParams
from agent.inference.package import ModelPackage, load_package, saturation_fallback
from agent.inference.rank_child import child_ranker
from agent.inference.select import (
    Opener,
    Remembering,
    Selection,
    deferred_open,
    record_selection,
    registry_opener,
    select_backend,
)
from agent.logs import ALWAYS
from agent.metrics import Metrics
from agent.pipeline.detector import Calibration, FeatureDeviationDetector
from agent.pipeline.restore import CalibrationKey, StoredCalibration, calibration_key, refusal
from agent.pipeline.stream import StreamPipeline
from agent.pipeline.univariate import UnivariatePipeline, univariate_channel
from agent.pipeline.univariate_detector import build_detector
from agent.records import Float32Array, Reading, iso_utc
from agent.services.baselines import restore_baseline
from agent.services.model_slot import ModelSlot
from agent.services.model_store import ModelStore
from agent.services.stream_rules import stream_rule_params
from agent.services.supervisor import SourceSupervisor
from agent.sources.base import Offer, Source
from agent.sources.camera import CameraConfig
from agent.sources.registry import build_source
from agent.sources.valid_range import ValidRange
from agent.store.sqlite import Store
from cloud_sync.package import TrustedKeys

log = logging.getLogger("agent")

Clock = Callable[[], float]
#: Backends a stream opens at start: the chosen one; the latency guard's fallback (the next
#: fastest that passed) is opened when the guard first needs it (:func:`_guard_backends`).
OPENED_AT_START = 1


class TimedBackend:
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

    def close(self) -> None:
        self._inner.close()


@dataclass
class SensorStream:
    """One sensor stream of the running agent (the pipeline thread owns it)."""

    config: StreamConfig
    package: ModelPackage
    pipeline: StreamPipeline
    order: np.ndarray  # source column index for each model channel
    supervisor: SourceSupervisor
    backend: Backend
    policy: StallPolicy
    pending: list[Reading] = field(default_factory=list)
    slot: ModelSlot | None = None  # model-update handoff (pipeline thread syncs it per block)


def build_sensor_stream(
    sc: StreamConfig, source: Source | None, *, config: AgentConfig, metrics: Metrics,
    store: Store, clock: Clock, updates: tuple[ModelStore, TrustedKeys] | None,
    enqueue: Callable[[Reading], None], stop_event: threading.Event,
    offer: Offer | None = None,
    on_model_changed: Callable[[str, ModelPackage], None],
    progress: Callable[[], None] | None = None,
) -> SensorStream:
    """Build the sensor stream of ``sc`` (``source``: a ready-made source instead of one built
    from ``sc.source``).

    Args:
        sc: The stream's config (not a camera stream).
        source: A ready-made source, or None to build one from ``sc.source``.
        config: The whole (resolved) config: device id, state dir, aggregate interval.
        metrics: Where the stream's gauges and histograms are registered.
        store: Holds the stored calibrations.
        clock: Wall clock, epoch seconds UTC (calibration ages).
        updates: The updater's model store and pinned keys (``[updater]`` enabled), else None.
        enqueue: Where the source supervisor hands its readings (blocks when full).
        stop_event: Stops the source supervisor.
        offer: Where sources that must not block offer their readings
            (:class:`agent.sources.base.TakesOffer`); None = ``enqueue``.
        on_model_changed: Called ``(stream, package)`` on the pipeline thread when a model
            update swapped the model in force.
        progress: Called every few seconds while a child process ranks the runtimes
            (:func:`agent.inference.rank_child.child_ranker`).

    Raises:
        ConfigError: The source and the model do not fit together, a camera stream was
            given, or ``valid_range`` is invalid.
        ModelError: The model package is missing, corrupt or fails its golden vectors.
    """
    if isinstance(sc.source, CameraConfig):  # built by build_camera_stream instead
        msg = f"streams.{sc.name}: a camera stream is not a sensor stream"
        raise ConfigError(msg, problems=[msg])
    installed = None
    if updates is not None:  # a package installed by the updater, verified again
        installed = updates[0].load_active(sc.name, updates[1])
    package = (installed[0] if installed is not None
               else load_package(resolve_model_path(sc.model, Path.cwd())))
    # the fastest runtime that passes the golden vectors, guarded by the latency budget
    state_dir = Path(config.agent.state_dir)
    remembering = Remembering(ChoiceMemory.in_state_dir(state_dir),
                              selection_key(package, sc.backend, sc.precision, threads=1),
                              keep=OPENED_AT_START)
    # a first selection times every runtime in a child process (rank_child): this process
    # imports only the runtimes it opens
    cache_dir = state_dir / "openvino-cache"
    opener = registry_opener(cache_dir=cache_dir)
    selection = select_backend(package, sc.backend, sc.precision, opener=opener,
                               remembering=remembering,
                               ranker=child_ranker(cache_dir=cache_dir, progress=progress))
    record_selection(metrics, sc.name, selection)
    kept, open_fallback = _guard_backends(package, selection, opener)
    guard = DeadlineGuard(sc.name, kept,
                          DegradeParams(package.manifest.latency_budget_ms_p99 / 1e3),
                          metrics, fallback=open_fallback)
    backend: Backend = guard
    fallback, input_range = saturation_fallback(package, selection.chosen.candidate.artefact)
    hist = metrics.inference_seconds.labels(stream=sc.name, backend=backend.name)
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
    preset = preset_calibration(package, config.agent.device_id, sc.name)
    key = calibration_key(package.manifest, spec, backend.precision)
    restored = None if preset is not None else restore_calibration(store, sc, key, clock)
    start_cal = preset if restored is None else restored.calibration
    rule_params = stream_rule_params(r, package.manifest.univariate)
    timed = TimedBackend(backend, hist.observe)
    pipeline: StreamPipeline
    if univariate is not None:
        pipeline = UnivariatePipeline(
            sc.name, config.agent.device_id, spec,
            build_detector(spec, timed, univariate, fallback=fallback,
                           input_range=input_range),
            rule_params, univariate, config.store.aggregate_interval_s,
            r.top_channels, start_cal, channel_label=source_channels[0])
    else:
        pipeline = StreamPipeline(
            sc.name,
            config.agent.device_id,
            spec,
            FeatureDeviationDetector(spec, timed, fallback=fallback,
                                     input_range=input_range,
                                     adaptation=package.adaptation()),
            rule_params,
            aggregate_interval_s=config.store.aggregate_interval_s,
            top_channels=r.top_channels,
            calibration=start_cal,
        )
    if restored is not None:  # a model update calibrates its candidate on these readings
        pipeline.calibration_samples = restored.readings
    restore_baseline(store, pipeline, key)  # a univariate stream's adapted baseline
    guard.on_stride = lambda k: setattr(pipeline.windower, "hop", spec.hop * k)
    try:
        valid = ValidRange(source.channels,
                           {r.channel: (r.low, r.high) for r in sc.valid_range})
    except ValueError as exc:
        msg = f"streams.{sc.name}.valid_range: {exc}"
        raise ConfigError(msg, problems=[msg]) from None
    supervisor = SourceSupervisor(source, enqueue, metrics, stop_event,
                                  valid_range=valid, offer=offer)
    metrics.model_info.labels(stream=sc.name).info(
        {"name": package.manifest.name, "version": str(package.manifest.version),
         "backend": backend.name, "precision": backend.precision}
    )
    metrics.calibrating.labels(stream=sc.name).set(0 if start_cal else 1)
    if start_cal is not None:
        metrics.threshold.labels(stream=sc.name).set(start_cal.threshold)
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
    if updates is not None:
        slot = ModelSlot(sc.name, package, lambda p: on_model_changed(sc.name, p))
    return SensorStream(sc, package, pipeline, order, supervisor, backend, policy, slot=slot)


def _guard_backends(package: ModelPackage, selection: Selection, opener: Opener
                    ) -> tuple[list[Backend], Callable[[], Backend] | None]:
    """The latency guard's backends: ``[chosen]`` and an opener of the fallback (the next
    fastest passing candidate, opened and golden-checked when first needed), or
    ``[chosen, fallback]`` when the selection already loaded both (timed in this process).
    Every other loaded backend is closed (its memory, not its runtime's libraries)."""
    loaded = selection.backends
    passing = selection.passing
    spare = passing[1] if len(passing) > 1 else None
    if spare is not None and spare.backend is not None:
        keep = [loaded[0], spare.backend]
    else:
        keep = loaded[:1]
    for unused in loaded:
        if not any(unused is k for k in keep):
            unused.close()
    if spare is None or spare.backend is not None:
        return keep, None
    return keep, deferred_open(package, spare.candidate, opener)


def restore_calibration(
    store: Store, sc: StreamConfig, key: CalibrationKey, clock: Clock
) -> StoredCalibration | None:
    """The stream's stored calibration when it fits ``key`` (else one INFO line why)."""
    try:
        stored = store.calibration(sc.name)
    except StoreError as exc:
        log.warning("stream %s: stored calibration unreadable (%s); calibrating afresh",
                    sc.name, exc)
        return None
    if stored is None:
        return None
    why = ("streams.recalibrate_on_start is set" if sc.recalibrate_on_start
           else refusal(stored, key, clock(), sc.calibration_max_age_s))
    if why is not None:
        log.info("stream %s: stored calibration not restored (%s); calibrating afresh",
                 sc.name, why)
        return None
    log.info("stream %s: calibration restored (fitted %s, threshold %.3f)", sc.name,
             iso_utc(stored.fitted_at), stored.calibration.threshold)
    return stored


def save_calibration(store: Store, s: SensorStream, package: ModelPackage, clock: Clock
                     ) -> None:
    """Store the stream's calibration in force for the next start (pipeline thread)."""
    cal, det = s.pipeline.calibration, s.pipeline.detector
    if cal is None:
        return
    readings = s.pipeline.calibration_samples  # far-out readings left out: may be < N
    rec = StoredCalibration(
        s.config.name, calibration_key(package.manifest, det.spec, det.backend.precision),
        cal, clock(),
        det.spec.calibration_samples if readings is None else len(readings), readings,
    )
    try:
        store.save_calibration(rec)
    except StoreError as exc:
        log.error("stream %s: calibration not stored (the next start calibrates again): %s",
                  s.config.name, exc)


def preset_calibration(package: ModelPackage, device_id: str, stream: str) -> Calibration | None:
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
