"""FeatureDeviationDetector with a NumPy fake backend (the reference window features)."""

from __future__ import annotations

import numpy as np
import pytest

from agent.inference.base import Backend
from agent.pipeline.calibration import fit_scaler
from agent.pipeline.detector import DetectorSpec, FeatureDeviationDetector
from agent.pipeline.features import FEATURES, window_features
from agent.records import Float32Array

CHANNELS = ("voltage", "current", "temp")
LEVELS = np.array([230.0, 5.0, 40.0])
NOISE = np.array([1.0, 0.1, 0.5])


class NumpyBackend:
    """The model as NumPy: ``window_features``. Records batch sizes it was called with."""

    name = "numpy"
    precision = "fp32"

    def __init__(self) -> None:
        self.batches: list[int] = []

    def run(self, windows: Float32Array) -> Float32Array:
        assert windows.dtype == np.float32 and windows.ndim == 3
        self.batches.append(windows.shape[0])
        return window_features(windows)


def make_spec(
    window: int = 10, hop: int = 1, calibration_samples: int = 400, top_k: int = 2,
    quantile: float = 1.0, factor: float = 1.5,
) -> DetectorSpec:
    c = len(CHANNELS)
    return DetectorSpec(
        channels=CHANNELS,
        window=window,
        hop=hop,
        calibration_samples=calibration_samples,
        scale_floor=NOISE / 10,
        n_features=len(FEATURES),
        top_k=top_k,
        feature_std_floor=np.full(len(FEATURES) * c, 0.02),
        threshold_quantile=quantile,
        threshold_factor=factor,
    )


def noise(n: int, seed: int) -> np.ndarray:
    """Stationary readings ``(n, C)``: channel levels plus Gaussian noise."""
    return np.random.default_rng(seed).normal(LEVELS, NOISE, size=(n, len(CHANNELS)))


def windows_of(x: np.ndarray, w: int) -> np.ndarray:
    idx = np.arange(x.shape[0] - w + 1)[:, None] + np.arange(w)[None, :]
    return x[idx].astype(np.float32)


