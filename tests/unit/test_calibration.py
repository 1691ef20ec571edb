"""On-device calibration: scaler, feature statistics, threshold."""

from __future__ import annotations

import math

import numpy as np
import pytest

from agent.pipeline.calibration import fit_feature_stats, fit_scaler, fit_threshold


def test_fit_scaler_mean_and_std_match_numpy() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal([230.0, 5.0, -3.0], [2.0, 0.5, 0.01], size=(400, 3))
    s = fit_scaler(x, np.array([1e-6, 1e-6, 1e-6]))
    np.testing.assert_allclose(s.mean, x.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(s.scale, x.std(axis=0), rtol=1e-12)


def test_fit_scaler_floor_applies_per_channel() -> None:
    rng = np.random.default_rng(1)
    x = np.column_stack([rng.normal(0, 3.0, 500), np.full(500, 7.0), rng.normal(0, 0.01, 500)])
    floor = np.array([0.5, 0.2, 0.1])
    s = fit_scaler(x, floor)
    assert s.scale[0] == pytest.approx(x[:, 0].std())  # above the floor: untouched
    assert s.scale[1] == 0.2  # flat channel: exactly the floor
    assert s.scale[2] == 0.1  # below the floor: floored
    assert s.mean[1] == 7.0


@pytest.mark.parametrize(
    ("samples", "floor"),
    [
        (np.zeros((1, 2)), np.ones(2)),  # one sample
        (np.zeros((10, 3)), np.ones(2)),  # channel mismatch
        (np.zeros(10), np.ones(1)),  # 1-D
    ],
)
def test_fit_scaler_rejects_bad_shapes(samples: np.ndarray, floor: np.ndarray) -> None:
    with pytest.raises(ValueError, match="samples"):
        fit_scaler(samples, floor)


@pytest.mark.parametrize("bad", [0.0, -1.0])
def test_fit_scaler_rejects_non_positive_floor(bad: float) -> None:
    with pytest.raises(ValueError, match="floor"):
        fit_scaler(np.arange(10.0).reshape(5, 2), np.array([1.0, bad]))


def test_fit_feature_stats() -> None:
    rng = np.random.default_rng(2)
    f = np.column_stack([rng.normal(1.0, 2.0, 300), np.full(300, 4.0), rng.normal(0, 0.1, 300)])
    floor = np.array([0.0, 0.0, 0.5])
    st = fit_feature_stats(f, floor)
    np.testing.assert_allclose(st.mean, f.mean(axis=0), rtol=1e-12)
    assert st.std[0] == pytest.approx(f[:, 0].std(), rel=1e-9)
    assert 0 < st.std[1] <= 1e-8  # constant feature with zero floor: epsilon only, never 0
    assert st.std[2] == pytest.approx(0.5, rel=1e-8)  # floored


@pytest.mark.parametrize(
    ("features", "floor"),
    [(np.zeros((1, 3)), np.zeros(3)), (np.zeros((5, 3)), np.zeros(4)), (np.zeros(5), np.zeros(1))],
)
def test_fit_feature_stats_rejects_bad_shapes(features: np.ndarray, floor: np.ndarray) -> None:
    with pytest.raises(ValueError, match="features"):
        fit_feature_stats(features, floor)


def test_fit_threshold_quantile_and_factor() -> None:
    scores = np.arange(1.0, 101.0)  # 1..100
    assert fit_threshold(scores, 1.0, 1.5) == 150.0
    assert fit_threshold(scores, 0.5, 1.0) == pytest.approx(np.quantile(scores, 0.5))
    assert fit_threshold(scores, 0.99, 2.0) == pytest.approx(2 * np.quantile(scores, 0.99))
    # shuffled input gives the same threshold
    rng = np.random.default_rng(3)
    assert fit_threshold(rng.permutation(scores), 0.9, 1.2) == fit_threshold(scores, 0.9, 1.2)


@pytest.mark.parametrize(
    ("scores", "q", "factor"),
    [
        (np.zeros(0), 1.0, 1.0),
        (np.ones(3), 0.0, 1.0),
        (np.ones(3), -0.1, 1.0),
        (np.ones(3), 1.01, 1.0),
        (np.ones(3), math.nan, 1.0),
        (np.ones(3), 1.0, 0.0),
        (np.ones(3), 1.0, -2.0),
    ],
)
def test_fit_threshold_rejects_bad_input(scores: np.ndarray, q: float, factor: float) -> None:
    with pytest.raises(ValueError, match="bad threshold fit"):
        fit_threshold(scores, q, factor)
