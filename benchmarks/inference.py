"""Inference runtimes side by side: every installed backend × FP32/INT8 × threads × batch.

    python3 benchmarks/inference.py [--models models] [--reps 30] [--calls 20]

A benchmark, not a test: it prints figures and asserts nothing. For every model package under
``--models`` (the sensor model ``skab-wstat``; an image model, a manifest with ``"kind":
"image"``, when one is there), every runtime the agent can load (:mod:`agent.inference.select`:
ONNX Runtime, OpenVINO on its IR and on the ONNX files, LiteRT on the TFLite file) runs every
artefact at threads 1 and 2 and batch 1, 8 and 32, plus PyTorch eager FP32 where torch is
installed (sensor model: a torch re-implementation of the window statistics; image model: the
recipe's torch module when its recipe exposes ``torch_model(package_dir)``).

Interleaved: each repetition runs ``--calls`` (image models: ``--image-calls``, 10) timed calls of
every configuration in turn (round-robin), so thermal or load drift hits all configurations
alike. For image models the largest batch is measured one backend at a time (memory: see
:func:`main`), the rest interleaved; the speedup figures are batch 1. Figures per configuration:
p50 and p99 of one call divided by the batch (seconds per window), and windows per second.
Sizes: bytes of every artefact. The inputs are the package's golden inputs, tiled to the batch.

The last line is ``int8_vs_ort_fp32=<x> int8_vs_torch=<x>``: batch-1, 1-thread p50 speedup of
the INT8 backend that auto-selection picks over ONNX Runtime FP32 and over PyTorch eager FP32,
for the image model (targets: ≥ 3 and ≥ 5; INT8 size ≤ 0.3 × FP32, counting every file of the
selected artefact, e.g. an IR's .xml and .bin), or for the sensor model when
there is no image model (said on the line before). With several image packages these are
``mtd-patchcore``'s. When the distilled student ``mtd-student`` is there too, the line gains
``student_vs_patchcore_ort_fp32=<x> student_vs_patchcore_torch=<x>``: the student's selected INT8
backend against mtd-patchcore on ONNX Runtime FP32 and in PyTorch eager FP32, batch 1, one
thread, p50, measured head to head in one more interleaved round (:func:`head_to_head`; targets:
≥ 5 and ≥ 10).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.errors import ModelError
from agent.inference.image_package import ImagePackage, load_image_package
from agent.inference.package import ModelPackage, load_package
from agent.inference.registry import build_backend
from agent.inference.select import candidates, select_backend

THREADS = (1, 2)
BATCHES = (1, 8, 32)


@dataclass
class Config:
    label: str  # runtime label (openvino-onnx ...) or "torch"
    precision: str
    threads: int
    batch: int
    run: Callable[[np.ndarray], Any]
    setup: Callable[[], None] = lambda: None
    times: list[float] = field(default_factory=list)

    @property
    def key(self) -> str:
        return f"{self.label}/{self.precision}"


def torch_threads(n: int) -> Callable[[], None]:
    def setup() -> None:
        import torch  # noqa: PLC0415

        torch.set_num_threads(n)

    return setup


def torch_sensor(package: ModelPackage) -> Callable[[np.ndarray], Any] | None:
    """PyTorch eager FP32 window statistics (the same features as the ONNX graph)."""
    try:
        import torch  # noqa: PLC0415
    except ImportError:
        return None

    def run(x: np.ndarray) -> Any:
        with torch.inference_mode():
            t = torch.from_numpy(x)
            mean = t.mean(dim=1)
            mad = (t - mean[:, None, :]).abs().mean(dim=1)
            delta = (t[:, 1:, :] - t[:, :-1, :]).abs().mean(dim=1)
            return torch.cat([mean, mad, delta], dim=1).numpy()

    return run


def golden_inputs(package: Any) -> np.ndarray:
    if isinstance(package, ImagePackage):
        g = package.manifest.golden
        return np.load(package.path / g.inputs_file, allow_pickle=False).astype(np.float32)
    return np.asarray(package.manifest.golden.inputs, dtype=np.float32)


def torch_image(package: Any, root: Path) -> Callable[[np.ndarray], Any] | None:
    """The image recipe's torch module: ``torch_model(package_dir)`` when the recipe has one,
    else the recipe's ``_model`` (backbone + PaDiM head) with head constants of the manifest's
    shapes (zeros and identities: the same operations and sizes; timing only)."""
    recipe = package.manifest.lineage.get("recipe")
    if not recipe:
        return None
    path = root / recipe
    try:
        import torch  # noqa: PLC0415

        spec = importlib.util.spec_from_file_location("recipe_under_bench", path)
        if spec is None or spec.loader is None:
            return None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look themselves up there
        sys.path.insert(0, str(path.parent))
        spec.loader.exec_module(module)
        if hasattr(module, "torch_model"):
            model = module.torch_model(package.path).eval()
        else:
            g, _ = package.manifest.score.grid
            d = int(package.manifest.lineage["args"]["dim"])
            head = {"proj_w": np.zeros((d, 120, 1, 1)), "proj_b": np.zeros(d),
                    "mu": np.zeros((1, d, g, g)), "chol": np.tile(np.eye(d), (g * g, 1, 1))}
            model = module._model(package.manifest.input.height, head).eval()
            print(f"note: {package.label}: torch baseline = {recipe} _model with head "
                  "constants of the same shapes (timing only)")
    except Exception as exc:  # any failure: no torch column, with the reason
        print(f"note: no torch baseline for {package.label}: {type(exc).__name__}: {exc}")
        return None

    def run(x: np.ndarray) -> Any:
        with torch.inference_mode():
            return model(torch.from_numpy(x))

    return run


def released(x: np.ndarray) -> Any:
    """Stands in for a measured configuration whose backend was closed."""
    raise RuntimeError("this configuration's backend was released after measuring")


def backend_groups(package: Any, root: Path, batches: tuple[int, ...]
                   ) -> Iterator[list[Config]]:
    """One list of configurations (``batches``) per backend instance: every candidate × precision
    × threads, then PyTorch eager; each backend is built when its group is reached."""
    for prec in ("int8", "fp32"):
        for cand in candidates(package, "auto", prec):
            for threads in THREADS:
                try:
                    backend = build_backend(cand.kind, package.path / cand.artefact.path, prec,
                                            threads=threads)
                except ModelError as exc:
                    print(f"note: {cand.label}/{prec} threads {threads}: {exc}")
                    continue
                yield [Config(cand.label, prec, threads, b, backend.run) for b in batches]
    image = package.manifest.kind != "sensor"
    torch_run = torch_image(package, root) if image else torch_sensor(package)
    if torch_run is None:
        print(f"note: {package.label}: PyTorch eager baseline not available")
    else:
        for t in THREADS:
            yield [Config("torch", "fp32", t, b, torch_run, torch_threads(t)) for b in batches]


def configs_for(package: Any, root: Path, batches: tuple[int, ...] = BATCHES) -> list[Config]:
    """Every backend's configurations at once (all backends alive: for interleaving)."""
    return [c for group in backend_groups(package, root, batches) for c in group]


