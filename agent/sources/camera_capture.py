"""Captures of the camera source: the protocol, the default factory and the frame conversion.

:func:`open_capture` opens what a :class:`~agent.sources.camera_config.CameraConfig` names (an
image folder, a watched folder, or a ``cv2.VideoCapture`` of a device, URL or video file);
:func:`to_model_image` converts a captured frame to the model's input. OpenCV is imported only
inside these functions (:func:`quiet_opencv`), so a sensor-only agent never loads it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from agent.errors import SourceError
from agent.extras import install_hint
from agent.records import FrameOrigin
from agent.sources.camera_config import CameraConfig
from agent.sources.camera_files import FolderCapture, VideoFileCapture
from agent.sources.camera_watch import FolderCheckpoint, WatchFolderCapture

Image = npt.NDArray[np.uint8]


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

