"""The heatmap of a stream scored by OpenVINO is read from the package's OpenVINO IR
(agent.inference.patch_map_openvino), so ONNX Runtime is never loaded for it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent.errors import ModelError
from agent.inference.image_package import load_image_package
from agent.inference.openvino import OpenVinoBackend
from agent.inference.patch_map import PatchMapModel
from agent.inference.patch_map_openvino import OpenVinoPatchMap, map_nodes
from agent.pipeline.image import ImageSpec, normalise

ov = pytest.importorskip("openvino")

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "models" / "mtd-patchcore"


def _inputs(n: int) -> tuple[Any, list[Any]]:
    pkg = load_image_package(PACKAGE)
    inp = pkg.manifest.input
    spec = ImageSpec(inp.height, inp.width, inp.channels, tuple(inp.mean), tuple(inp.std))
    rng = np.random.default_rng(3)
    images = []
    for _ in range(n):
        img = np.full((inp.height, inp.width), 120, np.uint8)
        img += rng.integers(0, 12, img.shape, dtype=np.uint8)
        r, c = rng.integers(20, inp.height - 40, 2)
        img[r:r + 12, c:c + 12] = 0  # a dark flaw somewhere
        images.append(normalise(img, spec))
    return pkg, images


def test_the_map_is_the_int8_models_and_its_maximum_is_the_score() -> None:
    pkg, images = _inputs(3)
    art = next(a for a in pkg.manifest.artefacts if a.path.endswith(".xml"))
    backend = OpenVinoBackend(pkg.path / art.path, "int8")
    mapper = OpenVinoPatchMap(pkg)
    fp32 = PatchMapModel(pkg, precision="fp32")
    try:
        for x in images:
            score, cells = mapper.run(x)
            assert cells.shape == tuple(pkg.manifest.score.grid) and cells.dtype == np.float32
            assert score == pytest.approx(float(backend.run(x)[0]), rel=1e-4)
            assert float(cells.max()) == pytest.approx(score, rel=1e-5)
            _, ref = fp32.run(x)  # the FP32 map of the ONNX path: the same places light up
            assert np.corrcoef(cells.ravel(), ref.ravel())[0, 1] > 0.8
            assert np.unravel_index(cells.argmax(), cells.shape) == np.unravel_index(
                ref.argmax(), ref.shape)
    finally:
        backend.close()


def test_a_graph_without_a_patch_reduction_is_refused() -> None:
    param = ov.opset8.parameter([1, 4], np.float32)
    model = ov.Model([ov.opset8.relu(param)], [param])
    with pytest.raises(ModelError, match="not a ReduceMax"):
        map_nodes(model)


def test_the_heatmap_of_an_openvino_stream_loads_no_onnxruntime() -> None:
    code = (
        "import sys, numpy as np\n"
        "from pathlib import Path\n"
        "from agent.inference.image_package import load_image_package\n"
        "from agent.services.snapshots import _open_patch_map\n"
        f"pkg = load_image_package(Path({str(PACKAGE)!r}))\n"
        "m = _open_patch_map(pkg, 'openvino')\n"
        "s, cells = m.run(np.zeros((1, 1, 256, 256), np.float32))\n"
        "print(type(m).__name__, cells.shape, 'onnxruntime' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=ROOT, check=True).stdout.split()
    assert out == ["OpenVinoPatchMap", "(16,", "16)", "False"]