def measure(package: Any, configs: list[Config], reps: int, calls: int) -> None:
    golden = golden_inputs(package)
    inputs = {b: np.ascontiguousarray(np.resize(golden, (b, *golden.shape[1:])))
              for b in {c.batch for c in configs}}
    for cfg in configs:  # warm-up
        cfg.setup()
        for _ in range(3):
            cfg.run(inputs[cfg.batch])
    for _ in range(reps):
        for cfg in configs:
            cfg.setup()
            x = inputs[cfg.batch]
            for _ in range(calls):
                t0 = time.perf_counter()
                cfg.run(x)
                cfg.times.append(time.perf_counter() - t0)


def p50_window(cfg: Config) -> float:
    return float(np.median(cfg.times)) / cfg.batch


def report(package: Any, configs: list[Config]) -> None:
    print(f"\n{package.label} ({package.manifest.kind}); per window, interleaved "
          f"({len(configs[0].times) if configs else 0} calls per configuration)")
    print(f"{'backend':<16}{'prec':<6}{'thr':>4}{'batch':>6}{'p50 µs':>11}{'p99 µs':>11}"
          f"{'windows/s':>12}")
    for cfg in sorted(configs, key=lambda c: (c.batch, c.threads, p50_window(c))):
        t = np.asarray(cfg.times)
        print(f"{cfg.label:<16}{cfg.precision:<6}{cfg.threads:>4}{cfg.batch:>6}"
              f"{p50_window(cfg) * 1e6:>11.2f}{np.quantile(t, 0.99) / cfg.batch * 1e6:>11.2f}"
              f"{cfg.batch / np.median(t):>12.0f}")
    print("sizes:")
    for a in package.manifest.artefacts:
        print(f"  {a.path:<24}{a.runtime:<13}{a.precision:<6}{a.size_bytes:>10} B")


