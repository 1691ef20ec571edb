"""Latency budget: the pure degrade policy and the guard around a stream's backend."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from agent.errors import ModelError
from agent.inference.deadline import DeadlineGuard, DegradeParams, DegradePolicy
from agent.metrics import Metrics
from agent.records import Float32Array

BUDGET = 0.005


def _policy(**kw: float) -> DegradePolicy:
    return DegradePolicy(DegradeParams(budget_s=BUDGET, window=200, recover_windows=1000,
                                       **kw))  # type: ignore[arg-type]


def test_no_decision_before_the_window_is_full() -> None:
    p = _policy()
    assert all(p.observe(1.0) is None for _ in range(199))
    assert p.level == 0 and p.p99() is None
    assert p.observe(1.0) == 1


def test_a_few_slow_windows_under_the_p99_do_not_degrade() -> None:
    p = _policy()
    for i in range(2000):  # 1 in 200 over budget: 0.5 % < 1 %
        assert p.observe(0.05 if i % 200 == 0 else 0.001) is None
    assert p.level == 0


def test_sustained_breach_degrades_in_the_fixed_order_then_stops() -> None:
    p = _policy()
    changes = [c for _ in range(1000) if (c := p.observe(0.01)) is not None]
    assert changes == [1, 2]  # skip windows, then fallback backend; never further
    assert p.level == 2 and p.stride() == 2


def test_each_step_needs_a_fresh_window_of_evidence() -> None:
    p = _policy()
    seen = [p.observe(0.01) for _ in range(400)]
    assert seen[199] == 1 and seen[399] == 2
    assert all(s is None for i, s in enumerate(seen) if i not in (199, 399))


def test_recovery_one_level_at_a_time_after_a_quiet_period() -> None:
    p = _policy()
    for _ in range(400):
        p.observe(0.01)
    assert p.level == 2
    changes = {}
    for i in range(5000):
        c = p.observe(0.001)
        if c is not None:
            changes[i] = c
    assert list(changes.values()) == [1, 0]
    first, second = list(changes)
    assert first >= 1000 - 1 and second - first >= 1000  # quiet for recover_windows each time
    assert p.stride() == 1


def test_latency_between_recovery_and_budget_neither_degrades_nor_recovers() -> None:
    p = _policy()
    for _ in range(200):
        p.observe(0.01)
    assert p.level == 1
    for _ in range(5000):  # 0.9 × budget: under the budget but above 0.8 × budget
        assert p.observe(0.9 * BUDGET) is None
    assert p.level == 1


def test_batches_count_as_many_windows() -> None:
    p = _policy()
    assert p.observe(0.01, n=199) is None
    assert p.observe(0.01, n=1) == 1


def test_max_level_one_without_fallback() -> None:
    p = _policy(max_level=1)
    changes = [c for _ in range(1000) if (c := p.observe(0.01)) is not None]
    assert changes == [1]


@pytest.mark.parametrize("kw", [{"window": 0}, {"skip_factor": 1}, {"budget_s": 0.0}])
def test_invalid_params(kw: dict[str, float]) -> None:
    params = {"budget_s": BUDGET, **kw}
    with pytest.raises(ValueError, match="invalid degrade params"):
        DegradePolicy(DegradeParams(**params))  # type: ignore[arg-type]


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class _Timed:
    def __init__(self, name: str, cost: float, clock: _Clock) -> None:
        self.name, self.precision, self.cost, self._clock = name, "int8", cost, clock
        self.calls = 0

    def run(self, windows: Float32Array) -> Float32Array:
        self.calls += 1
        self._clock.t += self.cost * windows.shape[0]
        return np.zeros((windows.shape[0], 3), np.float32)

    def close(self) -> None:
        pass


def test_guard_counts_misses_degrades_falls_back_and_recovers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = _Clock()
    primary, fallback = _Timed("openvino", 0.01, clock), _Timed("onnxruntime", 0.001, clock)
    m = Metrics(CollectorRegistry())
    strides: list[int] = []
    guard = DeadlineGuard("pump1", [primary, fallback], DegradeParams(BUDGET, window=50,
                          recover_windows=100), m, on_stride=strides.append, clock=clock)
    reg = m.registry
    x = np.zeros((1, 10, 8), np.float32)

    def gauge(level: str) -> float | None:
        return reg.get_sample_value("edge_agent_degraded", {"stream": "pump1", "level": level})

    assert gauge("skip_windows") == 0 and gauge("fallback_backend") == 0
    with caplog.at_level(logging.INFO, logger="agent.inference"):
        for _ in range(50):
            guard.run(x)
        assert guard.level == 1 and strides == [2] and gauge("skip_windows") == 1
        assert guard.name == "openvino"
        for _ in range(50):
            guard.run(x)
        assert guard.level == 2 and gauge("fallback_backend") == 1
        assert guard.name == "onnxruntime" and strides == [2, 2]
        assert reg.get_sample_value("edge_agent_deadline_miss_total",
                                    {"stream": "pump1"}) == 100
        calls = primary.calls
        for _ in range(149):  # the fast fallback runs now, well under budget: 50 to fill the
            guard.run(x)      # estimate afresh, then 100 quiet windows (the 149th is the 100th)
        assert primary.calls == calls
        assert guard.level == 1 and guard.name == "openvino"
        for _ in range(150):  # back on the slow one: breach again
            guard.run(x)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    infos = [r for r in caplog.records if r.levelno == logging.INFO]
    assert len(warnings) == 3 and "breached" in warnings[0].getMessage()
    assert "level 1 skip_windows" in warnings[0].getMessage()
    assert len(infos) == 1 and "back under budget" in infos[0].getMessage()


def test_guard_without_fallback_stops_at_skipping() -> None:
    clock = _Clock()
    m = Metrics(CollectorRegistry())
    guard = DeadlineGuard("s", [_Timed("onnxruntime", 0.01, clock)],
                          DegradeParams(BUDGET, window=10), m, clock=clock)
    for _ in range(100):
        guard.run(np.zeros((1, 2, 2), np.float32))
    assert guard.level == 1


def test_an_unopened_fallback_is_opened_only_when_level_2_needs_it() -> None:
    clock = _Clock()
    primary, fallback = _Timed("litert", 0.01, clock), _Timed("onnxruntime", 0.001, clock)
    opened: list[str] = []

    def open_fallback() -> _Timed:
        opened.append(fallback.name)
        return fallback

    guard = DeadlineGuard("s", [primary], DegradeParams(BUDGET, window=50),
                          Metrics(CollectorRegistry()), clock=clock, fallback=open_fallback)
    x = np.zeros((1, 10, 8), np.float32)
    assert guard.has_fallback and not guard.fallback_opened
    for _ in range(50):
        guard.run(x)
    assert guard.level == 1 and opened == [] and not guard.fallback_opened
    for _ in range(50):
        guard.run(x)
    assert guard.level == 2 and opened == ["onnxruntime"] and guard.fallback_opened
    assert guard.name == "onnxruntime"
    for _ in range(10):
        guard.run(x)
    assert fallback.calls == 10 and opened == ["onnxruntime"]  # opened once


def test_a_fallback_that_cannot_be_opened_leaves_the_guard_at_skipping(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = _Clock()
    primary = _Timed("litert", 0.01, clock)
    tries: list[int] = []

    def broken() -> _Timed:
        tries.append(1)
        raise ModelError("golden outputs differ")

    guard = DeadlineGuard("s", [primary], DegradeParams(BUDGET, window=50),
                          Metrics(CollectorRegistry()), clock=clock, fallback=broken)
    with caplog.at_level(logging.INFO, logger="agent.inference"):
        for _ in range(300):
            guard.run(np.zeros((1, 10, 8), np.float32))
    assert guard.level == 1 and guard.name == "litert" and tries == [1]
    assert not guard.has_fallback and primary.calls == 300
    failed = [r.getMessage() for r in caplog.records if "cannot be opened" in r.getMessage()]
    assert len(failed) == 1 and "golden outputs differ" in failed[0]


def test_a_fallback_whose_runtime_raises_its_own_error_leaves_the_guard_at_skipping(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # a runtime's own error class (OpenVINO's RuntimeError from creating an infer request) is
    # raised on the stream's thread while the primary keeps working: the stream must not fail,
    # nor be left at level 2 with no second backend
    clock = _Clock()
    primary = _Timed("litert", 0.01, clock)

    def broken() -> _Timed:
        raise RuntimeError("Exception from src/inference/src/cpp/infer_request.cpp")

    guard = DeadlineGuard("s", [primary], DegradeParams(BUDGET, window=50),
                          Metrics(CollectorRegistry()), clock=clock, fallback=broken)
    with caplog.at_level(logging.INFO, logger="agent.inference"):
        for _ in range(300):
            guard.run(np.zeros((1, 10, 8), np.float32))
    assert guard.level == 1 and guard.name == "litert" and primary.calls == 300
    failed = [r.getMessage() for r in caplog.records if "cannot be opened" in r.getMessage()]
    assert len(failed) == 1 and "infer_request.cpp" in failed[0]
