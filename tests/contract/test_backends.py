"""Backend contract, run over every installed runtime on every artefact it can run.

The cases come from the shipped package's manifest (:func:`agent.inference.select.candidates`
with every runtime assumed installed), so a new artefact or runtime is covered without editing
this file. A runtime that is not installed is skipped with the reason, except under CI (env
``CI`` set), where the runtimes that ``.ci/run`` installs are required.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from agent.errors import ModelError
from agent.inference.base import Backend
from agent.inference.package import ModelPackage, check_golden, load_package, open_backend
from agent.inference.registry import build_backend, installed
from agent.inference.select import Candidate, candidates
from agent.pipeline.features import window_features

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "models" / "skab-wstat"
#: What .ci/run installs (the test extra plus the openvino and litert extras).
CI_REQUIRED = ("onnxruntime", "openvino", "litert")

_PKG = load_package(PACKAGE_DIR)
CASES = [c for prec in ("int8", "fp32")
         for c in candidates(_PKG, "auto", prec, is_installed=lambda k: True)]


def _id(c: Candidate) -> str:
    return f"{c.label}-{c.precision}"


def _require(kind: str) -> None:
    if installed(kind):
        return
    if os.environ.get("CI") and kind in CI_REQUIRED:
        pytest.fail(f"{kind} must be installed in CI (.ci/run installs it)")
    pytest.skip(f"{kind} is not installed (pip install 'edge-anomaly-agent[{kind}]')")


@pytest.fixture(scope="module")
def package() -> ModelPackage:
    return _PKG


@pytest.fixture(scope="module", params=CASES, ids=_id)
def case(request: pytest.FixtureRequest, package: ModelPackage) -> Iterator[
        tuple[Candidate, Backend]]:
    cand: Candidate = request.param
    _require(cand.kind)
    yield cand, build_backend(cand.kind, package.path / cand.artefact.path, cand.precision)


@pytest.fixture(scope="module")
def fp32(package: ModelPackage) -> Backend:
    return open_backend(package, "fp32")


def random_windows(package: ModelPackage, n: int, seed: int) -> np.ndarray:
    """Scaled windows like the calibration data: standard normal, clipped to ±4."""
    inp = package.manifest.input
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, inp.window, len(inp.channels)))
    return np.clip(x, -4, 4).astype(np.float32)


def test_package_has_an_artefact_for_every_runtime_and_precision() -> None:
    have = {(c.label, c.precision) for c in CASES}
    assert {("onnxruntime", "int8"), ("onnxruntime", "fp32"), ("openvino", "int8"),
            ("openvino-onnx", "int8"), ("openvino-onnx", "fp32"), ("litert", "int8")} <= have


def test_golden_vectors_pass(package: ModelPackage, case: tuple[Candidate, Backend]) -> None:
    cand, backend = case
    err = check_golden(package, backend)
    assert 0 <= err <= package.manifest.golden.atol
    assert (backend.name, backend.precision) == (cand.kind, cand.precision)


def test_output_shape_and_dtype(package: ModelPackage, case: tuple[Candidate, Backend]) -> None:
    _, backend = case
    x = random_windows(package, 5, seed=0)
    y = backend.run(x)
    c = len(package.manifest.input.channels)
    assert y.shape == (5, len(package.manifest.score.features) * c)
    assert y.dtype == np.float32
    assert np.isfinite(y).all()


def test_same_results_as_onnxruntime_fp32_within_golden_atol(
    package: ModelPackage, case: tuple[Candidate, Backend], fp32: Backend
) -> None:
    cand, backend = case
    x = random_windows(package, 5000, seed=2)
    err = np.abs(backend.run(x) - fp32.run(x))
    if cand.precision == "fp32":
        assert err.max() <= 1e-5
    else:
        # on these synthetic windows (wider than the calibration data) a full-integer TFLite
        # model requantizes its concatenated output on one scale: allow one more output step
        # for the rare worst window, but not for the bulk
        atol = package.manifest.golden.atol
        assert np.quantile(err, 0.9999) <= atol
        assert err.max() <= 1.5 * atol
        assert err.max() > 1e-4  # and INT8 is not secretly FP32: quantization shows


def test_fp32_equals_numpy_reference(
    package: ModelPackage, case: tuple[Candidate, Backend]
) -> None:
    cand, backend = case
    if cand.precision != "fp32":
        pytest.skip("exactness is an FP32 property")
    rng = np.random.default_rng(1)
    x = random_windows(package, 2000, seed=1)
    # scaled windows also include offsets and larger spreads than N(0, 1)
    x2 = (x * rng.uniform(0.2, 3.0, size=(2000, 1, 1)) + rng.uniform(-3, 3, (2000, 1, 1)))
    for xs in (x, x2.astype(np.float32)):
        np.testing.assert_allclose(backend.run(xs), window_features(xs), atol=1e-5, rtol=0)


def test_batch_sizes_give_the_same_per_window_results(
    package: ModelPackage, case: tuple[Candidate, Backend]
) -> None:
    _, backend = case
    x = random_windows(package, 256, seed=3)
    full = backend.run(x)
    ones = np.concatenate([backend.run(x[i : i + 1]) for i in range(256)])
    sevens = np.concatenate([backend.run(x[i : i + 7]) for i in range(0, 256, 7)])
    np.testing.assert_allclose(ones, full, atol=1e-6, rtol=0)
    np.testing.assert_allclose(sevens, full, atol=1e-6, rtol=0)


def test_wrong_input_shape_raises_model_error(
    package: ModelPackage, case: tuple[Candidate, Backend]
) -> None:
    _, backend = case
    inp = package.manifest.input
    with pytest.raises(ModelError, match="inference failed"):
        backend.run(np.zeros((2, inp.window + 1, len(inp.channels)), np.float32))


def test_open_backend_by_runtime(package: ModelPackage) -> None:
    _require("openvino")
    b = open_backend(package, "int8", runtime="openvino")
    assert (b.name, b.precision) == ("openvino", "int8")
    assert str(getattr(b, "path", "")).endswith(".xml")  # its own IR before the ONNX file


def test_openvino_caches_compiled_models(package: ModelPackage, tmp_path: Path) -> None:
    _require("openvino")
    cache = tmp_path / "openvino-cache"
    art = package.artefact("openvino", "int8")
    b = build_backend("openvino", package.path / art.path, "int8", cache_dir=cache)
    check_golden(package, b)
    assert any(cache.iterdir())
    again = build_backend("openvino", package.path / art.path, "int8", cache_dir=cache)
    check_golden(package, again)
