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

OpenCV (and Pillow, for folders) is imported only when a camera stream is built
(the ``camera`` extra: :func:`agent.extras.install_hint`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt
from pydantic import Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from agent.config.base import StrictModel
from agent.errors import RecordError, SourceError, SourceExhausted, SourceFailed
from agent.extras import install_hint
from agent.records import Frame, FrameOrigin
from agent.sources.backoff import Backoff
from agent.sources.base import SourcePlugin, StatusListener
from agent.sources.camera_files import FolderCapture, ImageNames, VideoFileCapture
from agent.sources.camera_watch import IDLE, FolderCheckpoint, ScoredFile, WatchFolderCapture

KIND = "camera"

Image = npt.NDArray[np.uint8]
FrameEmit = Callable[[Frame], None]
FrameReject = Callable[[RecordError], None]
#: Frames a recorded input (file or folder at ``fps`` = 0) reads ahead of the model.
RECORDED_QUEUE_FRAMES = 2
#: A frame waiting for the consumer: image, wall time, monotonic time, seq, origin.
_Queued = tuple[Image, float, float, int, FrameOrigin | None]


class CameraConfig(StrictModel):
    """Config of the ``camera`` source: exactly one of ``device``, ``url``, ``path``, ``folder``."""

    kind: Literal["camera"] = Field("camera", description="Source kind.")
    device: int | None = Field(None, ge=0, description="USB/V4L2 device index (0 = first).")
    url: str | None = Field(None, examples=["rtsp://10.0.0.5/stream1"],
                            description="Stream URL (RTSP, HTTP MJPEG) opened with OpenCV.")
    path: str | None = Field(None, description="Video file (relative to the config file).")
    folder: str | None = Field(
        None, description="Folder of images (png, jpg, bmp, tif), read in name order "
        "(relative to the config file)."
    )
    fps: float = Field(
        0.0, ge=0.0, description="Files and folders: 0 = every frame is scored, in order, as "
        "fast as the model takes them (the reader waits for the model; nothing is dropped); "
        "> 0 = play like a live camera at this many frames per second (the model scores the "
        "newest frame; frames it cannot keep up with are dropped and counted). Ignored for "
        "devices and URLs (always live).")
    loop: bool = Field(False, description="Start a file or folder again at its end.")
    watch: bool = Field(False, description="Folders only: keep polling the folder for new "
                        "images and score each once, also across restarts (checkpoint in the "
                        "store); never ends. A file is taken once its size and mtime stayed the "
                        "same over one poll (not while it is being written).")
    # le: inf or 1e300 passed and then killed the grabber thread (Event.wait overflows time_t)
    include: list[str] = Field(
        default_factory=list, examples=[["*.jpg"]], description="Folders only: score only "
        "the images whose file name matches one of these shell globs (e.g. [\"*.jpg\"] for "
        "a folder that also holds the mask PNGs); empty = every image (png, jpg, bmp, tif). "
        "Case-sensitive.")
    exclude: list[str] = Field(
        default_factory=list, examples=[["*_mask.png"]], description="Folders only: never "
        "score the images whose file name matches one of these shell globs. Case-sensitive.")
    poll_s: float = Field(1.0, gt=0.0, le=86400.0, description="Watched folder: seconds "
                          "between two listings of the folder (only with watch = true; at most "
                          "a day).")
    stall_s: float = Field(5.0, gt=0.0, description="Reconnect when no new frame arrived for "
                           "this many seconds (frame-age watchdog of live cameras and of "
                           "files at fps > 0; a file at fps = 0 is never reopened).")
    reconnect_initial_s: float = Field(0.5, gt=0.0, description="First reconnect delay, s.")
    reconnect_max_s: float = Field(30.0, gt=0.0, description="Largest reconnect delay, s.")

    @model_validator(mode="after")
    def _one_input(self) -> CameraConfig:
        given = [k for k in ("device", "url", "path", "folder") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                f"set exactly one of device, url, path, folder (got {given or 'none'})"
            )
        problems: list[tuple[str, str]] = []
        for key in ("watch", "poll_s", "include", "exclude"):
            if key in self.model_fields_set and self.folder is None:
                problems.append((key, "applies only to an image folder (folder = ...)"))
        for key in ("include", "exclude"):
            if any(not g or "/" in g for g in getattr(self, key)):
                problems.append((key, "each pattern is a non-empty file-name glob without '/' "
                                 "(folders are not recursive)"))
        if self.watch and self.loop:
            problems.append(("loop", "a watched folder never ends: remove loop"))
        if self.watch and self.fps > 0:
            problems.append(("fps", "a watched folder scores every new image once: fps must "
                             "be 0"))
        if problems:
            raise ValidationError.from_exception_data("CameraConfig", [
                InitErrorDetails(type=PydanticCustomError("camera_key", msg), loc=(key,),
                                 input=getattr(self, key))
                for key, msg in problems])
        return self

    @property
    def names(self) -> ImageNames:
        """Which files of ``folder`` are scored (``include``/``exclude``)."""
        return ImageNames.of(self.include, self.exclude)

    @property
    def finite(self) -> bool:
        """A file or folder that ends (not looped)."""
        return ((self.path is not None or self.folder is not None) and not self.loop
                and not self.watch)

    @property
    def live(self) -> bool:
        """A device or URL (not a recorded file or folder)."""
        return self.device is not None or self.url is not None

    @property
    def realtime(self) -> bool:
        """Newest-frame semantics: a live input, or a file or folder paced at ``fps`` > 0.

        >>> CameraConfig(folder="f").realtime, CameraConfig(folder="f", fps=5).realtime
        (False, True)
        >>> CameraConfig(url="rtsp://cam/1").realtime
        True
        """
        return self.live or self.fps > 0


#: The ``camera`` kind, as the ``edge_agent.sources`` entry point names it.
PLUGIN = SourcePlugin(
    KIND, CameraConfig, "agent.sources.camera:CameraSource", path_fields=("path", "folder")
)


class Capture(Protocol):
    """What the source needs of a capture (``cv2.VideoCapture`` has this shape)."""

    def read(self) -> tuple[bool, Any]:
        """Return ``(True, image)`` or ``(False, None)`` at the end or on an error.

        ``(True, RecordError)``: one input was skipped (an unreadable image in a folder); the
        source counts and reports it and reads on.
        """
        ...

    def release(self) -> None:
        """Close the capture."""
        ...


def capture_origin(cap: Capture) -> FrameOrigin | None:
    """The origin of the frame ``cap`` read last: its ``origin`` attribute, None without one."""
    origin = getattr(cap, "origin", None)
    return origin if isinstance(origin, FrameOrigin) else None


CaptureFactory = Callable[[CameraConfig], Capture]


def quiet_opencv() -> None:
    """Import OpenCV with its own logging silenced (the agent logs what goes wrong itself).

    OpenCV, FFmpeg and the codecs print a raw stderr line of their own per failed open or
    undecodable file (a flood while an RTSP camera is down, or per bad image in a folder), not
    rate-limited and not in the agent's log format. ``OPENCV_LOG_LEVEL`` and
    ``OPENCV_FFMPEG_LOGLEVEL`` set in the environment are kept (to debug a camera); otherwise
    OpenCV logs nothing and FFmpeg only its fatal errors.

    Raises:
        SourceError: OpenCV is not installed.
    """
    user_level = os.environ.get("OPENCV_LOG_LEVEL")
    for var, quiet in (("OPENCV_LOG_LEVEL", "SILENT"), ("OPENCV_FFMPEG_LOGLEVEL", "-8")):
        os.environ.setdefault(var, quiet)
    try:
        import cv2  # noqa: PLC0415 - lazy: only with a camera stream
    except ImportError as exc:
        raise SourceError(f"OpenCV is not installed: {install_hint('camera')}") from exc
    if user_level is None:  # the variable only counts at OpenCV's first import
        cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_SILENT)


