"""Held-out threshold base (cloud_sync.calibration.holdout_scores): package, detector, restore."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from agent.inference.package import load_package, open_backend
from agent.pipeline.detector import FeatureDeviationDetector
from agent.pipeline.restore import calibration_key, package_sha256
from cloud_sync.calibration import fit_calibration, holdout_scores, window_features
from cloud_sync.manifest import Manifest

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "models" / "skab-wstat"


def _drifting(n: int = 400, c: int = 3, seed: int = 0) -> np.ndarray:
    """Normal noise whose level creeps up over the last quarter (slow drift of normal operation)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, c))
    x[3 * n // 4:] += np.linspace(0.0, 2.5, n - 3 * n // 4)[:, None]
    return x


def _fit(x: np.ndarray, holdout: float) -> float:
    c = x.shape[1]
    return fit_calibration(x, window_features, window=10, scale_floor=np.full(c, 0.05),
                           feature_std_floor=np.full(3 * c, 0.01), top_k=2, quantile=1.0,
                           factor=1.0, holdout=holdout).threshold


def test_holdout_threshold_covers_drift_the_in_sample_fit_absorbs() -> None:
    """The in-sample fit sees the drift in its own statistics; held out, the drift scores as it
    will on later rows, so the threshold is higher."""
    x = _drifting()
    assert _fit(x, 0.25) > 1.2 * _fit(x, 0.0)


def test_holdout_scores_are_the_out_of_sample_windows() -> None:
    x = _drifting(n=200)
    s = holdout_scores(x, window_features, window=10, scale_floor=np.full(3, 0.05),
                       feature_std_floor=np.full(9, 0.01), top_k=2, holdout=0.25)
    assert s.shape == (200 - 150 - 10 + 1,)
    assert np.isfinite(s).all()


@pytest.mark.parametrize("holdout", [-0.1, 0.95])
def test_holdout_outside_its_range_is_refused(holdout: float) -> None:
    with pytest.raises(ValueError, match="hold-out"):
        _fit(_drifting(), holdout)


def test_holdout_leaving_too_few_rows_is_refused() -> None:
    with pytest.raises(ValueError, match="too few"):
        _fit(_drifting(n=30), 0.5)


def test_manifest_bounds_the_holdout() -> None:
    raw = json.loads((SHIPPED / "manifest.json").read_text())
    raw["score"]["threshold"]["holdout"] = 0.25
    assert Manifest.model_validate(raw).score.threshold.holdout == 0.25
    raw["score"]["threshold"]["holdout"] = 1.0
    with pytest.raises(ValueError, match="holdout"):
        Manifest.model_validate(raw)


def test_package_holdout_reaches_the_device_calibration(tmp_path: Path) -> None:
    """A package whose threshold has a hold-out calibrates the device with it: the threshold is
    the held-out scores' maximum × factor."""
    pkg = tmp_path / "pkg"
    shutil.copytree(SHIPPED, pkg)
    raw = json.loads((pkg / "manifest.json").read_text())
    raw["score"]["threshold"]["holdout"] = 0.25
    (pkg / "manifest.json").write_text(json.dumps(raw))
    package = load_package(pkg)
    spec = package.detector_spec()
    assert spec.threshold_holdout == 0.25
    detector = FeatureDeviationDetector(spec, open_backend(package, "fp32"))
    x = _drifting(c=len(spec.channels), seed=3) * spec.scale_floor * 20 + 1.0
    cal = detector.calibrate(x)
    held = cal.scores
    assert held.shape == (400 - 300 - spec.window + 1,)
    assert cal.threshold == pytest.approx(held.max() * spec.threshold_factor)


def test_packages_without_holdout_keep_their_hash_and_calibration_key(tmp_path: Path) -> None:
    """The field's default leaves the package hash and the calibration key of a package built
    before it (such as ``skab-wstat@1``) unchanged, so its stored calibrations are still
    restored after an upgrade."""
    pkg = tmp_path / "before-holdout"
    shutil.copytree(SHIPPED, pkg)
    raw = json.loads((pkg / "manifest.json").read_text())
    del raw["score"]["threshold"]["holdout"]
    (pkg / "manifest.json").write_text(json.dumps(raw))
    package = load_package(pkg)
    m = package.manifest
    assert m.score.threshold.holdout == 0.0
    data = m.model_dump(mode="json")
    del data["score"]["threshold"]["holdout"]
    assert data["score"].pop("adaptation") is None  # a later field, also left out at its default
    old = hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":"))
                         .encode()).hexdigest()
    assert package_sha256(m) == old
    key = calibration_key(m, package.detector_spec(), "int8")
    assert "threshold_holdout" not in key.spec
