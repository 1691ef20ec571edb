"""The latency budget: deadline misses, and a fixed degrade order on a sustained breach.

Each package states ``latency_budget_ms_p99``, the p99 budget of one window's inference. The
:class:`DeadlineGuard` wraps a stream's backend, times every call (per window = call time /
batch size), counts every window over the budget in ``edge_agent_deadline_miss_total{stream}``
and feeds :class:`DegradePolicy`, which is pure (no clock, no I/O) and decides the level:

====  ====================  ==========================================================
0     normal                every window scored on the selected backend
1     ``skip_windows``      score every k-th window only (effective hop × k): less load;
                            each score counts k times in the alert rules (same alarm delay)
2     ``fallback_backend``  also switch to the next fastest backend of the selection
====  ====================  ==========================================================

The fallback backend may be given unopened (``fallback``: a callable that opens it): it is then
opened, on the stream's thread, the first time level 2 is reached, so a stream that never needs
it never loads its runtime (one runtime's libraries are tens of MB resident). When it fails to
open, the guard logs one WARNING and stays at level 1 from then on.

Breach: the p99 of the last ``window`` (200) per-window latencies is above the budget; the level
goes up one step and the estimate starts afresh (the next step needs another full window of
evidence). Recovery: the p99 stays at or below ``recover_ratio`` × budget for
``recover_windows`` consecutive windows; the level goes down one step. Each change is an ops
event: one WARNING (up) or INFO (down) log line and ``edge_agent_degraded{stream,level}``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from agent.inference.base import Backend
from agent.records import Float32Array

log = logging.getLogger("agent.inference")

#: Degrade level names, by level (the ``level`` label of ``edge_agent_degraded``).
LEVELS = ("normal", "skip_windows", "fallback_backend")


@dataclass(frozen=True, slots=True)
class DegradeParams:
    """Settings of :class:`DegradePolicy`.

    Attributes:
        budget_s: p99 budget of one window, seconds.
        window: Latest per-window latencies the p99 is taken over.
        quantile: 0.99.
        skip_factor: k: at level ≥ 1 every k-th window is scored.
        recover_ratio: Recovery needs the p99 at or below this × the budget ...
        recover_windows: ... for this many consecutive windows.
        max_level: Highest level (1 when there is no fallback backend).
    """

    budget_s: float
    window: int = 200
    quantile: float = 0.99
    skip_factor: int = 2
    recover_ratio: float = 0.8
    recover_windows: int = 1000
    max_level: int = 2


class DegradePolicy:
    """Decide the degrade level from per-window latencies (pure: no clock, no I/O).

    Args:
        params: Budget and thresholds.

    >>> p = DegradePolicy(DegradeParams(budget_s=0.01, window=4, recover_windows=8))
    >>> [p.observe(0.02) for _ in range(4)]
    [None, None, None, 1]
    >>> p.observe(0.001, n=4), p.observe(0.001, n=4), p.level
    (None, 0, 0)
    """

    def __init__(self, params: DegradeParams) -> None:
        if params.window < 1 or params.skip_factor < 2 or params.budget_s <= 0:
            raise ValueError(f"invalid degrade params {params}")
        self.params = params
        self.level = 0
        self._buf = np.empty(params.window)
        self._count = 0
        self._good = 0

    def _reset(self) -> None:
        self._count = 0
        self._good = 0

    def p99(self) -> float | None:
        """The current estimate over the last ``window`` latencies (None until full)."""
        w = self.params.window
        if self._count < w:
            return None
        # np.quantile's default (linear) method from the two order statistics around the
        # virtual index q * (w - 1), found by np.partition: the same value, without the full
        # sort and the overhead np.quantile has on every scored window
        pos = self.params.quantile * (w - 1)
        lo = int(pos)
        hi = min(lo + 1, w - 1)
        part = np.partition(self._buf, (lo, hi))
        a, b = float(part[lo]), float(part[hi])
        t = pos - lo
        return a + (b - a) * t if t < 0.5 else b - (b - a) * (1.0 - t)

    def observe(self, latency_s: float, n: int = 1) -> int | None:
        """Record ``n`` windows that took ``latency_s`` seconds each.

        Returns:
            The new level when it changed, else None.
        """
        w = self.params.window
        for i in range(min(n, w)):
            self._buf[(self._count + i) % w] = latency_s
        self._count += n
        p99 = self.p99()
        if p99 is None:
            return None
        pm = self.params
        if p99 > pm.budget_s:
            self._good = 0
            if self.level < pm.max_level:
                self.level += 1
                self._reset()
                return self.level
            return None
        if p99 <= pm.budget_s * pm.recover_ratio:
            self._good += n
            if self.level > 0 and self._good >= pm.recover_windows:
                self.level -= 1
                self._reset()
                return self.level
        else:
            self._good = 0
        return None

    def stride(self) -> int:
        """Score every k-th window: k at level ≥ 1, else 1."""
        return self.params.skip_factor if self.level >= 1 else 1


class DeadlineGuard:
    """A :class:`~agent.inference.base.Backend` that enforces the latency budget.

    Args:
        stream: Stream name (metrics, logs).
        backends: The selection's passing backends, fastest first (the first one runs; the
            second is the fallback of level 2).
        params: Degrade settings (``max_level`` is lowered to 1 without a fallback).
        metrics: :class:`agent.metrics.Metrics` (``deadline_miss_total``, ``degraded``).
        on_stride: Called with k when the stride changes (the stream raises its hop × k).
        clock: Seconds, monotonic.
        fallback: Opens the fallback of level 2 when ``backends`` holds one backend only:
            called once, the first time level 2 is reached (None: no fallback). When it raises
            (:class:`~agent.errors.ModelError`, or any error of the runtime's own) the guard
            logs it and stops at level 1.
    """

    def __init__(
        self,
        stream: str,
        backends: Sequence[Backend],
        params: DegradeParams,
        metrics: Any,
        on_stride: Callable[[int], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
        fallback: Callable[[], Backend] | None = None,
    ) -> None:
        if not backends:
            raise ValueError("DeadlineGuard needs at least one backend")
        self._backends = list(backends)
        self._open_fallback = fallback if len(self._backends) < 2 else None
        if not self.has_fallback and params.max_level > 1:
            params = DegradeParams(**{**_asdict(params), "max_level": 1})
        self.stream = stream
        self.policy = DegradePolicy(params)
        self._metrics = metrics
        self.on_stride = on_stride
        self._clock = clock
        self._current = self._backends[0]
        #: The runtime and precision in force (they change with the fallback backend).
        self.name = self._current.name
        self.precision = self._current.precision
        self._lock = threading.Lock()
        self._misses = metrics.deadline_miss_total.labels(stream=stream)
        for name in LEVELS[1:]:
            metrics.degraded.labels(stream=stream, level=name).set(0)

    @property
    def level(self) -> int:
        """The degrade level in force."""
        return self.policy.level

    @property
    def has_fallback(self) -> bool:
        """Whether level 2 has a backend to switch to (opened or still to open)."""
        return len(self._backends) > 1 or self._open_fallback is not None

    @property
    def fallback_opened(self) -> bool:
        """Whether the fallback backend is loaded (False until level 2 first needs it)."""
        return len(self._backends) > 1

    def run(self, windows: Float32Array) -> Float32Array:
        """Run on the backend in force, time it and apply the policy's decision."""
        backend = self._current
        t0 = self._clock()
        out = backend.run(windows)
        n = max(1, int(windows.shape[0]))
        per_window = (self._clock() - t0) / n
        if per_window > self.policy.params.budget_s:
            self._misses.inc(n)
        with self._lock:
            before = self.policy.level
            change = self.policy.observe(per_window, n)
            if change is not None and change >= 2 and not self._ensure_fallback():
                change = None if before == 1 else 1
            if change is not None:
                self._apply(before, change)
        return out

    def _ensure_fallback(self) -> bool:
        """Open the fallback if it is still unopened (under the lock); False when there is
        none: the policy is then capped at level 1 for good."""
        if len(self._backends) > 1:
            return True
        opener, self._open_fallback = self._open_fallback, None
        error: Exception | None = None
        if opener is not None:
            t0 = time.perf_counter()
            try:
                self._backends.append(opener())
            # ModelError (BackendUnavailable included), OSError, or a runtime's own class
            # (OpenVINO raises RuntimeError outside its wrapped calls): the primary still
            # works, so the stream must not fail here nor stay at level 2 without a backend
            except Exception as exc:
                error = exc
            else:
                log.info("stream %s: fallback backend %s/%s opened in %.0f ms", self.stream,
                         self._backends[1].name, self._backends[1].precision,
                         (time.perf_counter() - t0) * 1e3, extra={"stream": self.stream})
                return True
        log.warning("stream %s: the fallback backend cannot be opened (%s); staying at level 1 "
                    "%s", self.stream, error, LEVELS[1], extra={"stream": self.stream})
        self.policy.params = DegradeParams(**{**_asdict(self.policy.params), "max_level": 1})
        self.policy.level = 1
        return False

    def close(self) -> None:
        """Close every backend (the one in force and the fallback)."""
        for backend in self._backends:
            backend.close()

    def _apply(self, before: int, level: int) -> None:
        pm = self.policy.params
        self._current = self._backends[1] if level >= 2 else self._backends[0]
        self.name, self.precision = self._current.name, self._current.precision
        for i, name in enumerate(LEVELS[1:], start=1):
            self._metrics.degraded.labels(stream=self.stream, level=name).set(int(level >= i))
        if self.on_stride is not None:
            self.on_stride(self.policy.stride())
        what = (f"scoring 1 window in {pm.skip_factor}" if level >= 1
                else "scoring every window")
        what += f" on {self._current.name}/{self._current.precision}"
        if level > before:
            log.warning("stream %s: latency budget %.3g ms (p99 over %d windows) breached: "
                        "degraded to level %d %s (%s)", self.stream, pm.budget_s * 1e3,
                        pm.window, level, LEVELS[level], what, extra={"stream": self.stream})
        else:
            log.info("stream %s: latency back under budget: level %d %s (%s)", self.stream,
                     level, LEVELS[level], what, extra={"stream": self.stream})


def _asdict(params: DegradeParams) -> dict[str, Any]:
    return {f: getattr(params, f) for f in DegradeParams.__slots__}
