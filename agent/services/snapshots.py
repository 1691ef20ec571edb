"""Camera alert snapshots (``[snapshots]``): the alerting frame as JPEG and its heatmap as PNG.

Flow: a camera stream's alert (:class:`agent.pipeline.stream.AlertEvent` with its ``frame``) is
stored as usual by the agent's main loop, its payload naming the snapshot
(:class:`agent.records.SnapshotRef`: the alert's id and the retained topics); then
:meth:`SnapshotWorker.submit` queues ``(alert, frame)`` for the worker thread
(``camera-snapshots``), which

1. normalises the frame's model image and runs the package's patch-map model
   (opened on the first alert of a package's streams, on the runtime the stream scores with
   where it can: :class:`agent.inference.patch_map_openvino.OpenVinoPatchMap` for OpenVINO,
   else :class:`agent.inference.patch_map.PatchMapModel` on ONNX Runtime)
   for the patch-score map: only for alerting frames, never on the frame → score path;
2. renders the JPEG of the captured frame (longer edge ``max_edge``, ``jpeg_quality``) and the
   heatmap overlay PNG (:mod:`agent.services.snapshot_render`);
3. stores both in the store (:meth:`agent.store.sqlite.Store.add_snapshot`, under its byte
   budget, evicted first), then calls the ``on_stored`` hooks (the MQTT snapshot publisher and
   the snapshot uploader wake up).

Nothing here can hold up an alert: the alert is stored and queued for MQTT before the snapshot
is even rendered. What does not become a snapshot is counted in
``edge_agent_dropped_total{kind="snapshot", reason}``: ``queue_full`` (more alerting frames than
the worker keeps up with: :data:`QUEUE_LIMIT` waiting; the snapshot is skipped, the alert kept:
a WARNING with the count on a live stream, one INFO line with the count at the end for a
recorded file or folder), ``render_error`` (the frame could not be
encoded), ``store_error`` (the store refused the write); and ``budget`` when the store evicts
one. A heatmap the model cannot give (no ONNX artefact, ``onnx`` not installed, a model whose
score is not a patch maximum) is logged once per stream: the snapshots of that stream are the
JPEG alone. Each problem is logged at most once a minute (:class:`agent.logs.RateLimiter`).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import Field

from agent.config.base import StrictModel
from agent.errors import AgentError, StoreError
from agent.logs import RateLimiter
from agent.pipeline.image import ImageSpec, normalise
from agent.records import Alert, Frame
from agent.services import snapshot_render as render

if TYPE_CHECKING:
    from agent.inference.image_package import ImagePackage
    from agent.inference.patch_map import PatchMap
    from agent.metrics import Metrics
    from agent.store.sqlite import Store

log = logging.getLogger("agent.snapshots")

#: Alerting frames waiting for the worker, at most (each holds its captured frame in memory:
#: 8 x 6 MB at 1920 x 1080 BGR).
QUEUE_LIMIT = 8


class SnapshotConfig(StrictModel):
    """Config of camera alert snapshots (``[snapshots]``)."""

    enabled: bool = Field(
        True, description="Store a snapshot (frame JPEG + heatmap PNG) of every camera alert, "
        "publish it on the retained <prefix>/<device>/<stream>/snapshot and .../heatmap topics "
        "and upload it to the fleet. Sensor streams are not affected.")
    max_edge: int = Field(
        640, ge=64, le=4096, description="Longer edge of the snapshot in pixels at most (the "
        "frame is scaled down, never up; aspect kept).")
    jpeg_quality: int = Field(80, ge=10, le=95, description="JPEG quality of the frame (1-95).")
    heatmap: bool = Field(
        True, description="Also render the anomaly heatmap overlay (PNG) from the model's "
        "patch-score map (ONNX Runtime, the model's ONNX artefact).")
    publish: bool = Field(
        True, description="Publish the latest snapshot of each camera on its retained topics "
        "(needs [mqtt] enabled).")
    upload: bool = Field(
        True, description="Upload snapshots to the fleet after their alert (needs [fleet] "
        "enabled; a fleet without the snapshot routes is detected and skipped).")


@dataclass(frozen=True, slots=True)
class SnapshotJob:
    """One alerting frame to snapshot: the stored ``alert``, its ``frame``, the stream's model
    ``package`` and input ``spec``."""

    alert: Alert
    frame: Frame
    package: ImagePackage
    spec: ImageSpec
    #: The stream reads a recorded file or folder that ends
    #: (:attr:`agent.sources.camera.CameraConfig.finite`): it is read as fast as it scores, so
    #: skipped snapshots are reported once when the worker stops, not as a warning.
    finite: bool = False
    #: The backend the stream scores with (``openvino``, ``onnxruntime``, ``litert``): the
    #: heatmap is read on the same runtime where it can.
    runtime: str = ""


MapOpener = Callable[["ImagePackage", str], "PatchMap"]


def _open_patch_map(package: ImagePackage, runtime: str) -> PatchMap:
    """The package's patch-map model, on ``runtime`` (the stream's scoring backend) when that
    is OpenVINO and the package has an IR, so no second runtime is loaded; else, or when the IR
    cannot give the map, on ONNX Runtime.

    Raises:
        agent.errors.AgentError: neither runtime can give the map.
    """
    if runtime == "openvino" and any(a.runtime == "openvino"
                                     for a in package.manifest.artefacts):
        from agent.inference.patch_map_openvino import (  # noqa: PLC0415 - only when used
            OpenVinoPatchMap,
        )

        try:
            return OpenVinoPatchMap(package)
        except AgentError as exc:
            log.info("model %s: heatmap from ONNX Runtime: %s", package.label, exc)
    from agent.inference.patch_map import PatchMapModel  # noqa: PLC0415 - onnx only when used

    return PatchMapModel(package)


def fitted_size(height: int, width: int, max_edge: int) -> tuple[int, int] | None:
    """``(height, width)`` with the longer edge at most ``max_edge`` (aspect kept); None when
    the image already fits.

    >>> fitted_size(1080, 1920, 640), fitted_size(100, 50, 640)
    ((360, 640), None)
    """
    if max(height, width) <= max_edge:
        return None
    scale = max_edge / max(height, width)
    return max(1, round(height * scale)), max(1, round(width * scale))


def _frame_pixels(frame: Frame, max_edge: int) -> np.ndarray[Any, Any]:
    """The captured frame as ``uint8`` gray or BGR, scaled down once to ``max_edge`` (OpenCV
    ``INTER_AREA``, as the model input; both images are rendered from it); the model image when
    the source kept no capture."""
    if frame.captured is None:
        return frame.image
    from agent.sources.camera import to_model_image  # noqa: PLC0415 - cv2 only with cameras

    shape = np.shape(frame.captured)
    try:
        size = fitted_size(int(shape[0]), int(shape[1]), max_edge)
        return to_model_image(frame.captured, size, grayscale=False)
    except (ValueError, IndexError):
        return frame.image


class SnapshotWorker:
    """Renders and stores snapshots in its own thread (see the module docstring).

    Args:
        config: The ``[snapshots]`` section.
        store: Where snapshots go.
        metrics: ``dropped_total{kind="snapshot"}`` and ``snapshots_total{stream}``.
        open_patch_map: Opens a package's patch-map model (tests pass a fake).
        monotonic: Monotonic clock (log rate limits).
    """

    def __init__(self, config: SnapshotConfig, store: Store, metrics: Metrics, *,
                 open_patch_map: MapOpener = _open_patch_map,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._store = store
        self._metrics = metrics
        self._open_map = open_patch_map
        self._maps: dict[tuple[str, str], PatchMap | None] = {}
        self._queue: queue.Queue[SnapshotJob | None] = queue.Queue(maxsize=QUEUE_LIMIT)
        self._limiter = RateLimiter(60.0, monotonic)
        self._hooks: list[Callable[[], None]] = []
        self._thread = threading.Thread(target=self._run, name="camera-snapshots", daemon=True)
        #: Snapshots stored by this worker.
        self.stored = 0
        #: Alert snapshots skipped because the queue was full, per stream (since the last
        #: :meth:`stop`; the alerts themselves are stored).
        self.skipped: dict[str, int] = {}
        self._finite: set[str] = set()

    def on_stored(self, hook: Callable[[], None]) -> None:
        """Call ``hook()`` (the worker's thread; must not block) after each stored snapshot."""
        self._hooks.append(hook)

    def start(self) -> None:
        """Start the worker thread."""
        self._thread.start()

    def submit(self, job: SnapshotJob) -> bool:
        """Queue one alerting frame (the main loop's thread, never blocks); False when the queue
        is full: the snapshot is skipped (the alert is stored), counted in
        ``dropped_total{kind="snapshot", reason="queue_full"}`` and :attr:`skipped`. A live
        stream logs a WARNING with the count (once a minute); a finite one (``job.finite``) one
        INFO line with its count when the worker stops."""
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            stream = job.alert.stream
            skipped = self.skipped[stream] = self.skipped.get(stream, 0) + 1
            if job.finite:
                self._finite.add(stream)
                self._metrics.dropped_total.labels(kind="snapshot", reason="queue_full").inc()
            else:
                self._drop(stream, "queue_full",
                           f"{skipped} alert snapshot(s) skipped so far: alerts come faster than "
                           f"snapshots render ({QUEUE_LIMIT} wait); the alerts are kept. To "
                           "keep up: [snapshots] heatmap = false or a smaller max_edge")
            return False
        return True

    def stop(self, timeout_s: float = 5.0) -> None:
        """Finish the queued snapshots (within ``timeout_s``), end the thread, and log one INFO
        line per stream whose snapshots were skipped (:attr:`skipped`, then reset)."""
        if self._thread.is_alive():
            with contextlib.suppress(queue.Full):
                self._queue.put(None, timeout=timeout_s)
            self._thread.join(timeout_s)
        for stream, count in sorted(self.skipped.items()):
            why = ("the recorded input was read faster than snapshots render"
                   if stream in self._finite else "alerts came faster than snapshots render")
            log.info("stream %s: %d alert snapshot(s) skipped (%s; at most %d wait); every "
                     "alert is stored. Counted in edge_agent_dropped_total{kind=\"snapshot\","
                     "reason=\"queue_full\"}", stream, count, why, QUEUE_LIMIT)
        self.skipped.clear()
        self._finite.clear()

    def process(self, job: SnapshotJob) -> bool:
        """Render and store one snapshot (the worker's thread; tests call it directly).

        Returns:
            True when stored.
        """
        stream = job.alert.stream
        cfg = self.config
        pixels = _frame_pixels(job.frame, cfg.max_edge)
        try:
            jpeg = render.frame_jpeg(pixels, cfg.max_edge, cfg.jpeg_quality)
        except (ValueError, OSError) as exc:
            self._drop(stream, "render_error", f"frame not encoded: {exc}")
            return False
        meta: dict[str, Any] = {"score": round(float(job.alert.score), 6),
                                "threshold": round(float(job.alert.threshold), 6),
                                "model": {"name": job.package.manifest.name,
                                          "version": job.package.manifest.version}}
        meta.update(_jpeg_size(jpeg))
        heatmap = self._heatmap(job, pixels, meta) if cfg.heatmap else None
        try:
            added = self._store.add_snapshot(job.alert.alert_id, stream, meta, jpeg, heatmap)
        except StoreError as exc:
            self._drop(stream, "store_error", f"snapshot not stored: {exc}")
            return False
        if added:
            self.stored += 1
            self._metrics.snapshots_total.labels(stream=stream).inc()
            for hook in self._hooks:
                hook()
        return added

    def _heatmap(self, job: SnapshotJob, pixels: np.ndarray[Any, Any],
                 meta: dict[str, Any]) -> bytes | None:
        model = self._patch_map(job)
        if model is None:
            return None
        try:
            score, patch_map = model.run(normalise(job.frame.image, job.spec))
            png = render.heatmap_png(
                pixels, patch_map, job.alert.threshold, self.config.max_edge,
                {"alert_id": job.alert.alert_id, "model": job.package.label,
                 "score": f"{job.alert.score:.6g}"})
        except (AgentError, ValueError, OSError) as exc:
            self._drop(job.alert.stream, "heatmap_error", f"heatmap not rendered: {exc}",
                       count=False)
            return None
        scale = render.Scale.of(job.alert.threshold)
        meta["heatmap"] = {"scale_min": round(scale.lo, 6), "scale_max": round(scale.hi, 6),
                           "patch_max": round(float(np.max(patch_map)), 6),
                           "map_score": round(score, 6), "grid": list(patch_map.shape)}
        return png

    def _patch_map(self, job: SnapshotJob) -> PatchMap | None:
        key = (job.package.label, job.runtime)
        if key not in self._maps:
            try:
                self._maps[key] = self._open_map(job.package, job.runtime)
            except AgentError as exc:
                self._maps[key] = None
                log.warning("stream %s: snapshots without heatmap: %s", job.alert.stream, exc)
        return self._maps[key]

    def _drop(self, stream: str, reason: str, message: str, *, count: bool = True) -> None:
        if count:
            self._metrics.dropped_total.labels(kind="snapshot", reason=reason).inc()
        suppressed = self._limiter.hit(reason)
        if suppressed is not None:
            more = f" [{suppressed} more suppressed]" if suppressed else ""
            log.warning("stream %s: %s%s", stream, message, more)

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            try:
                self.process(job)
            except Exception:  # a bug must not end the thread: logged, the next one goes on
                log.exception("stream %s: snapshot failed", job.alert.stream)


def _jpeg_size(jpeg: bytes) -> dict[str, int]:
    """``{"width", "height"}`` of JPEG bytes (Pillow reads the header only)."""
    import io  # noqa: PLC0415

    from PIL import Image  # noqa: PLC0415

    with Image.open(io.BytesIO(jpeg)) as img:
        return {"width": int(img.width), "height": int(img.height)}