def artefact_bytes(package: Any, path: str) -> int:
    """Bytes of an artefact with every file it needs (an IR ``.xml`` and its ``.bin``)."""
    files = {path} | ({path[:-4] + ".bin"} if path.endswith(".xml") else set())
    return sum(a.size_bytes for a in package.manifest.artefacts if a.path in files)


def ratios(package: Any, configs: list[Config]) -> tuple[str, float, float, float]:
    """What auto-selection (:func:`agent.inference.select.select_backend`: fastest INT8
    candidate passing the golden check) picks, its batch-1 1-thread p50 speedups here, and its
    size (every file) over the ONNX FP32 artefact's."""
    one = {c.key: p50_window(c) for c in configs if c.batch == 1 and c.threads == 1}
    selection = select_backend(package, "auto", "int8")
    print(f"{package.label}: auto-selection: {selection.table()}")
    chosen = selection.chosen.candidate
    label = chosen.label
    int8 = one[f"{label}/int8"]
    vs_ort = one.get("onnxruntime/fp32", float("nan")) / int8
    vs_torch = one.get("torch/fp32", float("nan")) / int8
    fp32 = [a for a in package.manifest.artefacts
            if a.runtime == "onnxruntime" and a.precision == "fp32"]
    size_ratio = (artefact_bytes(package, chosen.artefact.path) / fp32[0].size_bytes
                  if fp32 else float("nan"))
    return f"{label}/int8", vs_ort, vs_torch, size_ratio


