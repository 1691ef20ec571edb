"""Camera streams: a camera source and its image pipeline in one thread per stream.

A camera stream does not go through the sensor queue: the source's consumer loop (its
:meth:`agent.sources.camera.CameraSource.run`) calls :meth:`CameraStream.on_frame`, which scores
the frame at once, so frame → score latency is one inference and never waits behind sensor
batches. Alerts, closed aggregates and a watched folder's file marks
(:class:`agent.sources.camera_watch.ScoredFile`, behind the alerts of their frame) are handed
to ``deliver`` (the agent puts them on a queue its main loop drains into the store and the
MQTT outbox, as for sensor streams).

The runner restarts the source after a retryable :class:`agent.errors.SourceError` with backoff
(the source itself already reconnects stalled or failed captures); a file or folder that ends
(:class:`agent.errors.SourceExhausted`) ends the stream (:attr:`CameraStream.done` and
:attr:`CameraStream.exhausted`). A non-retryable error (:class:`agent.errors.SourceFailed`: a
file that does not open or holds no readable frame; any other fatal
:class:`agent.errors.AgentError`; an unexpected exception, logged with its traceback) ends it as
failed (:attr:`CameraStream.failed`, :attr:`CameraStream.error`): the agent exits nonzero when
its sources have all ended and one of them failed (:mod:`agent.exitcodes`).

What goes wrong is said once: a camera that does not open, stalls or fails a read is one
WARNING when the outage starts (the source keeps reconnecting with backoff) and one INFO line
when frames come again; rejected inputs (unreadable images, frames that cannot be converted)
count in ``edge_agent_records_rejected_total{stream,reason}`` and are logged at most once per
reason per minute, with the number suppressed.

Shutdown: after :meth:`CameraStream.join`, :meth:`CameraStream.close` joins the grabbers (they
release their captures) and closes the backend; threads tracked by :mod:`agent.native_threads`.

Operations: :meth:`CameraStream.health_view` is what the monitor turns into the stream's
``source:<stream>`` component of ``/healthz`` and its watchdog decision (as for a sensor
source's supervisor; policy: :func:`agent.health.camera_stall_policy`), with the camera's
figures (:meth:`CameraStream.health_details`). :meth:`CameraStream.sync_metrics` (each
heartbeat, and when the thread ends) exports the source's counters as
``edge_agent_camera_frames_dropped_total{reason="newer_frame"|"stopped"}``, ``_reconnects_total``,
``_stalls_total`` and ``edge_agent_camera_frame_age_seconds``; scored frames count in
``edge_agent_camera_frames_scored_total``, frames the model failed on in
``edge_agent_camera_frames_dropped_total{reason="score_error"}``, and ``edge_agent_source_up``
is 0 during an outage. So every frame read is scored, rejected or dropped with a reason.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from agent import native_threads
from agent.errors import (
    AgentError,
    ConfigError,
    ModelError,
    RecordError,
    SourceError,
    SourceExhausted,
)
from agent.health import SourceView
from agent.inference.choice_memory import ChoiceMemory
from agent.inference.image_package import ImagePackage, load_image_package
from agent.inference.image_select import ImageChoices, open_image_backend
from agent.logs import ALWAYS, RateLimiter, with_fields
from agent.pipeline.image import ImagePipeline, ImageSpec
from agent.pipeline.stream import AlertEvent
from agent.records import Aggregate, Frame
from agent.services.camera_rules import camera_rule_params
from agent.sources.backoff import Backoff
from agent.sources.camera import GRABBER_JOIN_S, CameraConfig, CameraSource
from agent.sources.camera_watch import FolderCheckpoint, ScoredFile

if TYPE_CHECKING:
    from agent.config.schema import StreamConfig
    from agent.metrics import Metrics
    from agent.sources.camera_watch import CheckpointStore

log = logging.getLogger("agent.camera")

Deliver = Callable[[AlertEvent | Aggregate | ScoredFile], None]
ScoreHook = Callable[[Frame, float, float], None]


class CameraStream:
    """One camera stream: source, pipeline and the thread running them.

    Args:
        source: The camera source (built for the package's input size).
        pipeline: The image pipeline.
        package: The verified image package (name and version for alerts).
        deliver: Receives alerts and closed aggregates (any thread; must not block long).
        stop: Set to stop.
        on_score: Optional ``(frame, score, latency_s)`` hook per scored frame (metrics,
            benchmarks); latency = monotonic now − frame capture time.
        observe_inference: Optional histogram ``observe`` for the inference time in seconds.
        monotonic: Monotonic clock.
        metrics: Counts rejected inputs and source failures (optional).
        reject_log_interval_s: Seconds between two log lines of the same rejection reason.

    Attributes:
        scored: Frames scored. errors: Frames that failed to score (wrong shape, model error).
        rejected: Inputs the source rejected. in_outage: The camera is failing (logged once).
        done: The stream's thread has ended (stopped, exhausted or failed).
        exhausted: The file or folder ended. failed: The stream failed for good.
        error: Why the stream failed for good (None unless it did).
        started_mono: ``monotonic()`` of :meth:`start`, None before.
        last_progress_mono: ``monotonic()`` of the last frame handed to the model, None before.
    """

    def __init__(self, source: CameraSource, pipeline: ImagePipeline, package: ImagePackage,
                 deliver: Deliver, stop: threading.Event, *, on_score: ScoreHook | None = None,
                 observe_inference: Callable[[float], None] | None = None,
                 monotonic: Callable[[], float] = time.monotonic,
                 metrics: Metrics | None = None, reject_log_interval_s: float = 60.0) -> None:
        self.name = source.stream
        self._log = with_fields(log, stream=self.name)  # a structured field (agent.logs)
        self.source = source
        self.pipeline = pipeline
        self.package = package
        self._deliver = deliver
        self._stop = stop
        self._on_score = on_score
        self._observe = observe_inference
        self._monotonic = monotonic
        self._metrics = metrics
        self._limiter = RateLimiter(reject_log_interval_s, monotonic)
        self._lock = threading.Lock()  # _reject runs in the grabber's and this stream's thread
        self.scored = self.errors = self.rejected = 0
        self.in_outage = False
        source.set_status_listener(self._on_status)
        self.last_score: float | None = None
        self.done = self.exhausted = False
        self.error: str | None = None
        self.started_mono: float | None = None
        self.last_progress_mono: float | None = None
        self._outage_since = 0.0
        self._outage_error = ""
        self._synced = {"dropped": 0, "abandoned": 0, "reconnects": 0, "stalls": 0}
        self._sync_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"camera-{self.name}", daemon=True)

    def start(self) -> None:
        """Start the stream's thread."""
        self.started_mono = self._monotonic()
        if self._metrics is not None:
            self._metrics.source_up.labels(stream=self.name).set(1)
            self._metrics.camera_frames_scored_total.labels(stream=self.name)  # 0 until a frame
            self._metrics.camera_frames_dropped_total.labels(stream=self.name,
                                                             reason="score_error")
        native_threads.track(self._thread, f"camera {self.name} stream (inference)")
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread to end (after ``stop`` is set)."""
        if self._thread.is_alive():
            self._thread.join(timeout)

    def is_alive(self) -> bool:
        """True while the stream's thread runs."""
        return self._thread.is_alive()

    @property
    def failed(self) -> bool:
        """True once the stream has failed for good (:attr:`error` says why)."""
        return self.error is not None

    @property
    def outage(self) -> tuple[str, float] | None:
        """``(error text, monotonic start)`` of the outage in progress; None when capturing."""
        return (self._outage_error, self._outage_since) if self.in_outage else None

    def health_view(self, now: float) -> SourceView:
        """What the monitor needs for the stream's health (``now``: monotonic seconds)."""
        progress = self.last_progress_mono
        idle = self.source.idle_mono  # a watched folder with nothing new is not stuck
        if idle is not None and (progress is None or idle > progress):
            progress = idle
        return SourceView.observe(
            now, started_mono=self.started_mono, last_progress_mono=progress,
            alive=self.is_alive(), done=self.exhausted, error=self.error, outage=self.outage)

    def health_details(self) -> dict[str, object]:
        """The camera's figures for ``/healthz`` (frame age in seconds, None before a frame)."""
        src = self.source
        age = src.frame_age_s
        return {"frame_age_s": None if age is None else round(age, 2),
                "frames_scored": self.scored, "frames_dropped": src.dropped,
                "frames_failed": self.errors, "inputs_rejected": self.rejected,
                "reconnects": src.reconnects, "stalls": src.stalls}

    def sync_metrics(self) -> None:
        """Add the source's counts since the last call to the camera metrics (any thread)."""
        m = self._metrics
        if m is None:
            return
        src = self.source
        dropped = m.camera_frames_dropped_total
        with self._sync_lock:
            for key, child in (
                ("dropped", dropped.labels(stream=self.name, reason="newer_frame")),
                ("abandoned", dropped.labels(stream=self.name, reason="stopped")),
                ("reconnects", m.camera_reconnects_total.labels(stream=self.name)),
                ("stalls", m.camera_stalls_total.labels(stream=self.name)),
            ):  # each exported from 0 on
                value = int(getattr(src, key))
                if value > self._synced[key]:
                    child.inc(value - self._synced[key])
                    self._synced[key] = value
            age = src.frame_age_s
            if age is not None and self._thread.is_alive():  # frozen once the stream ended
                m.camera_frame_age_seconds.labels(stream=self.name).set(age)

    def on_frame(self, frame: Frame) -> None:
        """Score one frame and deliver what it produced (the source's thread)."""
        t0 = self._monotonic()
        self.last_progress_mono = t0
        try:
            out = self.pipeline.process(frame)
        except (ValueError, ModelError) as exc:
            self.errors += 1
            if self._metrics is not None:
                self._metrics.camera_frames_dropped_total.labels(
                    stream=self.name, reason="score_error").inc()
            if self.errors in (1, 10, 100, 1000):
                self._log.warning("camera %s: frame not scored (%d so far): %s", self.name,
                                  self.errors, exc)
            return
        now = self._monotonic()
        if self._observe is not None:
            self._observe(now - t0)
        self.scored += 1
        self.last_score = out.score
        if self._metrics is not None:
            self._metrics.camera_frames_scored_total.labels(stream=self.name).inc()
        if self._on_score is not None:
            self._on_score(frame, out.score, now - frame.received_mono)
        step = out.clock_step
        if step is not None:
            self._log.warning(
                "camera %s: timestamps stepped %s by %.1f s (wall clock set by NTP or a "
                "missing RTC); the open aggregate interval was closed and alert cooldowns "
                "count monotonic time across the step", self.name, step.direction,
                abs(step.size_s), extra=ALWAYS)
            if self._metrics is not None:
                self._metrics.clock_steps_total.labels(stream=self.name,
                                                       direction=step.direction).inc()
        for event in out.events:  # raised, updated, cleared
            self._deliver(event)
        for agg in out.aggregates:
            self._deliver(agg)
        mark = self.source.scored_file(frame)
        if mark is not None:  # a watched folder's file: done once its alerts are stored
            if out.events:
                self._deliver(mark)  # behind the alerts, on the same queue
            else:
                mark.commit()

    def _reject(self, error: RecordError) -> None:
        with self._lock:
            self.rejected += 1
            suppressed = self._limiter.hit(error.reason)
        if self._metrics is not None:
            self._metrics.records_rejected_total.labels(stream=self.name,
                                                        reason=error.reason).inc()
        if suppressed is None:
            return
        more = (f" [{suppressed} more like it suppressed in the last "
                f"{self._limiter.interval_s:.0f} s]" if suppressed else "")
        self._log.warning("camera %s: input rejected (%s): %s%s", self.name, error.reason, error,
                          more)

    def _on_status(self, error: SourceError | None) -> None:
        """The source's status listener: one line per outage and one per recovery."""
        if error is None:
            if self.in_outage:
                self.in_outage = False
                if self._metrics is not None:
                    self._metrics.source_up.labels(stream=self.name).set(1)
                self._log.info("camera %s: frames again", self.name)
            return
        self._outage_error = str(error) or type(error).__name__
        if self._metrics is not None:
            self._metrics.source_errors_total.labels(stream=self.name).inc()
            self._metrics.source_up.labels(stream=self.name).set(0)
        if not self.in_outage:
            self._outage_since = self._monotonic()
            self.in_outage = True
            self._log.warning("camera %s: %s; retrying in the background", self.name, error)

    def _run(self) -> None:
        backoff = Backoff(1.0, 60.0)
        try:
            while not self._stop.is_set():
                try:
                    self.source.run(self.on_frame, self._reject, self._stop)
                    return
                except SourceExhausted:
                    self.exhausted = True
                    src = self.source
                    self._log.info(
                        "camera %s: input ended after %d frames (%d scored, %d not scored, "
                        "%d dropped for a newer one, %d inputs rejected)", self.name,
                        src.frames, self.scored, self.errors, src.dropped, self.rejected)
                    return
                except AgentError as exc:
                    if not exc.retryable:
                        self._fail(exc)
                        return
                    if not self.in_outage:  # the source may have reported it already
                        self._on_status(exc if isinstance(exc, SourceError)
                                        else SourceError(str(exc), stream=self.name))
                    self._stop.wait(backoff.next_delay())
                except Exception as exc:  # a bug or an unexpected library error
                    self._fail(exc)
                    return
        finally:
            self.done = True
            self.sync_metrics()
            if self._metrics is not None:
                self._metrics.source_up.labels(stream=self.name).set(0)
            if self.source.abandoned:
                self._log.info("camera %s: %d frame(s) read but not scored (queued at the stop, "
                               "or read by a capture being replaced)", self.name,
                               self.source.abandoned)

    def _fail(self, exc: Exception) -> None:
        """The stream failed for good: one ERROR line (a traceback for a non-agent error)."""
        self.error = str(exc) or type(exc).__name__
        self._log.error("camera %s: failed for good: %s", self.name, self.error,
                        exc_info=None if isinstance(exc, AgentError) else exc)

    def flush(self) -> list[Aggregate]:
        """Close the open aggregate interval (shutdown, after :meth:`join`)."""
        return self.pipeline.flush()

    def close(self, timeout_s: float = GRABBER_JOIN_S) -> bool:
        """Join the source's grabbers (at most ``timeout_s``; they release their captures)
        and close the model backend (shutdown, after :meth:`join` and :meth:`flush`).

        Returns:
            True when the stream's thread and every grabber ended (:mod:`agent.native_threads`).
        """
        joined = self.source.close(timeout_s)
        self.pipeline.close()
        return joined and not self._thread.is_alive()


def build_camera_stream(config: StreamConfig, device_id: str, aggregate_interval_s: float,
                        deliver: Deliver, stop: threading.Event, metrics: Metrics | None = None,
                        on_score: ScoreHook | None = None, cache_dir: Path | None = None,
                        store: CheckpointStore | None = None, choices: ImageChoices | None = None,
                        memory: ChoiceMemory | None = None,
                        progress: Callable[[], None] | None = None,
                        peers: int = 1) -> CameraStream:
    """Load the stream's image package (verified, golden images), build source and pipeline.

    The backend is chosen as the stream's ``backend`` and ``precision`` say (``auto``: the
    fastest runtime passing the golden images); ``cache_dir`` is OpenVINO's compiled-model
    cache (the agent passes ``<state_dir>/openvino-cache``). ``store`` keeps a watched
    folder's checkpoint (:mod:`agent.sources.camera_watch`; None: in memory only).
    ``choices``: the backends chosen for the agent's other camera streams
    (:func:`agent.inference.image_select.open_image_backend`: one selection per model); ``memory``:
    rankings kept across restarts; ``progress``: called while a child process ranks runtimes;
    ``peers``: the agent's camera streams on this model, precision and backend setting, this one
    included (OpenVINO compiles the model once with an inference stream for each).

    Raises:
        ModelError: the package is missing, not an image package, or fails its checks.
        ConfigError: the stream's source is not a camera.
    """
    from agent.config.schema import resolve_model_path  # noqa: PLC0415 - avoids an import cycle
    from agent.sources.registry import build_source  # noqa: PLC0415

    if not isinstance(config.source, CameraConfig):
        msg = f"streams.{config.name}: not a camera source"
        raise ConfigError(msg, problems=[msg])
    package = load_image_package(resolve_model_path(config.model, Path.cwd()))
    backend = open_image_backend(package, config.precision, backend=config.backend,
                                 cache_dir=cache_dir, choices=choices, memory=memory,
                                 progress=progress, streams=peers)
    inp = package.manifest.input
    checkpoint = (FolderCheckpoint(config.name, store) if config.source.watch else None)
    source = build_source(config.source, config.name, image_size=(inp.height, inp.width),
                          grayscale=inp.grayscale, checkpoint=checkpoint)
    assert isinstance(source, CameraSource)
    pipeline = ImagePipeline(
        config.name, device_id,
        ImageSpec(inp.height, inp.width, inp.channels, tuple(inp.mean), tuple(inp.std)),
        backend, package.threshold, camera_rule_params(config.rules, config.source),
        aggregate_interval_s,
    )
    observe = None
    if metrics is not None:
        observe = metrics.inference_seconds.labels(stream=config.name, backend=backend.name).observe
        metrics.model_info.labels(stream=config.name).info(
            {"name": package.manifest.name, "version": str(package.manifest.version),
             "backend": backend.name, "precision": backend.precision})
        metrics.threshold.labels(stream=config.name).set(package.threshold)
    log.info("stream %s: camera source, model %s (%s/%s, %dx%d), threshold %.3f", config.name,
             package.label, backend.name, backend.precision, inp.height, inp.width,
             package.threshold,
             extra={"stream": config.name, "model_version": package.manifest.version})
    return CameraStream(source, pipeline, package, deliver, stop, on_score=on_score,
                        observe_inference=observe, metrics=metrics)
