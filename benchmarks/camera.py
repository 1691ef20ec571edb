"""Camera benchmark: N streams x F fps of S x S video through the agent's camera path.

    python3 benchmarks/camera.py [--streams 4] [--fps 30] [--size 128] [--seconds 20]
                                 [--package models/mtd-patchcore]

The script writes one MJPG ``.avi`` per stream (frames of a noisy texture with a frame counter
drawn in) into a temporary folder, then runs one :class:`agent.services.camera.CameraStream` per
file (camera source paced at ``--fps`` and looped, newest-frame grabber, resize to the model
input, INT8 model on the auto-selected backend, alert rules), all in this process, as the
agent does.

Prints per second: frames scored, frames dropped by the grabbers (newer frames replaced them),
the frame age at scoring (p50/max over all streams, ms); at the end frame → score latency
(capture to score, ms) p50/p95/p99 and the throughput. Frame age must not grow over time: the
grabber drops old frames instead of queueing them.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent import native_threads  # noqa: E402
from agent.inference.image_package import load_image_package  # noqa: E402
from agent.inference.image_select import open_image_backend  # noqa: E402
from agent.pipeline.image import ImagePipeline, ImageSpec  # noqa: E402
from agent.pipeline.rules import RuleParams  # noqa: E402
from agent.records import Frame  # noqa: E402
from agent.services.camera import CameraStream  # noqa: E402
from agent.sources.camera import CameraConfig, CameraSource  # noqa: E402


def make_video(path: Path, size: int, fps: float, frames: int, seed: int) -> None:
    import cv2  # noqa: PLC0415

    rng = np.random.default_rng(seed)
    base = cv2.GaussianBlur(rng.normal(70, 12, (size, size)).astype(np.float32), (0, 0), 1.5)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), fps, (size, size))
    for i in range(frames):
        img = np.clip(base + rng.normal(0, 3, base.shape), 0, 255).astype(np.uint8)
        img = cv2.cvtColor(img, cv2.COLOR_GRAY2BGR)
        cv2.putText(img, str(i), (4, size // 2), cv2.FONT_HERSHEY_SIMPLEX, 0.5, (255, 255, 255))
        writer.write(img)
    writer.release()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--fps", type=float, default=30.0)
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--package", type=Path, default=ROOT / "models" / "mtd-patchcore")
    args = ap.parse_args(argv)
    package = load_image_package(args.package)
    inp = package.manifest.input
    spec = ImageSpec(inp.height, inp.width, inp.channels, tuple(inp.mean), tuple(inp.std))
    latencies: list[float] = []
    ages: list[float] = []
    lock = threading.Lock()

    def on_score(frame: Frame, score: float, latency_s: float) -> None:
        with lock:
            latencies.append(latency_s)
            ages.append(latency_s)

    stop = threading.Event()
    streams: list[CameraStream] = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.streams):
            path = Path(tmp) / f"cam{k}.avi"
            make_video(path, args.size, args.fps, int(args.fps * 10), seed=k)
            cfg = CameraConfig(path=str(path), fps=args.fps, loop=True, stall_s=2.0)
            source = CameraSource(cfg, f"cam{k}", image_size=(inp.height, inp.width),
                                  grayscale=inp.grayscale)
            pipe = ImagePipeline(f"cam{k}", "bench", spec, open_image_backend(package),
                                 package.threshold, RuleParams())
            streams.append(CameraStream(source, pipe, package, lambda item: None, stop,
                                        on_score=on_score))
        print(f"{args.streams} streams x {args.fps:g} fps of {args.size}x{args.size} MJPG; "
              f"model {package.label} {inp.height}x{inp.width} INT8 (auto-selected backend, "
              "1 thread per stream)")
        for s in streams:
            s.start()
        t0 = time.monotonic()
        last_scored = last_dropped = 0
        print(f"{'t s':>4} {'scored/s':>9} {'dropped/s':>10} {'age p50 ms':>11} "
              f"{'age max ms':>11}")
        while time.monotonic() - t0 < args.seconds:
            time.sleep(1.0)
            with lock:
                window, ages[:] = list(ages), []
            scored = sum(s.scored for s in streams)
            dropped = sum(s.source.dropped for s in streams)
            a = np.array(window) * 1e3 if window else np.array([np.nan])
            print(f"{time.monotonic() - t0:4.0f} {scored - last_scored:9d} "
                  f"{dropped - last_dropped:10d} {np.median(a):11.1f} {a.max():11.1f}",
                  flush=True)
            last_scored, last_dropped = scored, dropped
        stop.set()
        for s in streams:  # as the agent's shutdown: no grabber left inside OpenCV at exit
            s.join(timeout=5.0)
            s.close()
    lat = np.array(latencies) * 1e3
    elapsed = args.seconds
    offered = args.streams * args.fps * elapsed
    print(f"frame -> score latency ms: p50 {np.percentile(lat, 50):.1f}  p95 "
          f"{np.percentile(lat, 95):.1f}  p99 {np.percentile(lat, 99):.1f}  (target p99 <= "
          f"{package.manifest.latency_budget_ms_p99:g})")
    print(f"scored {len(lat)} of ~{offered:.0f} frames offered ({len(lat) / elapsed:.1f}/s); "
          f"dropped {sum(s.source.dropped for s in streams)}; reconnects "
          f"{sum(s.source.reconnects for s in streams)}")
    print(f"P99_MS={np.percentile(lat, 99):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(native_threads.finish(main()))
