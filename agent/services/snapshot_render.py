"""Render a camera alert's snapshot: the frame as JPEG and the anomaly heatmap overlay as PNG.

Pure functions over numpy arrays and bytes (Pillow encodes in memory; no files, no clocks).

Frame (:func:`frame_jpeg`): the captured frame (any size, BGR or grayscale; converted to
``uint8`` like the model input, :func:`agent.sources.camera.to_model_image` without the resize)
is scaled down so its longer edge is at most ``max_edge`` pixels (aspect kept, never scaled up;
Pillow ``thumbnail`` with bilinear filtering) and encoded as baseline JPEG at ``quality``.

Heatmap (:func:`heatmap_png`): the model's patch-score map (``(rows, cols)`` float, score units:
:mod:`agent.inference.patch_map`) is mapped onto a fixed scale anchored on the threshold,
``t = clip((d - lo) / (hi - lo), 0, 1)`` with ``lo = SCALE_LO x threshold`` and
``hi = SCALE_HI x threshold``, upsampled bilinearly to the snapshot's size, coloured with a
black-red-yellow-white ramp (an approximation of matplotlib's ``inferno``) and blended over the
frame with opacity ``ALPHA_MAX x min(1, 3 t)`` (a patch at or below ``lo`` leaves the frame as it
is). A legend strip under the image shows the ramp and the scale in score units; the same figures
are in the PNG's text chunks (``score``, ``threshold``, ``scale_min``, ``scale_max``, ``model``,
``alert_id``). So colours mean the same on every snapshot of a model: yellow-white is above the
threshold.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

#: Colour scale of the heatmap, as multiples of the threshold (module docstring).
SCALE_LO, SCALE_HI = 0.5, 1.5
#: Largest opacity of the colour over the frame.
ALPHA_MAX = 0.6
#: Height of the legend strip, pixels.
LEGEND_PX = 16

#: ``(t, R, G, B)`` anchors of the colour ramp.
_RAMP = np.array([
    (0.00, 0, 0, 4), (0.25, 87, 16, 110), (0.50, 188, 55, 84), (0.75, 249, 142, 9),
    (1.00, 252, 255, 164),
], dtype=np.float64)


#: The ramp sampled at 256 steps: ``_LUT[round(255 t)]`` is the colour of ``t``.
_LUT = np.rint(np.stack([np.interp(np.linspace(0.0, 1.0, 256), _RAMP[:, 0], _RAMP[:, k])
                         for k in (1, 2, 3)], axis=-1)).astype(np.uint8)


@dataclass(frozen=True, slots=True)
class Scale:
    """The heatmap's colour scale in score units: ``lo`` (transparent) .. ``hi`` (full)."""

    lo: float
    hi: float

    @classmethod
    def of(cls, threshold: float) -> Scale:
        """The scale of a model with ``threshold`` (:data:`SCALE_LO`, :data:`SCALE_HI`).

        >>> Scale.of(20.0)
        Scale(lo=10.0, hi=30.0)
        """
        t = abs(float(threshold)) or 1.0
        return cls(SCALE_LO * t, SCALE_HI * t)


def colour_ramp(t: npt.NDArray[np.floating]) -> npt.NDArray[np.uint8]:
    """RGB ``uint8`` colours (shape ``t.shape + (3,)``) of ``t`` in ``[0, 1]``.

    >>> colour_ramp(np.array([0.0, 1.0])).tolist()
    [[0, 0, 4], [252, 255, 164]]
    """
    x = np.clip(np.nan_to_num(np.asarray(t, np.float32)), 0.0, 1.0)
    out: npt.NDArray[np.uint8] = _LUT[np.rint(x * 255.0).astype(np.uint8)]
    return out


