"""Backend contract, run over every artefact of the shipped model package."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from agent.errors import ModelError
from agent.inference.base import Backend
from agent.inference.package import ModelPackage, check_golden, load_package, open_backend
from agent.pipeline.features import window_features

pytest.importorskip("onnxruntime")

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "models" / "skab-wstat"


@pytest.fixture(scope="module")
def package() -> ModelPackage:
    return load_package(PACKAGE_DIR)


# every onnxruntime artefact the package ships, read from the manifest so a new one is covered
PRECISIONS = [
    a["precision"]
    for a in json.loads((PACKAGE_DIR / "manifest.json").read_text())["artefacts"]
    if a["runtime"] == "onnxruntime"
]


@pytest.fixture(scope="module", params=PRECISIONS)
def backend(request: pytest.FixtureRequest, package: ModelPackage) -> Iterator[Backend]:
    yield open_backend(package, request.param)


@pytest.fixture(scope="module")
def fp32(package: ModelPackage) -> Backend:
    return open_backend(package, "fp32")


def random_windows(package: ModelPackage, n: int, seed: int) -> np.ndarray:
    """Scaled windows like the calibration data: standard normal, clipped to ±6."""
    inp = package.manifest.input
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, inp.window, len(inp.channels)))
    return np.clip(x, -6, 6).astype(np.float32)


def test_package_has_int8_and_fp32() -> None:
    assert sorted(PRECISIONS) == ["fp32", "int8"]


def test_golden_vectors_pass(package: ModelPackage, backend: Backend) -> None:
    err = check_golden(package, backend)
    assert 0 <= err <= package.manifest.golden.atol
    assert backend.name == "onnxruntime"


def test_output_shape_and_dtype(package: ModelPackage, backend: Backend) -> None:
    x = random_windows(package, 5, seed=0)
    y = backend.run(x)
    c = len(package.manifest.input.channels)
    assert y.shape == (5, len(package.manifest.score.features) * c)
    assert y.dtype == np.float32
    assert np.isfinite(y).all()


def test_fp32_equals_numpy_reference(package: ModelPackage, fp32: Backend) -> None:
    rng = np.random.default_rng(1)
    x = random_windows(package, 2000, seed=1)
    # scaled windows also include offsets and larger spreads than N(0, 1)
    x2 = (x * rng.uniform(0.2, 3.0, size=(2000, 1, 1)) + rng.uniform(-3, 3, (2000, 1, 1)))
    for xs in (x, x2.astype(np.float32)):
        np.testing.assert_allclose(fp32.run(xs), window_features(xs), atol=1e-5, rtol=0)


def test_int8_agrees_with_fp32_within_golden_atol(package: ModelPackage, fp32: Backend) -> None:
    int8 = open_backend(package, "int8")
    x = random_windows(package, 5000, seed=2)
    err = np.abs(int8.run(x) - fp32.run(x))
    assert err.max() <= package.manifest.golden.atol
    # and INT8 is not secretly FP32: quantization leaves a visible error
    assert err.max() > 1e-4


def test_batch_sizes_give_identical_per_window_results(
    package: ModelPackage, backend: Backend
) -> None:
    x = random_windows(package, 256, seed=3)
    full = backend.run(x)
    np.testing.assert_array_equal(np.concatenate([backend.run(x[i : i + 1])
                                                  for i in range(256)]), full)
    np.testing.assert_array_equal(np.concatenate([backend.run(x[i : i + 7])
                                                  for i in range(0, 256, 7)]), full)


def test_wrong_input_shape_raises_model_error(package: ModelPackage, backend: Backend) -> None:
    inp = package.manifest.input
    with pytest.raises(ModelError, match="inference failed"):
        backend.run(np.zeros((2, inp.window + 1, len(inp.channels)), np.float32))
