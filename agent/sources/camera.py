"""Camera source: a USB device, an RTSP/HTTP URL, a video file or a folder of images (OpenCV).

Threads and frames: a **grabber** thread reads the capture and hands frames to
:meth:`CameraSource.run` (the consumer, in the caller's thread), which converts each to 8 bits
by dtype (16-bit / 257, float in [0, 1] x 255: :func:`to_model_image`), to grayscale and to the
model's input size (``cv2.INTER_AREA``) when the source was given one, and emits a
:class:`agent.records.Frame`. How frames are handed over depends on the input
(:attr:`CameraConfig.realtime`):

* **real time** (a device or URL, or a file or folder with ``fps`` > 0, which then plays like a
  camera at that rate): the grabber reads as fast as the capture delivers and keeps only the
  newest frame in a one-frame slot; a frame replaced before the consumer took it is counted in
  :attr:`CameraSource.dropped` (the model always scores the freshest image instead of falling
  behind a 30 fps stream; old frames of a live camera are worthless);
* **recorded** (a file or folder with ``fps`` = 0, the default): every frame, in order. The
  grabber waits while ``RECORDED_QUEUE_FRAMES`` frames wait for the consumer (back-pressure), so
  the file is read as fast as the model scores it and no frame is dropped.

Where a frame came from (:class:`agent.records.FrameOrigin`, ``Frame.origin``, named by the
alerts it raises): an image folder's file, relative to the folder (``os.fsdecode``: any bytes);
a video file's name and the frame's 0-based index in the file (counted per frame read; a looped
file counts from 0 again). A live camera's frames have none (a frame counter since the camera
opened names nothing an operator can find again). A capture names its last frame's origin in an
``origin`` attribute; one without it (a live ``cv2.VideoCapture``, a test fake) gives None.

Every frame read is accounted for: emitted, dropped for a newer one (real time), rejected
(below) or :attr:`CameraSource.abandoned` (read but not handed on because the run stopped or
the capture was replaced).

Watchdog and reconnect (real time only): frame age = now − capture time of the newest frame
(monotonic). When no new frame arrived for ``stall_s`` seconds since the last frame or
(re)open, or a live capture fails to read or open, the grabber is replaced by a new one with a
fresh capture after a backoff delay (:class:`agent.sources.backoff.Backoff`, exponential with
jitter); a grabber stuck inside a blocking ``read()`` (an RTSP camera that went silent) is
abandoned (daemon thread; it exits when its read returns). Reconnects are counted in
:attr:`CameraSource.reconnects` and reported to a status listener
(:class:`agent.sources.base.ReportsStatus`). A recorded input is never reopened: that would
read it again from its first frame. Its reader waiting for a slow model is back-pressure, not a
stall; a read that hangs shows as no frame reaching the model, which the agent's monitor
reports as a stuck stream (:func:`agent.health.camera_stall_policy`).

A watched folder (``watch = true``: :mod:`agent.sources.camera_watch`) is polled every
``poll_s`` for new images, each scored once across restarts, and never ends.

Files and folders end (:class:`agent.errors.SourceExhausted`) unless ``loop``, after every
frame read was taken. One that cannot be read at all fails for good
(:class:`agent.errors.SourceFailed`): it does not open at start, or it ends (a looped one: one
whole pass) without a single readable frame.

Bad input is rejected, counted in :attr:`CameraSource.rejected` and handed to the ``reject``
callback of :meth:`CameraSource.run` (an :class:`agent.errors.RecordError` with a ``reason``),
and the source reads on: an image in a folder that cannot be read or decoded whole (gone, no
permission, zero bytes, truncated, corrupt, not an image: ``unreadable_image``; see
:mod:`agent.sources.image_file`), one smaller than
:data:`agent.sources.image_file.MIN_IMAGE_SIDE` px on a side, and a frame that cannot be
converted to the model's input (a channel count other than 1, 3 or 4) (``bad_image``). OpenCV's
own log lines are silenced (:func:`quiet_opencv`): the agent reports each rejection itself.

Stopping: when :meth:`CameraSource.run` returns (stopped, ended or failed) it stops its grabbers
and joins them (:meth:`CameraSource.close`, at most ``GRABBER_JOIN_S`` seconds); each releases its
capture as it ends. A grabber never outlives the agent inside OpenCV unnoticed: see
:mod:`agent.native_threads`.

OpenCV (and Pillow, for folders) is imported only when a camera stream is built
(the ``camera`` extra: :func:`agent.extras.install_hint`).

Modules: config :mod:`~agent.sources.camera_config`, captures and frame conversion
:mod:`~agent.sources.camera_capture`, the grabber thread :mod:`~agent.sources.camera_grabber`,
recorded inputs :mod:`~agent.sources.camera_files`, watched folders
:mod:`~agent.sources.camera_watch`.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import deque
from collections.abc import Callable

from agent.errors import RecordError, SourceError, SourceExhausted, SourceFailed
from agent.records import Frame, FrameOrigin
from agent.sources.backoff import Backoff
from agent.sources.base import SourcePlugin, StatusListener
from agent.sources.camera_capture import (
    Capture,
    CaptureFactory,
    Image,
    capture_origin,
    open_capture,
    quiet_opencv,
    to_model_image,
)
from agent.sources.camera_config import CameraConfig
from agent.sources.camera_grabber import Grabber
from agent.sources.camera_watch import FolderCheckpoint, ScoredFile

__all__ = ["KIND", "PLUGIN", "RECORDED_QUEUE_FRAMES", "CameraConfig", "CameraSource", "Capture",
           "CaptureFactory", "capture_origin", "open_capture", "quiet_opencv", "to_model_image"]

KIND = "camera"

FrameEmit = Callable[[Frame], None]
FrameReject = Callable[[RecordError], None]
#: Frames a recorded input (file or folder at ``fps`` = 0) reads ahead of the model.
RECORDED_QUEUE_FRAMES = 2
#: Longest wait, in seconds, for the grabbers when the source stops (all of them together).
GRABBER_JOIN_S = 2.0
#: A frame waiting for the consumer: image, wall time, monotonic time, seq, origin.
_Queued = tuple[Image, float, float, int, FrameOrigin | None]

#: The ``camera`` kind, as the ``edge_agent.sources`` entry point names it.
PLUGIN = SourcePlugin(
    KIND, CameraConfig, "agent.sources.camera:CameraSource", path_fields=("path", "folder")
)


class CameraSource:
    """Frames from a camera, a video file or an image folder; see the module docstring.

    Args:
        config: The ``camera`` config.
        stream: Stream name stamped on every frame.
        image_size: ``(height, width)`` frames are resized to (the model's input); None = keep.
        grayscale: Convert frames to grayscale (the model's input spec).
        capture_factory: Opens a capture for the config (tests inject fakes); default
            :func:`open_capture` (with ``checkpoint``).
        checkpoint: A watched folder's files done (``watch``; the agent passes one backed by
            its store); None = a new one in memory.
        clock: Wall clock, epoch seconds (``Frame.ts``).
        monotonic: Monotonic clock in seconds (frame age, watchdog, pacing).

    Attributes:
        stream: The stream name.
        channels: Empty: a camera has no sensor channels.
        live: A device or URL. realtime: Newest-frame semantics (:attr:`CameraConfig.realtime`).
        frames: Frames read (decoded) from the capture.
        emitted: Frames handed to ``emit``.
        dropped: Frames replaced by a newer one before they were taken (real time only).
        abandoned: Frames read but not handed on: still queued when the run stopped, or read
            by a grabber that was being replaced or stopped.
        reconnects: Captures reopened after a stall, a failed read or a failed open.
        stalls: Watchdog firings (real time: no new frame for ``stall_s``).
        rejected: Inputs rejected (unreadable images, frames that cannot be converted).
    """

    def __init__(
        self,
        config: CameraConfig,
        stream: str,
        *,
        image_size: tuple[int, int] | None = None,
        grayscale: bool = True,
        capture_factory: CaptureFactory | None = None,
        checkpoint: FolderCheckpoint | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.stream = stream
        self.channels: tuple[str, ...] = ()
        self.image_size = image_size
        self.grayscale = grayscale
        self.live = config.live
        self.realtime = config.realtime
        self._capacity = 1 if self.realtime else RECORDED_QUEUE_FRAMES
        self.checkpoint = checkpoint
        if config.watch and checkpoint is None:
            self.checkpoint = FolderCheckpoint(stream)
        self._factory = capture_factory or functools.partial(open_capture,
                                                             checkpoint=self.checkpoint)
        #: ``monotonic()`` of the last poll of a watched folder that found nothing new.
        self.idle_mono: float | None = None
        self._clock = clock
        self.monotonic = monotonic
        self.stopping = threading.Event()
        self.generation = 0
        self._cond = threading.Condition()
        self._queue: deque[_Queued] = deque()
        self.status_listener: StatusListener | None = None
        self._grabbers: list[Grabber] = []  # started and not yet seen ended
        self._last_frame_mono: float | None = None
        self._progress_mono: float | None = None  # the watchdog's: last frame or (re)open
        self._reject: FrameReject | None = None
        self.frames = self.emitted = self.dropped = self.reconnects = self.stalls = 0
        self.rejected = self.abandoned = 0

    def scored_file(self, frame: Frame) -> ScoredFile | None:
        """The mark of a watched folder's file whose ``frame`` was scored (None otherwise):
        commit it once the frame's alerts are stored (:mod:`agent.sources.camera_watch`)."""
        if self.checkpoint is None or frame.origin is None:
            return None
        return ScoredFile(self.stream, frame.origin.file, self.checkpoint)

    def set_status_listener(self, listener: StatusListener | None) -> None:
        """Report failed (re)connects and recoveries (:class:`agent.sources.base.ReportsStatus`)."""
        self.status_listener = listener

    # -- grabber side ---------------------------------------------------------------------------

    def offer(self, image: Image, generation: int, origin: FrameOrigin | None = None) -> None:
        """Hand a captured frame (read from ``origin``) to the consumer (grabber thread of
        ``generation``).

        Real time: the frame replaces one not yet taken (counted in :attr:`dropped`).
        Recorded: waits while the queue is full (back-pressure), until there is room or the
        grabber is abandoned (the frame then counts in :attr:`abandoned`).
        """
        with self._cond:
            while (not self.realtime and len(self._queue) >= self._capacity
                   and generation == self.generation):
                self._cond.wait(0.1)
            now = self.monotonic()
            self.frames += 1
            if generation != self.generation:
                self.abandoned += 1
                return
            if self.realtime and self._queue:
                self._queue.clear()
                self.dropped += 1
            self._queue.append((image, self._clock(), now, self.frames, origin))
            self._last_frame_mono = self._progress_mono = now
            self._cond.notify_all()

    def bad_input(self, error: RecordError) -> None:
        """Count and report one rejected input (grabber or consumer thread)."""
        with self._cond:
            self.rejected += 1
            reject = self._reject
        if reject is not None:
            reject(error)

    def wake(self) -> None:
        """Wake the consumer (a grabber ended or failed)."""
        with self._cond:
            self._cond.notify_all()

    @property
    def frame_age_s(self) -> float | None:
        """Seconds since the newest frame was captured (None before the first)."""
        last = self._last_frame_mono
        return None if last is None else self.monotonic() - last

    # -- consumer side --------------------------------------------------------------------------

    def _open(self, backoff: Backoff, stop: threading.Event) -> Grabber | None:
        """Open a capture and start its grabber, retrying with backoff; None when stopped.

        Raises:
            SourceFailed: A file or folder does not open at start.
        """
        while not stop.is_set():
            try:
                cap = self._factory(self.config)
            except SourceError as exc:
                if not self.live and self.reconnects == 0:
                    raise SourceFailed(f"{exc}; the recorded input cannot be read",
                                       stream=self.stream) from exc
                if self.status_listener is not None:
                    self.status_listener(exc)
                self.reconnects += 1
                stop.wait(backoff.next_delay())
                continue
            with self._cond:
                self.generation += 1
                self._progress_mono = self.monotonic()  # the watchdog restarts its count
                grabber = Grabber(cap, self, self.generation)
                self._grabbers = [g for g in self._grabbers if g.thread.is_alive()]
                self._grabbers.append(grabber)
            grabber.start()
            return grabber
        return None

    def _take(self, grabber: Grabber) -> tuple[_Queued | None, bool]:
        """The next frame (None when none came within a short wait) and whether the grabber
        had ended or failed before it was taken (then an empty queue means: nothing more)."""
        with self._cond:
            over = grabber.ended or grabber.failed
            if not self._queue and not over:
                self._cond.wait(timeout=min(0.1, self.config.stall_s / 4))
                over = grabber.ended or grabber.failed
            if not self._queue:
                return None, over
            item = self._queue.popleft()
            self._cond.notify_all()  # a recorded input's reader has room again
            return item, over

    def run(self, emit: FrameEmit, reject: FrameReject, stop: threading.Event) -> None:
        """Capture until ``stop`` is set; see the module docstring.

        Args:
            emit: Called with every frame taken (in this thread).
            reject: Called with every rejected input (an unreadable image, a frame that
                cannot be converted), from this thread or the grabber's.
            stop: Set to stop.

        Raises:
            SourceExhausted: A file or folder ended (not looped) after every frame was taken.
            SourceFailed: A file or folder does not open at start, or ended without a single
                readable frame.
        """
        self._reject = reject
        self.stopping.clear()
        backoff = Backoff(self.config.reconnect_initial_s,
                          max(self.config.reconnect_max_s, self.config.reconnect_initial_s))
        grabber = self._open(backoff, stop)
        healthy = True
        try:
            while grabber is not None and not stop.is_set():
                item, over = self._take(grabber)
                if item is not None:
                    image, ts, mono, seq, origin = item
                    if not healthy:
                        healthy = True
                        backoff.reset()
                        if self.status_listener is not None:
                            self.status_listener(None)
                    try:
                        model_image = to_model_image(image, self.image_size, self.grayscale)
                    except ValueError as exc:
                        self.bad_input(RecordError(f"frame {seq} rejected: {exc}", "bad_image",
                                                   stream=self.stream))
                        if self.checkpoint is not None and origin is not None:
                            self.checkpoint.done(origin.file)  # rejected: said once
                        continue
                    emit(Frame(self.stream, ts, model_image, received_mono=mono, seq=seq,
                               origin=origin, captured=image))
                    self.emitted += 1
                    continue
                if over and grabber.ended:
                    if self.frames == 0:
                        raise SourceFailed("camera file or folder holds no readable frame",
                                           stream=self.stream, inputs_rejected=self.rejected)
                    raise SourceExhausted("camera file or folder ended", stream=self.stream,
                                          frames=self.frames)
                last = self._progress_mono
                stalled = (self.realtime and last is not None
                           and self.monotonic() - last > self.config.stall_s)
                if grabber.failed or stalled:
                    if stalled:
                        self.stalls += 1
                    healthy = False
                    if self.status_listener is not None:
                        why = "stalled" if stalled else "read failed"
                        self.status_listener(SourceError(f"camera {why}; reconnecting",
                                                   stream=self.stream))
                    with self._cond:
                        self.generation += 1  # abandon the old grabber
                        self._cond.notify_all()
                    self.reconnects += 1
                    if stop.wait(backoff.next_delay()):
                        return
                    grabber = self._open(backoff, stop)
        finally:
            self.close()

    def close(self, timeout_s: float = GRABBER_JOIN_S) -> bool:
        """Stop the grabbers and wait for them, at most ``timeout_s`` seconds in all.

        Frames still queued count in :attr:`abandoned`. Each grabber's thread releases its
        capture as it ends. :meth:`run` calls this as it returns; calling it again is harmless.

        Returns:
            True when every grabber ended; False when one is still inside a blocking read
            (it stays tracked by :mod:`agent.native_threads`, which ends the process safely
            at exit if it never returns).
        """
        self.stopping.set()
        with self._cond:
            self.generation += 1
            self.abandoned += len(self._queue)
            self._queue.clear()
            self._cond.notify_all()
            grabbers = list(self._grabbers)
        deadline = self.monotonic() + timeout_s
        ended = [g.join(deadline - self.monotonic()) for g in grabbers]
        with self._cond:
            self._grabbers = [g for g in self._grabbers if g.thread.is_alive()]
        return all(ended)