def open_capture(config: CameraConfig, checkpoint: FolderCheckpoint | None = None) -> Capture:
    """The default capture factory: :class:`FolderCapture`, :class:`WatchFolderCapture`
    (``watch``; ``checkpoint``: the files done, in memory only when None) or
    ``cv2.VideoCapture``.

    Raises:
        SourceError: OpenCV is missing, or the capture does not open.
    """
    quiet_opencv()
    if config.folder is not None and config.watch:
        if checkpoint is None:
            checkpoint = FolderCheckpoint("")
        return WatchFolderCapture(Path(config.folder), checkpoint, config.names)
    if config.folder is not None:
        return FolderCapture(Path(config.folder), config.loop, config.names)
    import cv2  # noqa: PLC0415 - lazy: only with a camera stream

    target: int | str = (config.device if config.device is not None
                         else config.url if config.url is not None else str(config.path))
    cap = cv2.VideoCapture(target)
    if not cap.isOpened():
        cap.release()
        raise SourceError("camera capture does not open", target=str(target))
    if config.path is not None:
        return VideoFileCapture(cap, os.fsdecode(Path(config.path).name), config.loop)
    return cap


def to_model_image(image: Image, size: tuple[int, int] | None, grayscale: bool) -> Image:
    """Convert a captured image for the model: grayscale (from BGR/BGRA) and resize.

    Pixel values are converted to ``uint8`` by dtype, never clipped unscaled: unsigned integers
    are scaled by ``255 / max`` of their type (``uint16``: / 257, so 16-bit PNG/TIFF keep their
    full range), signed integers by ``255 / max`` with negatives at 0, floats are taken as
    intensities in ``[0, 1]`` (the OpenCV/scikit-image convention of a float32 TIFF) and
    multiplied by 255, values outside and NaN clipped to 0..255 (NaN = 0), ``bool`` → 0/255.
    The result is rounded to the nearest integer.

    Args:
        image: ``(H, W)``, ``(H, W, 3)`` BGR or ``(H, W, 4)`` BGRA of ``uint8``, another integer
            type, ``bool`` or float (see above).
        size: ``(height, width)`` of the model input; None = keep the size.
        grayscale: Convert to one channel.

    Returns:
        ``uint8`` ``(h, w)`` when grayscale, else ``(h, w, 3)``.

    Raises:
        ValueError: an image of another shape (not 2-D, or 3-D with 2 or more than 4
            channels, or empty) or type that cannot be converted.
    """
    import cv2  # noqa: PLC0415 - lazy: only with a camera stream

    img: Any = np.asarray(image)
    if img.ndim == 3 and img.shape[2] == 1:
        img = img[:, :, 0]
    if not (img.ndim == 2 or (img.ndim == 3 and img.shape[2] in (3, 4))) or img.size == 0:
        raise ValueError(f"image of shape {img.shape} is neither grayscale, BGR nor BGRA")
    if img.dtype != np.uint8:
        img = _to_uint8(img)
    try:
        if img.ndim == 3 and (grayscale or img.shape[2] == 4):
            code = ((cv2.COLOR_BGRA2GRAY if img.shape[2] == 4 else cv2.COLOR_BGR2GRAY)
                    if grayscale else cv2.COLOR_BGRA2BGR)
            img = cv2.cvtColor(img, code)
        elif img.ndim == 2 and not grayscale:
            img = cv2.cvtColor(img, cv2.COLOR_GRAY2BGR)
        if size is not None and img.shape[:2] != size:
            img = cv2.resize(img, (size[1], size[0]), interpolation=cv2.INTER_AREA)
    except cv2.error as exc:
        raise ValueError(f"image of shape {img.shape} cannot be converted: "
                         f"{str(exc).strip().splitlines()[-1]}") from exc
    return np.asarray(img, dtype=np.uint8)


