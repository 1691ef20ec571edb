"""What a camera alert's snapshot costs, next to the score path it stays off.

Times (median of ``--runs`` back-to-back calls, one thread, after one warm-up call) on one
model-sized image of the package (``--model``, default ``models/mtd-patchcore``):

* ``score``: the package's INT8 ONNX artefact with ONNX Runtime, score output only (what a
  camera stream runs per frame when ONNX Runtime is selected);
* ``score+map``: the same artefact with the patch-score map exposed as extra outputs
  (:class:`agent.inference.patch_map.PatchMapModel`, what the snapshot worker runs per alerting
  frame only), i.e. what every frame would pay if the score backend returned the map;
* ``shrink``: a ``--width`` x ``--height`` BGR capture scaled down to ``--max-edge`` (once per
  snapshot, OpenCV ``INTER_AREA``);
* ``jpeg``: the scaled frame to JPEG (quality 80);
* ``heatmap``: the heatmap overlay PNG of the scaled frame.

No dataset: the images are generated. Usage::

    python benchmarks/snapshot_cost.py [--model models/mtd-patchcore] [--runs 20]
        [--width 1920] [--height 1080] [--max-edge 640]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from agent.inference.image_package import load_image_package
from agent.inference.onnxruntime import OnnxRuntimeBackend
from agent.inference.patch_map import PatchMapModel
from agent.pipeline.image import ImageSpec, normalise
from agent.records import Frame
from agent.services import snapshot_render as render
from agent.services.snapshots import _frame_pixels


def p50_ms(fn: Callable[[], object], runs: int) -> float:
    """Median wall time of ``fn`` in milliseconds after one warm-up call."""
    fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000.0 * float(np.median(times))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=Path("models/mtd-patchcore"))
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--width", type=int, default=1920)
    ap.add_argument("--height", type=int, default=1080)
    ap.add_argument("--max-edge", type=int, default=640)
    args = ap.parse_args()
    pkg = load_image_package(args.model)
    inp = pkg.manifest.input
    spec = ImageSpec(inp.height, inp.width, inp.channels, tuple(inp.mean), tuple(inp.std))
    shape = (inp.height, inp.width) if inp.channels == 1 else (inp.height, inp.width, 3)
    x = normalise(np.full(shape, 100, np.uint8), spec)
    art = next(a for a in pkg.manifest.artefacts
               if a.runtime == "onnxruntime" and a.precision == "int8")
    plain = OnnxRuntimeBackend(pkg.path / art.path, "int8")
    mapper = PatchMapModel(pkg)
    frame = np.zeros((args.height, args.width, 3), np.uint8)
    frame[:, : args.width // 2] = (40, 80, 160)
    _, patch_map = mapper.run(x)
    capture = Frame("cam", 0.0, np.zeros((inp.height, inp.width), np.uint8), captured=frame)
    small = _frame_pixels(capture, args.max_edge)
    rows = [
        ("score", p50_ms(lambda: plain.run(x), args.runs)),
        ("score+map", p50_ms(lambda: mapper.run(x), args.runs)),
        ("shrink", p50_ms(lambda: _frame_pixels(capture, args.max_edge), args.runs)),
        ("jpeg", p50_ms(lambda: render.frame_jpeg(small, args.max_edge, 80), args.runs)),
        ("heatmap", p50_ms(lambda: render.heatmap_png(small, patch_map, pkg.threshold,
                                                      args.max_edge), args.runs)),
    ]
    for name, ms in rows:
        print(f"{name:10s} p50 {ms:7.1f} ms")
    print(" ".join(f"{name.replace('+', '_')}_ms={ms:.1f}" for name, ms in rows))


if __name__ == "__main__":
    main()