def head_to_head(student: Any, teacher: Any, root: Path, reps: int, calls: int
                 ) -> tuple[float, float]:
    """Batch-1, 1-thread p50 of the student's auto-selected INT8 backend against the teacher
    package on ONNX Runtime FP32 and in torch eager, the three interleaved (same load for all),
    each on its own package's first golden image (the student's input may be smaller).

    Returns:
        ``(teacher ORT FP32 / student, teacher torch / student)``; NaN where one is missing.
    """
    chosen = select_backend(student, "auto", "int8").chosen.candidate
    configs = [Config(f"student {chosen.label}", "int8", 1, 1, build_backend(
        chosen.kind, student.path / chosen.artefact.path, "int8", threads=1).run)]
    fp32 = candidates(teacher, "onnxruntime", "fp32")
    if fp32:
        configs.append(Config("patchcore ort", "fp32", 1, 1, build_backend(
            "onnxruntime", teacher.path / fp32[0].artefact.path, "fp32", threads=1).run))
    torch_run = torch_image(teacher, root)
    if torch_run is not None:
        configs.append(Config("patchcore torch", "fp32", 1, 1, torch_run, torch_threads(1)))
    # Each model gets its own golden image: a student may take a smaller input than the teacher.
    inputs = [golden_inputs(student)[:1]] + [golden_inputs(teacher)[:1]] * (len(configs) - 1)
    for cfg, golden in zip(configs, inputs, strict=True):
        cfg.setup()
        for _ in range(3):
            cfg.run(golden)
    for _ in range(reps):
        for cfg, golden in zip(configs, inputs, strict=True):
            cfg.setup()
            for _ in range(calls):
                t0 = time.perf_counter()
                cfg.run(golden)
                cfg.times.append(time.perf_counter() - t0)
    p50 = {c.label: float(np.median(c.times)) for c in configs}
    print(f"\nhead to head, batch 1, 1 thread, p50 ({reps * calls} calls each, interleaved): "
          + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in p50.items()))
    s = p50[configs[0].label]
    return (p50.get("patchcore ort", float("nan")) / s,
            p50.get("patchcore torch", float("nan")) / s)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    root = Path(__file__).resolve().parents[1]
    ap.add_argument("--models", type=Path, default=root / "models")
    ap.add_argument("--reps", type=int, default=30, help="round-robin repetitions")
    ap.add_argument("--calls", type=int, default=20, help="timed calls per config per rep")
    # Image models: 10 calls per turn, so the median is the steady state a camera stream sees.
    # With 3 calls per turn OpenVINO INT8's batch-1 p50 read 17.0 ms against 7.1 ms timed warm
    # by auto-selection in the same run: a third of the samples were the first call after a
    # switch, most likely with a cold cache (the previous configuration's bank evicted this one's).
    ap.add_argument("--image-reps", type=int, default=3, help="repetitions, image models")
    ap.add_argument("--image-calls", type=int, default=10, help="calls per rep, image models")
    args = ap.parse_args(argv)
    packages: list[Any] = []
    for mpath in sorted(args.models.glob("*/manifest.json")):
        obj = json.loads(mpath.read_text())
        try:
            if obj.get("kind") == "image":
                packages.append(load_image_package(mpath.parent))
            else:
                packages.append(load_package(mpath.parent))
        except (ModelError, ValueError) as exc:
            print(f"note: {mpath.parent.name} ({obj.get('kind')}) skipped: {exc}")
    results = {}
    for package in packages:
        image = package.manifest.kind == "image"
        if image:
            # Batches up to 8 interleaved over every backend; the largest batch one backend at a
            # time: a batch of 32 images holds 32 x 256 x bank distance matrices per session
            # (0.55 GB each for mtd-patchcore), and ten sessions alive at once took 19 GB.
            configs = configs_for(package, root, BATCHES[:-1])
            measure(package, configs, args.image_reps, args.image_calls)
            for group in backend_groups(package, root, BATCHES[-1:]):
                measure(package, group, args.image_reps, args.image_calls)
                for cfg in group:  # keep the timings, let the session go
                    cfg.run = released
                configs.extend(group)
                gc.collect()
        else:
            configs = configs_for(package, root)
            measure(package, configs, args.reps, args.calls)
        report(package, configs)
        res = ratios(package, configs)
        if package.manifest.kind not in results or package.manifest.name == "mtd-patchcore":
            results[package.manifest.kind] = res
        label, vs_ort, vs_torch, size = res
        print(f"{package.label}: selected {label}: batch-1 p50 speedup {vs_ort:.2f}x over ORT "
              f"FP32, {vs_torch:.2f}x over torch FP32; ONNX INT8/FP32 size {size:.2f}")
    if "image" in results:
        _, vs_ort, vs_torch, _ = results["image"]
    else:
        print("note: no image model package (manifest kind 'image') under "
              f"{args.models}: the figures below are the sensor model's")
        _, vs_ort, vs_torch, _ = results["sensor"]
    last = f"int8_vs_ort_fp32={vs_ort:.2f} int8_vs_torch={vs_torch:.2f}"
    named = {p.manifest.name: p for p in packages}
    if "mtd-student" in named and "mtd-patchcore" in named:
        s_ort, s_torch = head_to_head(named["mtd-student"], named["mtd-patchcore"], root,
                                      args.image_reps * 3, args.image_calls)
        last += (f" student_vs_patchcore_ort_fp32={s_ort:.2f}"
                 f" student_vs_patchcore_torch={s_torch:.2f}")
    print(last)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