def reference_scores(spec: DetectorSpec, cal: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Score definition written out independently (loops, sorted), for windows of ``x``."""
    mu, sd = cal.mean(0), np.maximum(cal.std(0), spec.scale_floor)
    f_cal = window_features(((windows_of(cal, spec.window) - mu) / sd).astype(np.float32))
    f_mu = f_cal.astype(np.float64).mean(0)
    f_sd = np.maximum(f_cal.astype(np.float64).std(0), spec.feature_std_floor) + 1e-9
    f = window_features(((windows_of(x, spec.window) - mu) / sd).astype(np.float32))
    out = []
    for row in f.astype(np.float64):
        z = sorted(abs((row - f_mu) / f_sd), reverse=True)
        out.append(sum(z[: spec.top_k]) / spec.top_k)
    return np.array(out)


def test_fake_backend_satisfies_the_protocol() -> None:
    backend: Backend = NumpyBackend()
    assert backend.run(np.zeros((2, 10, 3), np.float32)).shape == (2, 9)


def test_calibrate_fits_scaler_features_and_threshold() -> None:
    spec = make_spec()
    det = FeatureDeviationDetector(spec, NumpyBackend())
    x = noise(spec.calibration_samples, seed=0)
    cal = det.calibrate(x)
    want = fit_scaler(x, spec.scale_floor)
    np.testing.assert_array_equal(cal.scaler.mean, want.mean)
    np.testing.assert_array_equal(cal.scaler.scale, want.scale)
    assert cal.scores.shape == (spec.calibration_samples - spec.window + 1,)
    np.testing.assert_allclose(cal.scores, reference_scores(spec, x, x), rtol=1e-9)
    assert cal.threshold == pytest.approx(cal.scores.max() * 1.5)
    assert cal.features.mean.shape == cal.features.std.shape == (9,)


def test_threshold_quantile_and_factor_from_spec() -> None:
    spec = make_spec(quantile=0.9, factor=2.0)
    cal = FeatureDeviationDetector(spec, NumpyBackend()).calibrate(noise(400, seed=1))
    assert cal.threshold == pytest.approx(2.0 * np.quantile(cal.scores, 0.9))


def test_score_matches_independent_reference() -> None:
    spec = make_spec()
    det = FeatureDeviationDetector(spec, NumpyBackend())
    cal_x = noise(400, seed=2)
    cal = det.calibrate(cal_x)
    x = noise(300, seed=3)
    x[150:, 1] += 0.5  # a step, so some scores are large
    got = det.score(windows_of(x, spec.window), cal)
    np.testing.assert_allclose(got.scores, reference_scores(spec, cal_x, x), rtol=1e-9)
    assert got.contributions.shape == (x.shape[0] - spec.window + 1, len(CHANNELS))
    np.testing.assert_allclose(got.contributions.sum(axis=1), 1.0, rtol=1e-12)
    assert np.all(got.contributions >= 0)


def test_scoring_the_calibration_windows_reproduces_calibration_scores() -> None:
    spec = make_spec()
    det = FeatureDeviationDetector(spec, NumpyBackend())
    x = noise(400, seed=4)
    cal = det.calibrate(x)
    again = det.score(windows_of(x, spec.window), cal)
    np.testing.assert_allclose(again.scores, cal.scores, rtol=1e-12)
    assert again.scores.max() < cal.threshold


@pytest.mark.parametrize("channel", [0, 1, 2])
def test_step_in_one_channel_is_its_top_contributor(channel: int) -> None:
    spec = make_spec()
    det = FeatureDeviationDetector(spec, NumpyBackend())
    cal = det.calibrate(noise(400, seed=5))
    x = noise(40, seed=6)
    x[20:, channel] += 6 * NOISE[channel]
    got = det.score(windows_of(x, spec.window)[15:], cal)
    assert np.all(got.scores > cal.threshold)
    assert np.all(np.argmax(got.contributions, axis=1) == channel)


def test_batch_size_does_not_change_results() -> None:
    spec = make_spec()
    small, big = NumpyBackend(), NumpyBackend()
    d_small = FeatureDeviationDetector(spec, small, max_batch=7)
    d_big = FeatureDeviationDetector(spec, big, max_batch=256)
    x = noise(400, seed=7)
    c1, c2 = d_small.calibrate(x), d_big.calibrate(x)
    np.testing.assert_array_equal(c1.scores, c2.scores)
    assert c1.threshold == c2.threshold
    w = windows_of(noise(100, seed=8), spec.window)
    s1, s2 = d_small.score(w, c1), d_big.score(w, c2)
    np.testing.assert_array_equal(s1.scores, s2.scores)
    np.testing.assert_array_equal(s1.contributions, s2.contributions)
    assert max(small.batches) == 7
    assert sum(small.batches) == sum(big.batches)


def test_score_of_no_windows_is_empty() -> None:
    spec = make_spec()
    det = FeatureDeviationDetector(spec, NumpyBackend())
    cal = det.calibrate(noise(400, seed=9))
    got = det.score(np.zeros((0, spec.window, 3), np.float32), cal)
    assert got.scores.shape == (0,)
    assert got.contributions.shape == (0, 3)


@pytest.mark.parametrize("n", [5, 10])
def test_calibrate_needs_more_than_a_window(n: int) -> None:
    det = FeatureDeviationDetector(make_spec(window=10), NumpyBackend())
    with pytest.raises(ValueError, match="at least 11 samples"):
        det.calibrate(noise(n, seed=0))


def test_calibrate_rejects_channel_mismatch() -> None:
    det = FeatureDeviationDetector(make_spec(), NumpyBackend())
    with pytest.raises(ValueError):
        det.calibrate(np.zeros((50, 2)))
