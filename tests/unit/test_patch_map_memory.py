"""What the patch-map model keeps in memory (agent.inference.patch_map, onnx_wire): a session
without ONNX Runtime's CPU arena and memory patterns, no graph kept after loading, no ``onnx``
import (the graph edited on the wire, as the onnx package would), the same map as a session
with the default options, and one model per package for every camera."""

from __future__ import annotations

import doctest
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent.inference import onnx_wire, patch_map
from agent.inference.image_package import load_image_package
from agent.inference.patch_map import (
    PatchMapModel,
    map_outputs,
    release_free_heap,
    session_options,
)
from agent.metrics import Metrics
from agent.pipeline.image import ImageSpec, normalise
from agent.records import Frame
from agent.services.snapshots import SnapshotConfig, SnapshotJob, SnapshotWorker
from agent.store.sqlite import Store
from tests.unit.test_store import make_alert

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("PIL.Image")

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "models" / "mtd-patchcore"


def _input(seed: int = 0) -> tuple[Any, Any]:
    pkg = load_image_package(PACKAGE)
    inp = pkg.manifest.input
    spec = ImageSpec(inp.height, inp.width, inp.channels, tuple(inp.mean), tuple(inp.std))
    rng = np.random.default_rng(seed)
    shape = (inp.height, inp.width) if inp.channels == 1 else (inp.height, inp.width, 3)
    return pkg, normalise(rng.integers(0, 256, shape, dtype=np.uint8), spec)


def test_session_options_turn_off_the_arena_and_memory_patterns() -> None:
    opts = session_options(ort, 2)
    assert opts.enable_cpu_mem_arena is False and opts.enable_mem_pattern is False
    assert (opts.intra_op_num_threads, opts.inter_op_num_threads) == (2, 1)


def test_the_model_keeps_no_graph_bytes_and_runs_with_those_options() -> None:
    pkg, _ = _input()
    model = PatchMapModel(pkg)
    assert not any(isinstance(v, (bytes, bytearray, memoryview)) for v in vars(model).values())
    used = model._session.get_session_options()
    assert used.enable_cpu_mem_arena is False and used.enable_mem_pattern is False


def test_opening_the_model_does_not_import_the_onnx_package() -> None:
    code = ("import sys; from pathlib import Path; "
            "from agent.inference.image_package import load_image_package; "
            "from agent.inference.patch_map import PatchMapModel; "
            f"PatchMapModel(load_image_package(Path({str(PACKAGE)!r}))); "
            "print('onnx' in sys.modules)")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"


def test_the_wire_edit_reads_and_exposes_the_graph_as_the_onnx_package_does() -> None:
    path = PACKAGE / "model.int8.onnx"
    model = onnx.load(str(path))
    graph = onnx_wire.read_graph(path.read_bytes())
    assert [(n.op_type, list(n.input), list(n.output)) for n in model.graph.node] == \
        [(n.op_type, n.input, n.output) for n in graph.node]
    assert [o.name for o in model.graph.output] == [o.name for o in graph.output]
    names = [n for n in map_outputs(graph) if n is not None]
    for name in names:
        model.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
    edited = onnx.load_from_string(onnx_wire.with_outputs(path.read_bytes(), names))
    assert edited == model


def test_the_map_is_the_same_as_with_the_default_session_options(
        monkeypatch: pytest.MonkeyPatch) -> None:
    pkg, x = _input(seed=3)
    score, lean = PatchMapModel(pkg).run(x)

    def defaults(ort_module: Any, threads: int) -> Any:
        opts = ort_module.SessionOptions()
        opts.intra_op_num_threads = threads
        return opts

    monkeypatch.setattr(patch_map, "session_options", defaults)
    ref_score, ref = PatchMapModel(pkg).run(x)
    assert score == ref_score
    assert lean.shape == ref.shape and np.array_equal(lean, ref)


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                    reason="malloc_trim is glibc's")
def test_free_heap_is_released_on_glibc() -> None:
    assert release_free_heap() is True


def test_cameras_of_one_model_share_one_patch_map_model(tmp_path: Path) -> None:
    pkg, _ = _input()
    opened: list[str] = []

    def opener(package: Any, runtime: str) -> PatchMapModel:
        opened.append(package.label)
        return PatchMapModel(package)

    inp = pkg.manifest.input
    spec = ImageSpec(inp.height, inp.width, inp.channels, tuple(inp.mean), tuple(inp.std))
    shape = (inp.height, inp.width) if inp.channels == 1 else (inp.height, inp.width, 3)
    image = np.full(shape, 128, np.uint8)
    with Store(tmp_path / "s.db") as store:
        worker = SnapshotWorker(SnapshotConfig(), store, Metrics(), open_patch_map=opener)
        for i, stream in enumerate(("cam0", "cam1", "cam2", "cam3"), start=1):
            alert = make_alert(i, stream=stream)
            store.add_alert(alert)
            assert worker.process(SnapshotJob(alert, Frame(stream, 1_700_000_000.0 + i, image),
                                              pkg, spec))
            snap = store.snapshot(alert.alert_id)
            assert snap is not None and snap.heatmap is not None
    assert opened == [pkg.label]


def test_onnx_wire_doctests() -> None:
    assert doctest.testmod(onnx_wire, raise_on_error=True).attempted > 0
