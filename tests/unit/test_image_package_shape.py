"""An image package whose manifest input disagrees with its golden images is refused at load.

Frames are sized from ``manifest.input`` while the golden check runs the ``.npy``'s images, so
such a package passed every check and then failed every frame ("frame not scored").
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from agent.errors import ModelError
from agent.inference.image_package import load_image_package

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "mtd-patchcore" / "manifest.json"


def _package(root: Path, golden_shape: tuple[int, ...], height: int = 8, width: int = 8,
             channels: int = 1) -> Path:
    root.mkdir()
    art = root / "model.int8.onnx"
    art.write_bytes(b"not loaded by this test")
    np.save(root / "golden.npy", np.zeros(golden_shape, np.float32))
    m = json.loads(SHIPPED.read_text())
    m["input"] |= {"height": height, "width": width, "channels": channels,
                   "grayscale": channels == 1, "mean": [0.5] * channels,
                   "std": [0.5] * channels}
    m["artefacts"] = [{"runtime": "onnxruntime", "precision": "int8", "path": art.name,
                       "sha256": hashlib.sha256(art.read_bytes()).hexdigest(),
                       "size_bytes": art.stat().st_size}]
    m["golden"] |= {"inputs_sha256": hashlib.sha256((root / "golden.npy").read_bytes())
                    .hexdigest(), "outputs": [0.0] * golden_shape[0]}
    (root / "manifest.json").write_text(json.dumps(m))
    return root


def test_matching_package_loads(tmp_path: Path) -> None:
    pkg = load_image_package(_package(tmp_path / "p", (2, 1, 8, 8)))
    assert pkg.manifest.input.height == 8


@pytest.mark.parametrize(("shape", "kw"), [
    ((2, 1, 16, 16), {}),                      # manifest says 8x8, model takes 16x16
    ((2, 1, 8, 8), {"channels": 3}),           # manifest says colour, golden is grayscale
    ((1, 8, 8), {}),                           # not a batch of images
])
def test_manifest_input_disagreeing_with_golden_images_is_refused(
        tmp_path: Path, shape: tuple[int, ...], kw: dict[str, int]) -> None:
    with pytest.raises(ModelError, match="manifest and model disagree"):
        load_image_package(_package(tmp_path / "p", shape, **kw))


def test_golden_file_that_is_not_an_array_is_a_model_error(tmp_path: Path) -> None:
    root = _package(tmp_path / "p", (2, 1, 8, 8))
    (root / "golden.npy").write_bytes(b"garbage")
    m = json.loads((root / "manifest.json").read_text())
    m["golden"]["inputs_sha256"] = hashlib.sha256(b"garbage").hexdigest()
    (root / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ModelError, match="not a readable array"):
        load_image_package(root)
