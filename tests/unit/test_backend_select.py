"""Backend auto-selection with fake backends of controlled speed and correctness."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from agent.errors import BackendUnavailable, ModelError
from agent.inference.base import Backend
from agent.inference.package import ModelPackage, load_package
from agent.inference.select import Candidate, candidates, record_selection, select_backend
from agent.metrics import Metrics
from agent.records import Float32Array
from cloud_sync.manifest import Artefact

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "models" / "skab-wstat"


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class _Fake:
    """Returns the golden outputs (plus ``error``) and takes ``cost`` seconds of fake time."""

    def __init__(self, name: str, precision: str, cost: float, golden: np.ndarray,
                 clock: _Clock, error: float = 0.0) -> None:
        self.name, self.precision = name, precision
        self.cost, self.error, self._clock = cost, error, clock
        self._golden = golden
        self.calls = 0
        self.closed = False

    def run(self, windows: Float32Array) -> Float32Array:
        self.calls += 1
        self._clock.t += self.cost
        n = windows.shape[0]
        return (self._golden[:n] + self.error).astype(np.float32)

    def close(self) -> None:
        self.closed = True


def _art(runtime: str, precision: str = "int8", path: str = "m") -> Artefact:
    return Artefact(runtime=runtime, precision=precision, path=path, sha256="0" * 64,
                    size_bytes=1)


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> ModelPackage:
    """The shipped package with every runtime's artefact entry added (files are copies)."""
    d = tmp_path_factory.mktemp("pkg")
    for f in PACKAGE_DIR.iterdir():
        shutil.copy(f, d / f.name)
    m = json.loads((d / "manifest.json").read_text())
    onnx_int8 = next(a for a in m["artefacts"]
                     if a["runtime"] == "onnxruntime" and a["precision"] == "int8")
    have = {(a["runtime"], a["precision"]) for a in m["artefacts"]}
    for runtime, suffix in (("openvino", ".xml"), ("openvino", ".bin"), ("litert", ".tflite")):
        if (runtime, "int8") in have and suffix != ".bin":
            continue
        name = f"fake.int8{suffix}"
        shutil.copy(d / onnx_int8["path"], d / name)
        m["artefacts"].append({**onnx_int8, "runtime": runtime, "path": name})
    (d / "manifest.json").write_text(json.dumps(m))
    return load_package(d)


def _select(package: ModelPackage, speeds: dict[str, float], errors: dict[str, float],
            unavailable: tuple[str, ...] = (), **kw: object):  # type: ignore[no-untyped-def]
    clock = _Clock()
    golden = np.asarray(package.manifest.golden.outputs, np.float32)
    opened: dict[str, _Fake] = {}

    def opener(pkg: ModelPackage, cand: Candidate) -> Backend:
        if cand.label in unavailable:
            raise BackendUnavailable(f"{cand.kind} is not installed")
        b = _Fake(cand.kind, cand.precision, speeds[cand.label], golden, clock,
                  errors.get(cand.label, 0.0))
        opened[cand.label] = b
        return b

    sel = select_backend(package, opener=opener, is_installed=lambda k: True, clock=clock,
                         runs=20, warmup=3, **kw)  # type: ignore[arg-type]
    return sel, opened


SPEEDS = {"onnxruntime": 3e-5, "openvino": 2e-5, "openvino-onnx": 4e-5, "litert": 1e-5}


def test_candidates_cover_every_runtime_and_openvino_on_onnx(package: ModelPackage) -> None:
    labels = [c.label for c in candidates(package, is_installed=lambda k: True)]
    assert sorted(labels) == ["litert", "onnxruntime", "openvino", "openvino-onnx"]
    assert all(not c.artefact.path.endswith(".bin")
               for c in candidates(package, is_installed=lambda k: True))
    only = candidates(package, is_installed=lambda k: k == "onnxruntime")
    assert [c.label for c in only] == ["onnxruntime"]


