"""INT8 clipping and the FP32 saturation fallback, on the shipped package."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from agent.inference.package import load_package, open_backend, saturation_fallback
from agent.pipeline.detector import FeatureDeviationDetector

PACKAGE = Path(__file__).resolve().parents[2] / "models" / "skab-wstat"


def _windows(spec, rng: np.random.Generator, n: int) -> np.ndarray:  # type: ignore[no-untyped-def]
    return rng.normal(size=(n, spec.window, len(spec.channels))) * spec.scale_floor * 10 + 5


def test_shipped_int8_artefacts_record_their_input_range() -> None:
    pkg = load_package(PACKAGE)
    for art in pkg.manifest.artefacts:
        if art.precision == "int8":
            assert art.input_range is not None
            low, high = art.input_range
            assert low < -5 and high > 5  # covers normal scaled data with room to spare


def test_single_sample_spike_is_clipped_by_int8_and_caught_by_the_fallback() -> None:
    pkg = load_package(PACKAGE)
    spec = pkg.detector_spec()
    int8 = open_backend(pkg, "int8")
    fallback, input_range = saturation_fallback(pkg, pkg.artefact("onnxruntime", "int8"))
    assert fallback is not None and fallback.precision == "fp32"
    rng = np.random.default_rng(0)
    cal = rng.normal(size=(400, len(spec.channels))) * spec.scale_floor * 10 + 5
    spike = _windows(spec, rng, 1).astype(np.float32)
    spike[0, spec.window // 2, 2] += 1000 * spec.scale_floor[2] * 10  # one reading, 1000 stds
    plain = FeatureDeviationDetector(spec, int8)
    guarded = FeatureDeviationDetector(spec, int8, fallback=fallback, input_range=input_range)
    c_plain, c_guarded = plain.calibrate(cal), guarded.calibrate(cal)
    clipped = plain.score(spike, c_plain).scores[0]
    scored = guarded.score(spike, c_guarded)
    assert scored.scores[0] > 10 * c_guarded.threshold
    # INT8 alone clips the reading at its input range: it understates the deviation many times
    # (at W 10 it stayed below the threshold; in a shorter window the clipped value may cross it)
    assert clipped < scored.scores[0] / 5
    assert int(np.argmax(scored.contributions[0])) == 2
    assert guarded.fallback_windows == 1


def test_in_range_windows_never_use_the_fallback() -> None:
    pkg = load_package(PACKAGE)
    spec = pkg.detector_spec()
    fallback, input_range = saturation_fallback(pkg, pkg.artefact("onnxruntime", "int8"))
    det = FeatureDeviationDetector(spec, open_backend(pkg, "int8"), fallback=fallback,
                                   input_range=input_range)
    rng = np.random.default_rng(1)
    cal = det.calibrate(rng.normal(size=(400, len(spec.channels))) * spec.scale_floor * 10 + 5)
    det.score(_windows(spec, rng, 50).astype(np.float32), cal)
    assert det.fallback_windows == 0


def test_no_fallback_for_fp32_artefacts() -> None:
    pkg = load_package(PACKAGE)
    assert saturation_fallback(pkg, pkg.artefact("onnxruntime", "fp32")) == (None, None)


class _Counting:
    """Wraps a real backend and counts the windows it was given."""

    def __init__(self, inner) -> None:  # type: ignore[no-untyped-def]
        self.inner, self.windows = inner, 0
        self.name, self.precision = inner.name, inner.precision

    def run(self, windows: np.ndarray) -> np.ndarray:
        self.windows += windows.shape[0]
        return self.inner.run(windows)  # type: ignore[no-any-return]

    def close(self) -> None:
        self.inner.close()


def test_int8_backend_is_skipped_when_every_window_saturates() -> None:
    pkg = load_package(PACKAGE)
    spec = pkg.detector_spec()
    fallback, input_range = saturation_fallback(pkg, pkg.artefact("onnxruntime", "int8"))
    int8 = _Counting(open_backend(pkg, "int8"))
    det = FeatureDeviationDetector(spec, int8, fallback=fallback, input_range=input_range)
    ref = FeatureDeviationDetector(spec, open_backend(pkg, "int8"), fallback=fallback,
                                   input_range=input_range)
    rng = np.random.default_rng(2)
    cal_rows = rng.normal(size=(400, len(spec.channels))) * spec.scale_floor * 10 + 5
    cal = det.calibrate(cal_rows)
    cal_ref = ref.calibrate(cal_rows)
    int8.windows = 0
    spikes = _windows(spec, rng, 3).astype(np.float32)
    spikes[:, spec.window // 2, 2] += 1000 * spec.scale_floor[2] * 10
    scored = det.score(spikes, cal)
    assert int8.windows == 0 and det.fallback_windows == 3
    np.testing.assert_allclose(scored.scores, ref.score(spikes, cal_ref).scores, rtol=1e-6)
    mixed = np.concatenate([spikes[:1], _windows(spec, rng, 2).astype(np.float32)])
    det.score(mixed, cal)
    assert int8.windows == 3 and det.fallback_windows == 4  # one INT8 call, one more fallback