def _to_uint8(img: Any) -> Image:
    """Scale a non-``uint8`` image to ``uint8`` by its dtype (see :func:`to_model_image`).

    >>> _to_uint8(np.array([[0, 257, 65535]], np.uint16)).tolist()
    [[0, 1, 255]]
    >>> _to_uint8(np.array([[0.0, 0.5, 1.0, 2.0, -1.0, np.nan]], np.float32)).tolist()
    [[0, 128, 255, 255, 0, 0]]
    """
    if img.dtype == np.bool_:
        mask: Image = np.asarray(img, np.uint8) * np.uint8(255)  # Any in 3.10's numpy stubs
        return mask
    if np.issubdtype(img.dtype, np.integer):
        scaled = img.astype(np.float64) * (255.0 / float(np.iinfo(img.dtype).max))
    elif np.issubdtype(img.dtype, np.floating):
        scaled = img.astype(np.float64) * 255.0
    else:
        raise ValueError(f"image of type {img.dtype} cannot be converted")
    return np.asarray(np.rint(np.nan_to_num(scaled, nan=0.0, posinf=255.0, neginf=0.0))
                      .clip(0, 255), np.uint8)


class _Grabber:
    """One capture and the thread reading it (replaced as a whole on reconnect)."""

    def __init__(self, cap: Capture, owner: CameraSource, generation: int) -> None:
        self.cap = cap
        self.generation = generation
        self.ended = False  # the file or folder ended
        self.failed = False  # a read failed on a live source
        self._owner = owner
        self.thread = threading.Thread(target=self._run, name=f"camera-{owner.stream}",
                                       daemon=True)

    def _run(self) -> None:
        o = self._owner
        period = 1.0 / o.config.fps if o.config.fps > 0 and not o.live else 0.0
        due = o.monotonic()
        folder_down = False  # a watched folder that cannot be listed (share unmounted)
        try:
            while not o.stopping.is_set() and o.generation == self.generation:
                if period:
                    delay = due - o.monotonic()
                    if delay > 0 and o.stopping.wait(delay):
                        return
                    due = max(due + period, o.monotonic() - period)
                ok, img = self.cap.read()
                if bool(getattr(self.cap, "listing_failed", False)) != folder_down:
                    # an outage (red in /healthz, one line when it starts and one when it
                    # ends), not idle polls: those kept the stream green while the folder was gone
                    folder_down = not folder_down
                    if o._listener is not None:
                        o._listener(SourceError("camera folder cannot be listed",
                                                path=str(o.config.folder))
                                    if folder_down else None)
                if img is IDLE:  # a watched folder with nothing new: poll again later
                    if not folder_down:
                        o.idle_mono = o.monotonic()
                    if o.stopping.wait(o.config.poll_s):
                        return
                    continue
                if not ok or img is None:
                    if o.generation != self.generation:
                        return  # abandoned while blocked in read()
                    if o.live:
                        self.failed = True
                    else:
                        self.ended = True
                    o.wake()
                    return
                if isinstance(img, RecordError):
                    o.bad_input(img)
                    continue
                # counted abandoned if replaced
                o.offer(np.asarray(img), self.generation, capture_origin(self.cap))
        finally:
            with contextlib.suppress(Exception):  # a failing release must not kill the thread
                self.cap.release()


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
        self._listener: StatusListener | None = None
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
        self._listener = listener

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

    def _open(self, backoff: Backoff, stop: threading.Event) -> _Grabber | None:
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
                if self._listener is not None:
                    self._listener(exc)
                self.reconnects += 1
                stop.wait(backoff.next_delay())
                continue
            with self._cond:
                self.generation += 1
                self._progress_mono = self.monotonic()  # the watchdog restarts its count
                grabber = _Grabber(cap, self, self.generation)
            grabber.thread.start()
            return grabber
        return None

    def _take(self, grabber: _Grabber) -> tuple[_Queued | None, bool]:
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
                        if self._listener is not None:
                            self._listener(None)
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
                    if self._listener is not None:
                        why = "stalled" if stalled else "read failed"
                        self._listener(SourceError(f"camera {why}; reconnecting",
                                                   stream=self.stream))
                    with self._cond:
                        self.generation += 1  # abandon the old grabber
                        self._cond.notify_all()
                    self.reconnects += 1
                    if stop.wait(backoff.next_delay()):
                        return
                    grabber = self._open(backoff, stop)
        finally:
            self.stopping.set()
            with self._cond:
                self.generation += 1
                self.abandoned += len(self._queue)
                self._queue.clear()
                self._cond.notify_all()