def to_rgb(image: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    """``(H, W)`` gray or ``(H, W, 3)`` BGR ``uint8`` → ``(H, W, 3)`` RGB."""
    if image.ndim == 2:
        return np.repeat(image[:, :, None], 3, axis=2)
    return np.ascontiguousarray(image[:, :, 2::-1])


def fit_edge(image: npt.NDArray[np.uint8], max_edge: int) -> object:
    """A Pillow RGB image of ``image`` (gray or BGR ``uint8``), longer edge at most ``max_edge``."""
    from PIL import Image  # noqa: PLC0415 - lazy: only with snapshots

    img = Image.fromarray(to_rgb(image), "RGB")
    if max(img.size) > max_edge:
        img.thumbnail((max_edge, max_edge), Image.Resampling.BILINEAR)
    return img


def frame_jpeg(image: npt.NDArray[np.uint8], max_edge: int, quality: int) -> bytes:
    """The frame as JPEG bytes (module docstring).

    Args:
        image: ``uint8`` ``(H, W)`` or ``(H, W, 3)`` BGR.
        max_edge: Longer edge of the JPEG at most, pixels.
        quality: JPEG quality 1..95 (Pillow's scale).
    """
    img = fit_edge(image, max_edge)
    out = io.BytesIO()
    img.save(out, "JPEG", quality=quality)  # type: ignore[attr-defined]
    return out.getvalue()


def heatmap_png(image: npt.NDArray[np.uint8], patch_map: npt.NDArray[np.floating],
                threshold: float, max_edge: int, text: dict[str, str] | None = None) -> bytes:
    """The heatmap overlay as PNG bytes (module docstring).

    Args:
        image: The frame, ``uint8`` ``(H, W)`` or ``(H, W, 3)`` BGR.
        patch_map: ``(rows, cols)`` patch scores, score units.
        threshold: The model's threshold (score units): anchors the colour scale.
        max_edge: Longer edge of the image part at most, pixels (the legend adds
            :data:`LEGEND_PX` rows).
        text: Extra PNG text chunks (``alert_id``, ``model`` ...).

    Raises:
        ValueError: ``patch_map`` is not 2-D or holds no finite value.
    """
    from PIL import Image, ImageDraw, PngImagePlugin  # noqa: PLC0415

    pm = np.asarray(patch_map, np.float32)
    if pm.ndim != 2 or not np.isfinite(pm).any():
        raise ValueError(f"patch map of shape {pm.shape} is not a 2-D map of finite scores")
    pm = np.nan_to_num(pm, nan=0.0, posinf=float(np.nanmax(pm[np.isfinite(pm)])))
    base = fit_edge(image, max_edge)
    w, h = base.size  # type: ignore[attr-defined]
    scale = Scale.of(threshold)
    up = np.asarray(Image.fromarray(pm, "F").resize((w, h), Image.Resampling.BILINEAR))
    t = np.clip((up - scale.lo) / (scale.hi - scale.lo), 0.0, 1.0)
    alpha = (ALPHA_MAX * np.minimum(1.0, 3.0 * t))[:, :, None]
    frame = np.asarray(base, np.float32)
    blend = (1.0 - alpha) * frame + alpha * colour_ramp(t).astype(np.float32)
    canvas = Image.new("RGB", (w, h + LEGEND_PX), (0, 0, 0))
    canvas.paste(Image.fromarray(np.rint(blend).astype(np.uint8), "RGB"), (0, 0))
    ramp = colour_ramp(np.linspace(0.0, 1.0, max(1, w)))[None].repeat(LEGEND_PX // 2, 0)
    canvas.paste(Image.fromarray(ramp, "RGB"), (0, h))
    draw = ImageDraw.Draw(canvas)
    label = f"{scale.lo:.3g}"
    draw.text((2, h + LEGEND_PX // 2 - 1), label, fill=(255, 255, 255))
    right = f"{scale.hi:.3g} (thr {threshold:.3g})"
    draw.text((max(2, w - 6 * len(right) - 2), h + LEGEND_PX // 2 - 1), right,
              fill=(255, 255, 255))
    info = PngImagePlugin.PngInfo()
    chunks = {"threshold": f"{threshold:.6g}", "scale_min": f"{scale.lo:.6g}",
              "scale_max": f"{scale.hi:.6g}", "patch_max": f"{float(pm.max()):.6g}",
              **(text or {})}
    for key, value in chunks.items():
        info.add_text(key, value)
    out = io.BytesIO()
    canvas.save(out, "PNG", pnginfo=info, compress_level=1)  # 1: a third of level 6's time
    return out.getvalue()
