"""DynamicBatcher: each caller gets its own rows; batch size and queue delay are respected."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from agent.errors import ModelError
from agent.inference.batching import BatchingConfig, DynamicBatcher
from agent.records import Float32Array


class _Sum:
    """Row i of the output = sum of row i of the input, plus a record of every call."""

    name = "fake"
    precision = "fp32"

    def __init__(self, delay_s: float = 0.0, fail: bool = False) -> None:
        self.calls: list[int] = []
        self.delay_s = delay_s
        self.fail = fail
        self.concurrent = 0
        self.max_concurrent = 0
        self._lock = threading.Lock()

    def run(self, windows: Float32Array) -> Float32Array:
        with self._lock:
            self.concurrent += 1
            self.max_concurrent = max(self.max_concurrent, self.concurrent)
        try:
            self.calls.append(int(windows.shape[0]))
            if self.delay_s:
                time.sleep(self.delay_s)
            if self.fail:
                raise ModelError("boom")
            return windows.reshape(windows.shape[0], -1).sum(axis=1, keepdims=True)
        finally:
            with self._lock:
                self.concurrent -= 1


def _call_many(batcher: DynamicBatcher, inputs: list[np.ndarray]) -> list[object]:
    results: list[object] = [None] * len(inputs)
    barrier = threading.Barrier(len(inputs))

    def worker(i: int) -> None:
        barrier.wait()
        try:
            results[i] = batcher.run(inputs[i])
        except ModelError as exc:
            results[i] = exc

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return results


def test_default_is_no_batching_and_passes_straight_through() -> None:
    backend = _Sum()
    b = DynamicBatcher(backend)
    x = np.ones((3, 4, 2), np.float32)
    np.testing.assert_array_equal(b.run(x), np.full((3, 1), 8.0, np.float32))
    assert backend.calls == [3]
    assert (b.name, b.precision) == ("fake", "fp32")


def test_each_caller_gets_its_own_rows() -> None:
    backend = _Sum(delay_s=0.002)
    b = DynamicBatcher(backend, BatchingConfig(max_batch_size=8, max_queue_delay_us=20_000))
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((int(rng.integers(1, 4)), 5, 3)).astype(np.float32)
              for _ in range(24)]
    results = _call_many(b, inputs)
    for x, y in zip(inputs, results, strict=True):
        assert isinstance(y, np.ndarray)
        np.testing.assert_allclose(y, x.reshape(x.shape[0], -1).sum(1, keepdims=True),
                                   rtol=1e-6)
    assert sum(backend.calls) == sum(x.shape[0] for x in inputs)
    assert len(backend.calls) < len(inputs)  # some calls were grouped
    assert backend.max_concurrent == 1


def test_batch_size_is_never_exceeded() -> None:
    backend = _Sum(delay_s=0.001)
    b = DynamicBatcher(backend, BatchingConfig(max_batch_size=4, max_queue_delay_us=50_000))
    inputs = [np.ones((1 + i % 3, 2, 2), np.float32) for i in range(30)]
    _call_many(b, inputs)
    assert max(backend.calls) <= 4
    assert sum(backend.calls) == sum(x.shape[0] for x in inputs)


def test_an_oversized_request_runs_alone_unsplit() -> None:
    backend = _Sum()
    b = DynamicBatcher(backend, BatchingConfig(max_batch_size=4, max_queue_delay_us=1000))
    y = b.run(np.ones((10, 2, 2), np.float32))
    assert y.shape == (10, 1)
    assert backend.calls == [10]


def test_max_queue_delay_is_respected() -> None:
    backend = _Sum()
    delay_us = 30_000
    b = DynamicBatcher(backend, BatchingConfig(max_batch_size=64, max_queue_delay_us=delay_us))
    t0 = time.monotonic()
    b.run(np.ones((1, 2, 2), np.float32))  # alone: waits for company until the delay is up
    waited = time.monotonic() - t0
    assert delay_us * 1e-6 * 0.9 <= waited < delay_us * 1e-6 + 0.5
    # a full batch does not wait for the delay
    b2 = DynamicBatcher(_Sum(), BatchingConfig(max_batch_size=2, max_queue_delay_us=5_000_000))
    t0 = time.monotonic()
    _call_many(b2, [np.ones((1, 2, 2), np.float32)] * 2)
    assert time.monotonic() - t0 < 2.0


def test_a_backend_error_reaches_every_caller_of_the_batch() -> None:
    b = DynamicBatcher(_Sum(fail=True), BatchingConfig(max_batch_size=8,
                                                       max_queue_delay_us=20_000))
    results = _call_many(b, [np.ones((1, 2, 2), np.float32)] * 5)
    assert all(isinstance(r, ModelError) for r in results)


@pytest.mark.parametrize("cfg", [BatchingConfig(0, 0), BatchingConfig(2, -1)])
def test_invalid_config(cfg: BatchingConfig) -> None:
    with pytest.raises(ValueError, match="invalid batching config"):
        DynamicBatcher(_Sum(), cfg)
