"""Bounded per-channel level adaptation in the agent's streaming pipeline
(agent/pipeline/drift.py), against the model recipe's batch scoring that the grouped SKAB
selection rates (models/recipes/skab_detectors.py), on generated data."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from agent.pipeline.detector import DetectorSpec, FeatureDeviationDetector
from agent.pipeline.drift import LevelAdaptation, follow_level
from agent.pipeline.features import FEATURES, window_features
from agent.pipeline.rules import RuleParams
from agent.pipeline.stream import StreamPipeline
from agent.records import Float32Array

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "models" / "recipes"))

from skab_detectors import file_scores

C, W, N = 3, 10, 400
FLOOR = np.full(C, 0.05)
FFLOOR = np.full(3 * C, 0.05)


class NumpyBackend:
    """The model as NumPy: the reference window features (what the FP32 artefact computes)."""

    name = "numpy"
    precision = "fp32"

    def run(self, windows: Float32Array) -> Float32Array:
        return window_features(windows)

    def close(self) -> None:
        """Nothing to release."""


def _spec(holdout: float = 0.0, factor: float = 1.5, top_k: int = 2) -> DetectorSpec:
    return DetectorSpec(("a", "b", "c"), W, 1, N, FLOOR, len(FEATURES), top_k, FFLOOR, 1.0,
                        factor, holdout)


def _stream(x: np.ndarray, adaptation: LevelAdaptation | None, blocks: list[int] | None = None,
            holdout: float = 0.0) -> tuple[np.ndarray, float, StreamPipeline]:
    """Scores of the windows after calibration, the threshold and the pipeline."""
    spec = _spec(holdout)
    det = FeatureDeviationDetector(spec, NumpyBackend(), adaptation=adaptation)
    pipe = StreamPipeline("s", "d", spec, det, RuleParams())
    cuts = np.cumsum(blocks or [x.shape[0]])
    ts = np.arange(x.shape[0], dtype=np.float64)
    ends, scores = [], []
    for a, b in zip([0, *cuts[:-1]], cuts, strict=True):
        out = pipe.process_block(x[a:b], ts[a:b])
        assert out.calibration_outliers == 0
        ends.append(out.end_index + a)
        scores.append(out.scores)
    e, s = np.concatenate(ends), np.concatenate(scores)
    return s[e >= N], pipe.threshold, pipe


def _noise(rows: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(rows, C))


@pytest.mark.parametrize(("holdout", "rate", "bound"), [(0.0, 0.02, 3.0), (0.25, 0.005, 10.0)])
def test_streaming_equals_the_recipes_batch_scores(holdout: float, rate: float,
                                                   bound: float) -> None:
    x = _noise(1500, 3)
    x[400:, 0] += np.linspace(0.0, 2.5, 1100)  # a benign drift the baseline follows
    x[1100:1200, 2] += 3.0  # and a fault it must not
    batch = file_scores("wstat", x, N, W, 2, holdout, FLOOR, FFLOOR, adapt_rate=rate,
                        drift_bound=bound)
    # blocks of uneven sizes, cut inside the calibration and between windows
    streamed, thr, _ = _stream(x, LevelAdaptation(rate, bound), [123, 300, 7, 500, 570],
                               holdout=holdout)
    np.testing.assert_allclose(streamed, batch.test, rtol=1e-5, atol=1e-6)
    assert thr == pytest.approx(batch.base.max() * 1.5, rel=1e-6)
    assert ((streamed > thr) == (batch.test > batch.base.max() * 1.5)).all()
    # and the adaptation did something: the unadapted scores differ
    plain = file_scores("wstat", x, N, W, 2, holdout, FLOOR, FFLOOR).test
    assert np.abs(plain - batch.test).max() > 1.0


def test_normal_level_drift_is_followed() -> None:
    x = _noise(1600, 5)
    x[400:, 1] += np.linspace(0.0, 2.8, 1200)  # 2.8 sigma over 1,200 readings, within B = 3
    plain, thr, _ = _stream(x, None)
    adapted, thr_a, pipe = _stream(x, LevelAdaptation(0.02, 3.0))
    assert thr_a == thr  # the calibration is the same; only the scoring adapts
    assert (plain[-300:] > thr).mean() > 0.5  # unadapted, the drift is a false alarm
    assert (adapted[-300:] > thr).mean() < 0.05
    offset = pipe.level_offset
    assert offset is not None and 2.3 < offset[1] < 2.9 and abs(offset[0]) < 0.5


def test_a_slow_ramp_fault_is_followed_at_most_the_bound() -> None:
    x = _noise(2000, 7)
    x[400:, 0] += np.linspace(0.0, 12.0, 1600)  # a slow fault: 12 sigma over 1,600 readings
    adapted, thr, pipe = _stream(x, LevelAdaptation(0.02, 3.0))
    offset = pipe.level_offset
    assert offset is not None and offset[0] == pytest.approx(3.0)
    assert (adapted[-200:] > thr).all()  # past the bound, the fault scores as it grows
    wide, _, _ = _stream(x, LevelAdaptation(0.02, 10.0))
    assert adapted[-200:].mean() > wide[-200:].mean()


def test_a_new_calibration_starts_the_offset_from_zero() -> None:
    x = _noise(1200, 9)
    x[400:, 2] += np.linspace(0.0, 2.0, 800)
    _, _, pipe = _stream(x, LevelAdaptation(0.02, 3.0))
    first = pipe.level_offset
    assert first is not None and first[2] > 1.0
    det = FeatureDeviationDetector(_spec(), NumpyBackend(), adaptation=LevelAdaptation(0.02, 3.0))
    cal = det.calibrate(x[:N])
    pipe.swap(det, cal)
    pipe.process_block(x[:W + 1], np.arange(2000.0, 2000.0 + W + 1))
    again = pipe.level_offset
    assert again is not None and np.abs(again).max() < 0.1


def test_the_step_is_the_univariate_baseline_step() -> None:
    # the univariate pipeline's baseline update, written out: clip(mu + a (m - mu), lo, hi)
    for mu, m, lo, hi in [(1.0, 5.0, -3.0, 3.0), (0.0, -9.0, -3.0, 3.0), (2.0, 2.5, 0.0, 9.0)]:
        assert float(follow_level(mu, m, 0.1, lo, hi)) == min(max(mu + 0.1 * (m - mu), lo), hi)
