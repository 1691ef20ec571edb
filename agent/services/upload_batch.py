"""The uploader's batches and what paces them: a batch ready to send (its rows in record
index order and its compressed body), a batch in flight, the fleet client's interface, and the
token bucket of ``max_bytes_per_s``. The upload loop: :mod:`agent.services.uploader`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Protocol

from agent.store.sqlite import RecordKind
from cloud_sync.protocol import IngestResult


class IngestClient(Protocol):
    """What the uploader needs from :class:`cloud_sync.client.FleetClient`."""

    def compress(self, document: bytes) -> bytes: ...

    def send(self, body: bytes, n_records: int) -> IngestResult: ...


class TokenBucket:
    """Token bucket on bytes: ``rate`` per second, bursts up to ``capacity``.

    Args:
        rate: Bytes per second, > 0.
        capacity: Largest burst in bytes; default one second's worth.
        monotonic: Monotonic clock, seconds.

    >>> t = [0.0]
    >>> b = TokenBucket(100.0, monotonic=lambda: t[0])
    >>> b.reserve(100), b.reserve(50)
    (0.0, 0.5)
    >>> t[0] = 1.5; b.reserve(100)
    0.0
    """

    def __init__(
        self,
        rate: float,
        capacity: float | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be positive, got {rate}")
        self.rate = rate
        self.capacity = capacity if capacity is not None else rate
        self._monotonic = monotonic
        self._tokens = self.capacity
        self._last = monotonic()

    def reserve(self, n: float) -> float:
        """Take ``n`` bytes; return the seconds to wait before sending them (0 = now)."""
        now = self._monotonic()
        self._tokens = min(self.capacity, self._tokens + (now - self._last) * self.rate)
        self._last = now
        self._tokens -= n
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate


@dataclass(frozen=True)
class Batch:
    """A batch ready to send: its rows' ids (index order), compressed body, the read's limit.

    Record index ``i`` of the batch (of its answer) is alert row ``alert_rows[i]`` for ``i <
    len(alert_rows)``, then aggregate row ``aggregate_rows[i - len(alert_rows)]``: both reads of
    the store return the alerts first (schema 1 as records, schema 2 as records then columns).
    ``after`` (largest alert and aggregate row ids: where the next batch starts, see the store)
    is computed once, not per look-up (every read-ahead consults each batch in flight).
    """

    alert_rows: list[int]
    aggregate_rows: list[int]
    body: bytes
    limit: int
    schema: int = 1
    after: tuple[int, int] = (0, 0)

    @classmethod
    def of(
        cls, alert_rows: list[int], aggregate_rows: list[int], body: bytes, limit: int,
        schema: int,
    ) -> Batch:
        """The batch of these rows (queue order) with its largest row ids."""
        return cls(alert_rows, aggregate_rows, body, limit, schema,
                   (max(alert_rows, default=0), max(aggregate_rows, default=0)))

    @property
    def counts(self) -> tuple[int, int]:
        """(alerts, aggregates) in the batch."""
        return len(self.alert_rows), len(self.aggregate_rows)

    def __len__(self) -> int:
        return len(self.alert_rows) + len(self.aggregate_rows)

    def row(self, index: int) -> tuple[RecordKind, int]:
        """``(kind, row id)`` of record ``index``."""
        if index < len(self.alert_rows):
            return "alert", self.alert_rows[index]
        return "aggregate", self.aggregate_rows[index - len(self.alert_rows)]

    @property
    def short(self) -> bool:
        """Fewer rows than asked for: the read reached the queue's end."""
        return len(self) < self.limit


@dataclass(frozen=True)
class Sent:
    """A batch in flight and the future of its answer."""

    batch: Batch
    future: Future[IngestResult]
