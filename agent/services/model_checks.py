"""Checks a candidate model passes on this device before it scores live: acceptance and shadow.

Acceptance (:func:`acceptance_test`), in the updater's thread: the package's ONNX Runtime INT8
artefact loads and reproduces its golden outputs within the manifest's tolerance
(:func:`agent.inference.package.open_backend`), and the p99 latency of one window over ``runs``
calls stays within ``latency_budget_ms_p99 × factor``.

Shadow (:class:`ShadowRun`), in the pipeline's thread: for the next N scored windows of the
stream, the candidate scores the same raw windows beside the active model, each with its own
calibration fitted on the same calibration samples. :meth:`ShadowRun.verdict` then compares

* alert rate (fraction of windows above the model's own threshold): the candidate's must be at
  most ``max(active rate, rate_floor) × max_alert_rate_ratio``;
* score distribution: median and p95 of the candidate's scores over the active model's, both
  within ``[1 / max_score_shift, max_score_shift]``.

The post-swap watch is a :class:`ShadowRun` the other way round: the new model is active and the
previous one scores beside it; :meth:`ShadowRun.watch_verdict` compares the new model's alert
rate with the previous model's over the same windows (a real fault makes both alert, so it is
not mistaken for a regression).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from agent.errors import ModelError
from agent.inference.base import Backend
from agent.inference.package import ModelPackage, open_backend
from agent.pipeline.detector import Calibration, FeatureDeviationDetector
from agent.records import Float32Array, FloatArray


@dataclass(frozen=True, slots=True)
class Limits:
    """Regression limits of the shadow run and the post-swap watch.

    Attributes:
        max_alert_rate_ratio: Candidate alert rate over the reference rate, at most.
        max_score_shift: Median and p95 score ratios within ``[1/x, x]``.
        rate_floor: Reference alert rate used when the real one is lower (a model that never
            alerted must not make one alert a regression).
    """

    max_alert_rate_ratio: float
    max_score_shift: float
    rate_floor: float


def acceptance_test(
    package: ModelPackage,
    runs: int = 200,
    factor: float = 1.0,
    clock: Callable[[], float] = time.perf_counter,
    attempts: int = 3,
) -> tuple[Backend, dict[str, float]]:
    """Open the INT8 backend (golden check included) and measure its p99 latency per window.

    A p99 over the budget is measured again, up to ``attempts`` measurements in all, before the
    model is refused: one scheduling stall on a busy gateway (a single 8 ms call among 20 of
    0.1 ms) is the p99 of a short run, and a good model must not be rejected for the machine's
    other work. Refused only when every measurement exceeds the budget.

    Args:
        package: A verified package.
        runs: Timed single-window inferences per measurement (after one warm-up call).
        factor: The p99 must be ≤ ``latency_budget_ms_p99 × factor``.
        clock: Seconds, for the timing.
        attempts: Measurements at most (≥ 1).

    Returns:
        The opened backend and details (``p99_ms``: the accepted measurement, ``budget_ms``,
        ``measurements``: how many were taken, 1 to ``attempts``).

    Raises:
        ModelError: no artefact, it does not load, golden outputs differ, or too slow in every
            measurement.
    """
    backend = open_backend(package, "int8")
    window = np.asarray(package.manifest.golden.inputs[:1], dtype=np.float32)
    backend.run(window)
    budget_ms = package.manifest.latency_budget_ms_p99 * factor

    def p99() -> float:
        times = np.empty(runs)
        for i in range(runs):
            t0 = clock()
            backend.run(window)
            times[i] = clock() - t0
        return float(np.quantile(times, 0.99) * 1e3)

    seen = [p99()]
    while seen[-1] > budget_ms and len(seen) < max(1, attempts):
        seen.append(p99())
    p99_ms, measurements = seen[-1], len(seen)
    if p99_ms > budget_ms:
        figures = ", then ".join(f"{x:.4g} ms" for x in seen)
        raise ModelError(
            f"p99 latency {figures}, over {runs} runs each, exceeds the budget "
            f"{budget_ms:.4g} ms", model=package.label,
        )
    return backend, {"p99_ms": p99_ms, "budget_ms": budget_ms,
                     "measurements": float(measurements)}


def alert_rate(scores: FloatArray, threshold: float) -> float:
    """Fraction of ``scores`` above ``threshold`` (0 for none).

    >>> alert_rate(np.array([1.0, 3.0, 5.0, 0.5]), 2.0)
    0.5
    """
    return float(np.mean(scores > threshold)) if scores.size else 0.0


class ShadowRun:
    """Collect the scores of ``n_windows`` live windows (a :class:`BatchObserver`).

    Args:
        n_windows: Windows to collect.
        candidate: The detector and calibration scoring beside the active model (the
            candidate in shadow mode; the previous model in the post-swap watch).

    Attributes:
        done: Set once ``n_windows`` were collected or the candidate failed.
        error: The candidate's :class:`ModelError`, if it failed.
    """

    def __init__(
        self,
        n_windows: int,
        candidate: tuple[FeatureDeviationDetector, Calibration] | None = None,
    ) -> None:
        self.n_windows = n_windows
        self._candidate = candidate
        self.active = np.empty(n_windows)
        self.shadow = np.empty(n_windows if candidate is not None else 0)
        self.active_threshold = np.nan
        self.shadow_threshold = candidate[1].threshold if candidate is not None else np.nan
        self.count = 0
        self.done = threading.Event()
        self.error: ModelError | None = None

    def observe(self, windows: Float32Array, scores: FloatArray, threshold: float) -> None:
        """Record one scored batch (pipeline thread)."""
        if self.done.is_set():
            return
        take = min(self.n_windows - self.count, scores.shape[0])
        sl = slice(self.count, self.count + take)
        if self._candidate is not None:
            detector, calibration = self._candidate
            try:
                self.shadow[sl] = detector.score(windows[:take], calibration).scores
            except ModelError as exc:
                self.error = exc
                self.done.set()
                return
        self.active[sl] = scores[:take]
        self.active_threshold = threshold
        self.count += take
        if self.count >= self.n_windows:
            self.done.set()

    def release(self) -> None:
        """Drop the candidate reference (the run is over)."""
        self._candidate = None

    def verdict(self, limits: Limits) -> tuple[str | None, dict[str, float]]:
        """Compare candidate and active over the collected windows.

        Returns:
            (None when within the limits, else the reason; details for the status report).
        """
        if self.error is not None:
            return f"candidate failed in shadow mode: {self.error}", {}
        n = self.count
        act, cand = self.active[:n], self.shadow[:n]
        rate_a = alert_rate(act, self.active_threshold)
        rate_c = alert_rate(cand, self.shadow_threshold)
        details = {"windows": float(n), "active_alert_rate": rate_a, "shadow_alert_rate": rate_c}
        allowed = max(rate_a, limits.rate_floor) * limits.max_alert_rate_ratio
        if rate_c > allowed:
            return (f"shadow alert rate {rate_c:.4f} > allowed {allowed:.4f} (active "
                    f"{rate_a:.4f})"), details
        for name, q in (("median", 0.5), ("p95", 0.95)):
            a, c = float(np.quantile(act, q)), float(np.quantile(cand, q))
            ratio = c / a if a > 0 else (1.0 if c <= 0 else np.inf)
            details[f"{name}_ratio"] = ratio
            if not 1.0 / limits.max_score_shift <= ratio <= limits.max_score_shift:
                return (f"shadow {name} score ratio {ratio:.3f} outside "
                        f"1/{limits.max_score_shift:g}..{limits.max_score_shift:g}"), details
        return None, details

    def watch_verdict(self, limits: Limits) -> tuple[str | None, dict[str, float]]:
        """Post-swap watch (active = the new model, shadow = the previous one).

        Returns:
            (None or the reason, details). A failure of the previous model is no verdict.
        """
        n = self.count
        rate = alert_rate(self.active[:n], self.active_threshold)
        details = {"windows": float(n), "alert_rate": rate}
        if self.error is not None or self.shadow.size == 0:
            return None, details
        reference = alert_rate(self.shadow[:n], self.shadow_threshold)
        details["previous_alert_rate"] = reference
        allowed = max(reference, limits.rate_floor) * limits.max_alert_rate_ratio
        if rate > allowed:
            return (f"alert rate after the swap {rate:.4f} > allowed {allowed:.4f} (previous "
                    f"model on the same windows {reference:.4f})"), details
        return None, details
