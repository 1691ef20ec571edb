"""Dynamic batching: many streams sharing one model, grouped into one backend call.

Modelled on Triton Inference Server's dynamic batcher (model configuration
``dynamic_batching { max_queue_delay_microseconds }`` with the model's ``max_batch_size``;
Triton docs, "Dynamic Batcher"): concurrent requests are queued; a batch is formed when it holds
``max_batch_size`` rows or when the oldest request has waited ``max_queue_delay_us``
microseconds, whichever comes first, and runs as one backend call; each caller gets its own rows
back. A batch never exceeds ``max_batch_size`` rows unless a single request alone is larger (it
then runs alone, unsplit). ``max_batch_size = 1`` (the default) means no batching: calls go
straight to the backend.

There is no batching thread: the first waiting caller leads (forms and runs the batch while the
others wait on a condition), as in a leader/follower pool; the backend is never called from two
threads at once through the batcher.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from agent.inference.base import Backend
from agent.records import Float32Array


@dataclass(frozen=True, slots=True)
class BatchingConfig:
    """Settings of :class:`DynamicBatcher`.

    Attributes:
        max_batch_size: Largest batch in rows; 1 = no batching.
        max_queue_delay_us: How long the oldest queued request may wait for others, µs.
    """

    max_batch_size: int = 1
    max_queue_delay_us: int = 0


@dataclass(slots=True)
class _Request:
    x: Float32Array
    t0: float
    out: Float32Array | None = None
    error: BaseException | None = None
    done: bool = field(default=False)


class DynamicBatcher:
    """A thread-safe :class:`~agent.inference.base.Backend` that batches concurrent calls.

    Args:
        backend: The shared backend.
        config: Batch size and queue delay.
        clock: Monotonic seconds (queue delay accounting).

    Raises:
        ValueError: ``max_batch_size < 1`` or ``max_queue_delay_us < 0``.
    """

    def __init__(
        self,
        backend: Backend,
        config: BatchingConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        cfg = config or BatchingConfig()
        if cfg.max_batch_size < 1 or cfg.max_queue_delay_us < 0:
            raise ValueError(f"invalid batching config {cfg}")
        self.backend = backend
        self.config = cfg
        self.name = backend.name
        self.precision = backend.precision
        self._clock = clock
        self._cond = threading.Condition()
        self._queue: deque[_Request] = deque()
        self._leading = False
        #: Rows of every backend call made, in order (for metrics and tests).
        self.batch_rows: deque[int] = deque(maxlen=10_000)

    def run(self, windows: Float32Array) -> Float32Array:
        """Run ``windows`` (``(B, ...)`` float32), possibly batched with other callers' rows.

        Returns:
            ``(B, F)`` float32: exactly this caller's rows.

        Raises:
            agent.errors.ModelError: the backend failed on the batch this call was part of.
        """
        if self.config.max_batch_size <= 1:
            self.batch_rows.append(int(windows.shape[0]))
            return self.backend.run(windows)
        req = _Request(windows, self._clock())
        with self._cond:
            self._queue.append(req)
            self._cond.notify_all()
            while not req.done:
                if self._leading:
                    self._cond.wait()
                    continue
                self._leading = True
                batch = self._form_batch()
                self._cond.release()
                try:
                    self._run_batch(batch)
                finally:
                    self._cond.acquire()
                    self._leading = False
                    self._cond.notify_all()
        if req.error is not None:
            raise req.error
        assert req.out is not None
        return req.out

    def close(self) -> None:
        """Close the wrapped backend (after the last :meth:`run`)."""
        self.backend.close()

    def _rows(self) -> int:
        return sum(int(r.x.shape[0]) for r in self._queue)

    def _form_batch(self) -> list[_Request]:
        """Wait (lock held) until the queue is full or its oldest request is due; take a batch."""
        cfg = self.config
        deadline = self._queue[0].t0 + cfg.max_queue_delay_us * 1e-6
        while self._rows() < cfg.max_batch_size:
            left = deadline - self._clock()
            if left <= 0:
                break
            self._cond.wait(left)
        batch = [self._queue.popleft()]
        rows = int(batch[0].x.shape[0])
        while self._queue and rows + int(self._queue[0].x.shape[0]) <= cfg.max_batch_size:
            req = self._queue.popleft()
            rows += int(req.x.shape[0])
            batch.append(req)
        return batch

    def _run_batch(self, batch: list[_Request]) -> None:
        x = batch[0].x if len(batch) == 1 else np.concatenate([r.x for r in batch])
        self.batch_rows.append(int(x.shape[0]))
        try:
            out = self.backend.run(x)
        except BaseException as exc:
            for r in batch:
                r.error, r.done = exc, True
            return
        start = 0
        for r in batch:
            n = int(r.x.shape[0])
            r.out, r.done = out[start : start + n], True
            start += n
