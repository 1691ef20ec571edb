"""The detector side of a univariate stream: its parameters, scale floor and calibration.

A one-channel package (a ``univariate`` manifest section, :class:`cloud_sync.manifest.
UnivariateSpec`) is scored by a :class:`UnivariateDetector`, which a
:class:`~agent.pipeline.univariate.UnivariatePipeline` runs (gaps, adaptation, explanations).

* **Scale floor.** σ_cal = max(manifest floor, ``scale_floor_rel`` × |median|, the smallest
  nonzero step between calibration samples) (:func:`univariate_floor`): a channel that was flat
  while calibrating (a quantized sensor) does not turn one quantum into an alarm.
* **Robust adaptive score** (``threshold_sigma`` set, packages from ``univariate-wstat@3``):
  the calibration's feature statistics are the robust baseline's start (median and robust std
  of the calibration windows' features, :mod:`agent.pipeline.robust`) and the threshold is
  ``threshold_sigma`` robust sigmas. Without it, the calibration-quantile threshold of
  :class:`~agent.pipeline.detector.FeatureDeviationDetector`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from agent.inference.base import Backend
from agent.pipeline.detector import Calibration, DetectorSpec, FeatureDeviationDetector
from agent.pipeline.drift import LevelAdaptation
from agent.pipeline.robust import RobustParams, RobustState, robust_scores, robust_stats
from agent.records import Float32Array, FloatArray
from cloud_sync.calibration import FeatureStats, sliding_windows


@dataclass(frozen=True, slots=True)
class UnivariateParams:
    """Gap, adaptation and score parameters of a univariate stream (this module's and
    :mod:`agent.pipeline.univariate`'s docstrings); validated by
    :class:`cloud_sync.manifest.UnivariateSpec`."""

    gap_factor: float = 5.0
    scale_floor_rel: float = 1e-3
    adapt_rate: float = 0.01
    adapt_below: float = 0.5
    drift_bound: float = 3.0
    #: The robust adaptive score's threshold in robust sigmas; None = the calibration-quantile
    #: score of packages before ``univariate-wstat@3``.
    threshold_sigma: float | None = None
    scale_rate: float = 0.01
    clip: float = 3.0
    scale_bound: float = 4.0

    @property
    def robust(self) -> RobustParams | None:
        """The robust baseline's parameters, None without ``threshold_sigma``."""
        if self.threshold_sigma is None:
            return None
        return RobustParams(self.adapt_rate, self.scale_rate, self.clip, self.drift_bound,
                            self.scale_bound)


def univariate_floor(samples: FloatArray, floor: float, rel: float) -> float:
    """σ floor of one channel: max(``floor``, ``rel`` × |median|, smallest nonzero step).

    Args:
        samples: Shape ``(N, 1)`` or ``(N,)``, the calibration samples, channel units.

    >>> univariate_floor(np.array([20.0, 20.0, 20.5, 20.0]), 1e-9, 1e-3)
    0.5
    """
    x = np.asarray(samples, np.float64).ravel()
    steps = np.abs(np.diff(x))
    steps = steps[steps > 0]
    quantum = float(steps.min()) if steps.size else 0.0
    return max(floor, rel * abs(float(np.median(x))) if x.size else 0.0, quantum)

class UnivariateDetector(FeatureDeviationDetector):
    """A one-channel :class:`FeatureDeviationDetector` whose scale floor is
    :func:`univariate_floor` of the calibration samples.

    Raises:
        ValueError: the spec has more than one channel.
    """

    def __init__(self, spec: DetectorSpec, backend: Backend, params: UnivariateParams,
                 max_batch: int = 256, *, fallback: Backend | None = None,
                 input_range: tuple[float, float] | None = None) -> None:
        if len(spec.channels) != 1:
            raise ValueError(f"a univariate detector has one channel, got {spec.channels}")
        super().__init__(spec, backend, max_batch, fallback=fallback, input_range=input_range)
        self.params = params

    def calibrate(self, samples: FloatArray) -> Calibration:
        """As :meth:`FeatureDeviationDetector.calibrate`, with the univariate scale floor.

        With ``threshold_sigma`` the feature statistics are the robust baseline's start
        (:func:`agent.pipeline.robust.robust_stats` of the calibration windows' features), the
        threshold is ``threshold_sigma`` and ``scores`` are the calibration windows' robust
        scores against that start.
        """
        floor = univariate_floor(samples, float(self.spec.scale_floor[0]),
                                 self.params.scale_floor_rel)
        base = self.spec
        robust, t = self.params.robust, self.params.threshold_sigma
        # the robust score's threshold is fixed: no hold-out base to fit
        self.spec = replace(base, scale_floor=np.array([floor]),
                            threshold_holdout=base.threshold_holdout if t is None else 0.0)
        try:
            fit = super().calibrate(samples)
        finally:
            self.spec = base
        if robust is None or t is None:
            return fit
        windows = sliding_windows(np.asarray(samples, np.float64), base.window)
        feats = self._run(fit.scaler.apply(windows))
        centre, scale = robust_stats(feats, base.feature_std_floor)
        frozen = replace(robust, adapt_rate=0.0, scale_rate=0.0)
        scores = robust_scores(feats, RobustState.start(centre, scale), frozen, base.top_k)[0]
        return replace(fit, features=FeatureStats(centre, scale), threshold=float(t),
                       scores=scores)

    def features(self, windows: Float32Array, calibration: Calibration) -> FloatArray:
        """Features ``(K, F)`` of raw windows ``(K, W, 1)`` scaled with ``calibration``."""
        return self._run(calibration.scaler.apply(windows))


def build_detector(spec: DetectorSpec, backend: Backend, params: UnivariateParams | None, *,
                   fallback: Backend | None = None,
                   input_range: tuple[float, float] | None = None,
                   adaptation: LevelAdaptation | None = None) -> FeatureDeviationDetector:
    """The detector of a package: a :class:`UnivariateDetector` when it has univariate
    ``params`` (a one-channel package), else a :class:`FeatureDeviationDetector` with the
    package's per-channel level ``adaptation`` (None: off). Used by the composition root, the
    benchmarks and model updates, so a swapped-in model keeps its floors and its adaptation.

    Raises:
        ValueError: ``params`` given for a multichannel ``spec``, or both ``params`` and
            ``adaptation`` (a univariate stream adapts its baseline itself).
    """
    if params is None:
        return FeatureDeviationDetector(spec, backend, fallback=fallback,
                                        input_range=input_range, adaptation=adaptation)
    if adaptation is not None:
        raise ValueError("a univariate package adapts with its 'univariate' section")
    return UnivariateDetector(spec, backend, params, fallback=fallback, input_range=input_range)
