"""Config of the camera source (:mod:`agent.sources.camera`): which input, how it is paced,
which files of a folder are scored, and the reconnect watchdog's timings."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from agent.config.base import StrictModel
from agent.sources.camera_files import ImageNames


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

