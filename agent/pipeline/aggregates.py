"""Per-interval aggregates of one stream: count, min, max, mean, std per channel, max score,
windows scored and alerts raised.

Intervals are aligned to multiples of ``interval_s`` in stream time (epoch seconds UTC), so two
gateways' aggregates line up. An interval is emitted when a reading of a later interval arrives,
or on :meth:`IntervalAggregator.flush` (shutdown). The std is the population std computed from
per-interval sums of the values shifted by the interval's first sample (the shifted-data
algorithm, Chan, Golub & LeVeque, "Algorithms for computing the sample variance", 1983), which
avoids catastrophic cancellation for large offsets like 230 V.
"""

from __future__ import annotations

import math

import numpy as np

from agent.records import Aggregate, ChannelStats, FloatArray


class _Acc:
    __slots__ = ("alerts", "count", "max", "max_score", "min", "shift", "sum", "sumsq", "windows")

    def __init__(self, channels: int, shift: FloatArray) -> None:
        self.count = 0
        self.shift = shift
        self.sum = np.zeros(channels)
        self.sumsq = np.zeros(channels)
        self.min = np.full(channels, np.inf)
        self.max = np.full(channels, -np.inf)
        self.max_score = -math.inf
        self.windows = 0
        self.alerts = 0


class IntervalAggregator:
    """Aggregate one stream's readings and scores per interval.

    Args:
        device_id: Device id stamped on every aggregate.
        stream: Stream name.
        channels: Channel names, in value order.
        interval_s: Interval length in seconds (> 0).

    Raises:
        ValueError: interval_s ≤ 0.
    """

    def __init__(
        self, device_id: str, stream: str, channels: tuple[str, ...], interval_s: float
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        self.device_id = device_id
        self.stream = stream
        self.channels = channels
        self.interval_s = interval_s
        self._slot: int | None = None
        self._acc: _Acc | None = None

    def _slot_of(self, ts: FloatArray) -> np.ndarray:
        return np.floor(ts / self.interval_s).astype(np.int64)

    def add_readings(self, values: FloatArray, ts: FloatArray) -> list[Aggregate]:
        """Add readings ``values`` ``(N, C)`` at ``ts`` ``(N,)``; return closed intervals.

        Readings older than the open interval (clock stepped back) are counted into the open
        interval rather than reopening a closed one.
        """
        out: list[Aggregate] = []
        if values.shape[0] == 0:
            return out
        slots = self._slot_of(ts)
        if self._slot is not None:
            slots = np.maximum(slots, self._slot)
        # split the block where the slot changes
        cuts = np.flatnonzero(np.diff(slots)) + 1
        for part_v, part_s in zip(np.split(values, cuts), np.split(slots, cuts), strict=True):
            slot = int(part_s[0])
            if self._slot != slot:
                if self._acc is not None:
                    out.append(self._emit())
                self._slot = slot
                self._acc = _Acc(len(self.channels), part_v[0].astype(np.float64))
            acc = self._acc
            assert acc is not None
            d = part_v - acc.shift
            acc.count += part_v.shape[0]
            acc.sum += d.sum(axis=0)
            acc.sumsq += (d * d).sum(axis=0)
            np.minimum(acc.min, part_v.min(axis=0), out=acc.min)
            np.maximum(acc.max, part_v.max(axis=0), out=acc.max)
        return out

    def add_scores(self, scores: FloatArray, alerts: int) -> None:
        """Count scored windows (NaN scores = calibrating are not counted) and alerts into the
        open interval."""
        if self._acc is None:
            return
        valid = scores[~np.isnan(scores)]
        if valid.size:
            self._acc.windows += int(valid.size)
            self._acc.max_score = max(self._acc.max_score, float(valid.max()))
        self._acc.alerts += alerts

    def _emit(self) -> Aggregate:
        acc, slot = self._acc, self._slot
        assert acc is not None and slot is not None
        n = acc.count
        mean_d = acc.sum / n
        var = np.maximum(acc.sumsq / n - mean_d * mean_d, 0.0)
        mean = acc.shift + mean_d
        stats = tuple(
            ChannelStats(ch, n, float(acc.min[i]), float(acc.max[i]), float(mean[i]),
                         float(math.sqrt(var[i])))
            for i, ch in enumerate(self.channels)
        )
        self._acc = None
        return Aggregate(
            device_id=self.device_id,
            stream=self.stream,
            interval_start=slot * self.interval_s,
            interval_s=self.interval_s,
            count=n,
            channels=stats,
            max_score=acc.max_score if acc.windows else math.nan,
            windows=acc.windows,
            alert_count=acc.alerts,
        )

    def flush(self) -> list[Aggregate]:
        """Close and return the open interval (if any), e.g. at shutdown."""
        if self._acc is None:
            return []
        agg = self._emit()
        self._slot = None
        return [agg]
