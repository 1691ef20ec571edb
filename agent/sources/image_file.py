"""One image file of a camera folder: read, verified whole, decoded (OpenCV + Pillow).

:func:`read_image_file` reads the file's bytes itself and decodes them with ``cv2.imdecode``
(``cv2.IMREAD_UNCHANGED``: 16-bit, float, colour and alpha images keep their dtype and channels
for :func:`agent.sources.camera.to_model_image`). It never passes a file name to OpenCV:
``cv2.imread`` of a name that is not valid UTF-8 (``good_\\xff.jpg``, common on Latin-1 SMB
shares) crashed the whole process (SIGSEGV), and its per-file warnings went to stderr as raw
lines.

Before OpenCV sees the bytes, Pillow decodes them completely (``Image.load()`` with
``ImageFile.LOAD_TRUNCATED_IMAGES`` off): libjpeg "recovers" a truncated or cut-off JPEG (a file
still being copied into the folder) by filling the missing rows with grey, which the model
scores as a defect (a 3,000-byte head of a good JPEG scored 48 against a threshold of 26);
Pillow raises ``OSError: image file is truncated`` instead. For JPEG the check decodes at
1/8 scale (``Image.draft``): every entropy-coded byte is still read, so a cut-off file is still
caught, at a fraction of a full decode's cost; a PNG is checked with ``Image.verify()`` (the
CRC of every chunk through the end marker, without inflating the pixels). A file Pillow does not
know (a format only
OpenCV reads) is left to OpenCV. JPEG has no checksum: damage inside the coded data that keeps
the stream well-formed (a flipped bit) decodes to a plausible image and is not caught.

An image smaller than :data:`MIN_IMAGE_SIDE` (8) pixels on a side is rejected: no inspection
camera delivers one (a 1x1 or 2x2 placeholder, a broken export; a 2x2 image was scored and
alerted), and scaling it up to the model's input invents the structure the model then scores.
The floor is fixed and deliberately low (one JPEG block), not a fraction of the model's input:
a camera whose frames are smaller than the model's input still works as before (upscaled).

Pillow's own warnings about a damaged file (``UserWarning: Truncated File Read``, ``Corrupt EXIF
data``, ``DecompressionBombWarning``) are ignored process-wide (one filter for warnings raised
in ``PIL`` modules, installed at the first image): the file's rejection is the agent's message.
"""

from __future__ import annotations

import io
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from agent.errors import RecordError

#: Smallest width and height, px, of an image the folder source scores (smaller: rejected).
MIN_IMAGE_SIDE = 8
#: Reason of an image that cannot be read or decoded whole (metric label).
UNREADABLE = "unreadable_image"
#: Reason of an image that decodes but is too small to score (metric label).
BAD = "bad_image"


def shown_name(path: Path) -> str:
    """The file name for messages: bytes that are not UTF-8 as ``\\xff`` escapes.

    >>> shown_name(Path(os.fsdecode(b"good_\\xff.jpg")))
    'good_\\\\xff.jpg'
    """
    return os.fsencode(path.name).decode("utf-8", "backslashreplace")


def read_image_file(path: Path) -> Any:
    """Read, verify and decode one image file.

    Args:
        path: The file (any name: the bytes are read by Python, not by OpenCV).

    Returns:
        The image as ``cv2.imdecode(..., cv2.IMREAD_UNCHANGED)`` gives it: ``(H, W)``,
        ``(H, W, 3)`` BGR or ``(H, W, 4)`` BGRA, dtype as stored (``uint8``, ``uint16``,
        ``float32``, ...), ``H`` and ``W`` at least :data:`MIN_IMAGE_SIDE`.

    Raises:
        RecordError: reason ``unreadable_image``: the file cannot be read (gone, a dangling
            symlink, no permission, a directory), is empty, is truncated or corrupt, or is not
            an image; reason ``bad_image``: it is smaller than :data:`MIN_IMAGE_SIDE`. The
            message names the file and why.
    """
    import cv2  # noqa: PLC0415 - lazy: only with a camera stream

    name = shown_name(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise _rejected(path, name, f"cannot be read: {exc.strerror or exc}", UNREADABLE) from exc
    if not data:
        raise _rejected(path, name, "empty file", UNREADABLE)
    problem = _pillow_problem(data)
    if problem is not None:
        raise _rejected(path, name, problem, UNREADABLE)
    try:
        img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    except cv2.error as exc:  # a decoder that refuses the data instead of returning None
        raise _rejected(path, name, str(exc).strip().splitlines()[-1], UNREADABLE) from exc
    if img is None:
        raise _rejected(path, name, "does not decode", UNREADABLE)
    height, width = img.shape[:2]
    if min(height, width) < MIN_IMAGE_SIDE:
        raise _rejected(path, name, f"{width}x{height} px is smaller than "
                        f"{MIN_IMAGE_SIDE}x{MIN_IMAGE_SIDE}", BAD)
    return img


def _pillow_problem(data: bytes) -> str | None:
    """Why Pillow cannot decode ``data`` whole, or None (decoded, or a format it does not know).

    Raises:
        RecordError: never; Pillow's errors are returned as text.
    """
    from PIL import Image, UnidentifiedImageError  # noqa: PLC0415 - lazy, as OpenCV

    _quiet_pillow()
    try:
        with Image.open(io.BytesIO(data)) as im:
            if im.format == "PNG":
                im.verify()  # every chunk's CRC through IEND, without inflating the pixels
            else:
                if im.format == "JPEG":
                    im.draft(im.mode, (max(1, im.width // 8), max(1, im.height // 8)))
                im.load()
    except UnidentifiedImageError:
        return None  # not a format Pillow reads: OpenCV decides
    except Image.DecompressionBombError as exc:
        return str(exc)
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        text = str(exc).strip() or type(exc).__name__
        return text if "truncated" in text.lower() else f"corrupt ({text})"
    return None


_pillow_quiet = False


def _quiet_pillow() -> None:
    """Ignore warnings raised in Pillow's modules (once; see the module docstring)."""
    global _pillow_quiet  # noqa: PLW0603 - one process-wide filter, installed once
    if not _pillow_quiet:
        warnings.filterwarnings("ignore", module=r"PIL(\.|$)")
        _pillow_quiet = True


def _rejected(path: Path, name: str, why: str, reason: str) -> RecordError:
    return RecordError(f"image {name} skipped: {why}", reason, path=os.fsencode(path)
                       .decode("utf-8", "backslashreplace"))
