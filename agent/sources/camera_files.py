"""Recorded inputs of the camera source as captures: an image folder and a video file.

:class:`FolderCapture` reads a folder's images in name order, one per ``read`` (each verified
and decoded whole by :func:`agent.sources.image_file.read_image_file`; an unreadable one is
handed on as a :class:`agent.errors.RecordError`). :class:`VideoFileCapture` wraps an opened
``cv2.VideoCapture`` of a file and counts its frames. Both name the input they read last in an
``origin`` attribute (:class:`agent.records.FrameOrigin`), which
:class:`agent.sources.camera.CameraSource` stamps on the frame. Both are built by
:func:`agent.sources.camera.open_capture`; OpenCV and Pillow are imported only when one is used.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.errors import RecordError, SourceError
from agent.extras import install_hint
from agent.records import FrameOrigin
from agent.sources.image_file import read_image_file

#: File name suffixes (lower case) a camera folder's images have.
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff")


@dataclass(frozen=True)
class ImageNames:
    """Which file names of a camera folder are scored (``include`` / ``exclude`` of the config).

    A name is scored when its suffix is one of :data:`IMAGE_SUFFIXES` (any case), it matches
    one of ``include`` (when any is given) and none of ``exclude``. Patterns are shell globs
    (``*``, ``?``, ``[seq]``; :func:`fnmatch.fnmatchcase`, case-sensitive as Linux file names
    are) matched against the name relative to the folder (folders are not recursive).

    >>> masks_out = ImageNames(exclude=("*_mask.png",))
    >>> masks_out("exp1_num_4.png"), masks_out("exp1_num_4_mask.png"), masks_out("notes.txt")
    (True, False, False)
    >>> ImageNames(include=("*.jpg",))("exp1_num_4.png")
    False
    """

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    @classmethod
    def of(cls, include: Sequence[str] = (), exclude: Sequence[str] = ()) -> ImageNames:
        """From the config's lists."""
        return cls(tuple(include), tuple(exclude))

    def __call__(self, name: str) -> bool:
        if os.path.splitext(name)[1].lower() not in IMAGE_SUFFIXES:
            return False
        if self.include and not any(fnmatch.fnmatchcase(name, p) for p in self.include):
            return False
        return not any(fnmatch.fnmatchcase(name, p) for p in self.exclude)

    def describe(self) -> str:
        """`` (include [...], exclude [...])`` for messages; empty without patterns."""
        parts = [f"{k} {list(v)}" for k, v in (("include", self.include),
                                                ("exclude", self.exclude)) if v]
        return f" ({', '.join(parts)})" if parts else ""


class FolderCapture:
    """A folder of images as a capture: one image per :meth:`read`, in name order.

    Args:
        folder: The folder.
        loop: Start again at the end.
        names: Which files are scored (default: every image suffix).

    Raises:
        SourceError: From the constructor when the folder is missing or holds no image, or
            Pillow (which verifies each image whole) is not installed.
    """

    def __init__(self, folder: Path, loop: bool = False,
                 names: ImageNames | None = None) -> None:
        try:
            import PIL  # noqa: F401, PLC0415 - checked here, used by read_image_file
        except ImportError as exc:
            raise SourceError(f"Pillow is not installed: {install_hint('camera')}") from exc
        if not folder.is_dir():
            raise SourceError("camera folder does not exist", path=str(folder))
        names = names if names is not None else ImageNames()
        self._files = sorted(p for p in folder.iterdir() if names(os.fsdecode(p.name)))
        if not self._files:
            raise SourceError(f"camera folder holds no image{names.describe()}",
                              path=str(folder))
        self._folder = folder
        self._loop = loop
        self.origin: FrameOrigin | None = None  # the file read last
        self._i = 0
        self._decoded = False  # an image of this pass decoded

    def read(self) -> tuple[bool, Any]:
        """One image, a :class:`agent.errors.RecordError` for a rejected one
        (:func:`agent.sources.image_file.read_image_file`), or ``(False, None)`` at the end
        (looped: after a whole pass without a readable image)."""
        if self._i >= len(self._files):
            if not self._loop or not self._decoded:
                return False, None
            self._i, self._decoded = 0, False
        path = self._files[self._i]
        self._i += 1
        self.origin = FrameOrigin(os.fsdecode(path.relative_to(self._folder)))
        try:
            img = read_image_file(path)
        except RecordError as exc:
            return True, exc
        self._decoded = True
        return True, img

    def release(self) -> None:
        self._i = len(self._files)


class VideoFileCapture:
    """A video file: counts the frames read (:attr:`origin`: file name and 0-based index) and,
    with ``loop``, starts again at its first frame when it ends.

    Args:
        cap: The opened ``cv2.VideoCapture`` (or anything with its ``read``/``set``/``release``).
        name: The file's name (``origin.file``).
        loop: Rewind at the end.
    """

    def __init__(self, cap: Any, name: str, loop: bool = False) -> None:
        self._cap = cap
        self._name = name
        self._loop = loop
        self._next = 0  # index of the next frame in the file
        self.origin: FrameOrigin | None = None  # the frame read last

    def read(self) -> tuple[bool, Any]:
        ok, img = self._cap.read()
        if not ok and self._loop:
            import cv2  # noqa: PLC0415 - lazy: only with a camera stream

            self._cap.set(cv2.CAP_PROP_POS_FRAMES, 0)
            self._next = 0
            ok, img = self._cap.read()
        if ok:
            self.origin = FrameOrigin(self._name, self._next)
            self._next += 1
        return ok, img

    def release(self) -> None:
        self._cap.release()
