"""A package carrying a cloud-fitted calibration: manifest field, loader check, Agent start-up."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent.app import Agent
from agent.config.loader import parse_config
from agent.errors import ModelError
from agent.inference.package import MANIFEST, load_package
from agent.metrics import Metrics
from agent.pipeline.detector import FeatureDeviationDetector
from agent.pipeline.rules import RuleParams
from agent.pipeline.stream import StreamPipeline
from agent.systemd import Notifier
from cloud_sync.calibration import fit_calibration, window_features
from cloud_sync.manifest import Manifest

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "skab-wstat"
_SPEC = json.loads((SHIPPED / MANIFEST).read_text())
#: The shipped package's window and top-k, which a calibration for it is fitted with.
WINDOW, TOP_K = int(_SPEC["input"]["window"]), int(_SPEC["score"]["top_k"])


def _fitted(c: int, seed: int = 0) -> tuple[np.ndarray, dict[str, Any]]:
    rng = np.random.default_rng(seed)
    samples = rng.normal(size=(400, c)) * np.arange(1, c + 1) + 10.0
    fit = fit_calibration(
        samples, window_features, window=WINDOW, scale_floor=np.full(c, 0.01),
        feature_std_floor=np.full(3 * c, 0.01), top_k=TOP_K, quantile=1.0, factor=1.5,
    )
    cal = {
        "mean": fit.scaler.mean.tolist(), "scale": fit.scaler.scale.tolist(),
        "feature_mean": fit.features.mean.tolist(), "feature_std": fit.features.std.tolist(),
        "threshold": fit.threshold,
        "fitted_on": {"device_id": "gw1", "stream": "demo", "samples": 400},
    }
    return samples, cal


@pytest.fixture
def pkg(tmp_path: Path) -> Path:
    dst = tmp_path / "pkg"
    shutil.copytree(SHIPPED, dst)
    return dst


def _set_calibration(pkg: Path, cal: dict[str, Any] | None) -> None:
    m = json.loads((pkg / MANIFEST).read_text())
    m["calibration"] = cal
    (pkg / MANIFEST).write_text(json.dumps(m, indent=1))


def test_shipped_manifest_without_calibration_still_parses(pkg: Path) -> None:
    p = load_package(pkg)
    assert p.manifest.calibration is None
    assert p.preset_calibration() is None


def test_preset_calibration_round_trips(pkg: Path) -> None:
    _, cal = _fitted(8)
    _set_calibration(pkg, cal)
    preset = load_package(pkg).preset_calibration()
    assert preset is not None
    np.testing.assert_array_equal(preset.scaler.mean, cal["mean"])
    np.testing.assert_array_equal(preset.scaler.scale, cal["scale"])
    np.testing.assert_array_equal(preset.features.std, cal["feature_std"])
    assert preset.threshold == cal["threshold"]


def test_calibration_with_wrong_lengths_is_refused(pkg: Path) -> None:
    _, cal = _fitted(8)
    cal["feature_mean"] = cal["feature_mean"][:-1]
    _set_calibration(pkg, cal)
    with pytest.raises(ModelError, match="calibration"):
        load_package(pkg)


def test_unknown_calibration_key_is_refused() -> None:
    m = json.loads((SHIPPED / MANIFEST).read_text())
    _, cal = _fitted(8)
    cal["extra"] = 1
    m["calibration"] = cal
    with pytest.raises(ValueError, match="extra"):
        Manifest.model_validate(m)


class _NumpyBackend:
    name, precision = "numpy", "fp32"

    def run(self, windows: np.ndarray) -> np.ndarray:
        return window_features(windows)


def test_pipeline_with_preset_scores_from_the_first_window(pkg: Path) -> None:
    samples, cal = _fitted(8)
    _set_calibration(pkg, cal)
    package = load_package(pkg)
    spec = package.detector_spec()
    det = FeatureDeviationDetector(spec, _NumpyBackend())
    preset = package.preset_calibration()
    pipe = StreamPipeline("demo", "gw1", spec, det, RuleParams(), calibration=preset)
    out = pipe.process_block(samples[:50], np.arange(50.0))
    assert not np.isnan(out.scores).any()
    assert out.threshold == cal["threshold"]
    assert preset is not None
    first = det.score(samples[None, :WINDOW].astype(np.float32), preset).scores
    np.testing.assert_allclose(first, out.scores[:1])


def _agent(tmp_path: Path, pkg: Path, device: str) -> Agent:
    text = "\n".join([
        "[agent]", f'device_id = "{device}"', f'state_dir = "{tmp_path / "state"}"',
        "console_alerts = false",
        "[[streams]]", 'name = "demo"', f'model = "{pkg}"',
        "[streams.source]", 'kind = "simulator"',
    ]) + "\n"
    return Agent(parse_config(text, env={}), Metrics(), console=None, notifier=Notifier(""))


@pytest.mark.parametrize(("device", "calibrating"), [("gw1", False), ("gw2", True)])
def test_agent_uses_the_package_calibration_only_on_its_device(
    tmp_path: Path, pkg: Path, device: str, calibrating: bool
) -> None:
    _, cal = _fitted(8)
    _set_calibration(pkg, cal)
    agent = _agent(tmp_path, pkg, device)
    try:
        pipeline = agent.streams["demo"].pipeline
        assert pipeline.calibrating is calibrating
        if not calibrating:
            assert pipeline.threshold == cal["threshold"]
    finally:
        agent.shutdown()