def test_the_fastest_passing_backend_wins(package: ModelPackage) -> None:
    sel, opened = _select(package, SPEEDS, {})
    assert sel.chosen.candidate.label == "litert"
    assert [t.candidate.label for t in sel.passing] == [
        "litert", "openvino", "onnxruntime", "openvino-onnx"]
    assert sel.chosen.p50_s == pytest.approx(1e-5)
    # warm-up first, then the timed runs, plus the golden check
    assert opened["litert"].calls == 1 + 3 + 20
    assert [b.name for b in sel.backends] == ["litert", "openvino", "onnxruntime", "openvino"]


def test_a_failing_golden_check_is_never_selected(package: ModelPackage) -> None:
    atol = package.manifest.golden.atol
    sel, _ = _select(package, SPEEDS, {"litert": 2 * atol, "openvino": 1.01 * atol})
    assert sel.chosen.candidate.label == "onnxruntime"
    failed = {t.candidate.label: t.error for t in sel.trials if t.error is not None}
    assert set(failed) == {"litert", "openvino"}
    assert all("golden" in e for e in failed.values())
    assert all(t.candidate.label not in failed for t in sel.passing)
    assert "litert/int8 failed: golden" in sel.table()


def test_an_unavailable_runtime_is_skipped(package: ModelPackage) -> None:
    sel, _ = _select(package, SPEEDS, {}, unavailable=("litert",))
    assert sel.chosen.candidate.label == "openvino"
    assert any(t.error and "not installed" in t.error for t in sel.trials)


def test_none_passing_raises_with_every_reason(package: ModelPackage) -> None:
    atol = package.manifest.golden.atol
    sel, _ = _select(package, SPEEDS, dict.fromkeys(SPEEDS, 3 * atol))
    with pytest.raises(ModelError, match="no backend passed") as exc:
        _ = sel.chosen
    for label in SPEEDS:
        assert f"{label}/int8" in str(exc.value)


def test_a_fixed_backend_tries_only_that_runtime(package: ModelPackage) -> None:
    sel, opened = _select(package, SPEEDS, {}, backend="onnxruntime")
    assert sel.chosen.candidate.label == "onnxruntime"
    assert set(opened) == {"onnxruntime"}
    sel, opened = _select(package, SPEEDS, {}, backend="openvino")
    assert [t.candidate.label for t in sel.trials] == ["openvino", "openvino-onnx"]


def test_a_fixed_backend_not_installed_names_the_extra(package: ModelPackage) -> None:
    with pytest.raises(BackendUnavailable, match=r"edge-anomaly-agent\[openvino\]"):
        candidates(package, "openvino", is_installed=lambda k: k == "onnxruntime")


def test_fp32_has_no_litert_artefact(package: ModelPackage) -> None:
    labels = [c.label for c in candidates(package, precision="fp32",
                                          is_installed=lambda k: True)]
    assert "litert" not in labels
    assert "onnxruntime" in labels
    with pytest.raises(ModelError, match="no fp32 artefact that litert can run"):
        candidates(package, "litert", "fp32", is_installed=lambda k: True)


def test_record_selection_sets_the_metrics(package: ModelPackage) -> None:
    sel, _ = _select(package, SPEEDS, {"openvino": 1.0})
    m = Metrics(CollectorRegistry())
    record_selection(m, "pump1", sel)
    reg = m.registry
    labels = {"stream": "pump1", "precision": "int8"}
    assert reg.get_sample_value("edge_agent_backend_selected",
                                {**labels, "backend": "litert"}) == 1
    assert reg.get_sample_value("edge_agent_backend_selected",
                                {**labels, "backend": "onnxruntime"}) == 0
    assert reg.get_sample_value("edge_agent_backend_selected",
                                {**labels, "backend": "openvino"}) == 0
    assert reg.get_sample_value("edge_agent_backend_benchmark_seconds",
                                {**labels, "backend": "onnxruntime"}) == pytest.approx(3e-5)
    assert reg.get_sample_value("edge_agent_backend_benchmark_seconds",
                                {**labels, "backend": "openvino"}) is None


def test_candidate_labels() -> None:
    assert Candidate("openvino", _art("onnxruntime")).label == "openvino-onnx"
    assert Candidate("openvino", _art("openvino")).label == "openvino"
    assert Candidate("litert", _art("litert")).precision == "int8"
