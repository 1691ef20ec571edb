"""Valid ranges: a reading no sensor of the stream can produce is rejected at the source.

A per-channel range comes from the stream's config (``[[streams.valid_range]]`` tables of
``channel``, ``low``, ``high``, channel units, inclusive: :class:`ValidRangeConfig`). A channel
without one still has a bound: the largest float32, :data:`MODEL_INPUT_LIMIT` (a model reads
float32 windows; ``1e39`` would become infinity there and poison the calibration or the score).
A reading outside its range is rejected with ``reason = "out_of_range"`` (counted in
``edge_agent_records_rejected_total``, logged at a limited rate by the supervisor) and never
reaches the calibration or the detector.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from pydantic import Field, model_validator

from agent.config.base import StrictModel
from agent.errors import RecordError
from agent.records import FloatArray

#: Largest magnitude a float32 model input holds (about 3.4e38).
MODEL_INPUT_LIMIT = float(np.finfo(np.float32).max)
#: Up to this many channels a reading is checked in Python: a few float comparisons cost less
#: than the numpy calls (about 1 us against 5 us for 8 channels), and every reading passes here.
PY_CHECK_MAX = 32


class ValidRangeConfig(StrictModel):
    """One channel's physically possible readings (``[[streams.valid_range]]``)."""

    channel: str = Field(description="Channel name, as the source names it.")
    low: float = Field(description="Smallest possible reading, channel units (inclusive).")
    high: float = Field(description="Largest possible reading, channel units (inclusive).")

    @model_validator(mode="after")
    def _ordered(self) -> ValidRangeConfig:
        if not self.low <= self.high:
            raise ValueError(f"low ({self.low}) must not exceed high ({self.high})")
        return self


class ValidRange:
    """Per-channel inclusive bounds for one stream's readings.

    Args:
        channels: The source's channel names, in value order.
        ranges: ``{channel: (low, high)}``, channel units; channels not named are bounded by
            ``±MODEL_INPUT_LIMIT``.

    Raises:
        ValueError: a range names a channel the source does not have, or low > high.

    >>> vr = ValidRange(("a", "b"), {"b": (0.0, 10.0)})
    >>> vr.check(np.array([1e30, 5.0])) is None
    True
    >>> vr.check(np.array([1e39, 5.0])).reason, vr.check(np.array([1.0, -1.0])).reason
    ('out_of_range', 'out_of_range')
    """

    def __init__(
        self, channels: Sequence[str], ranges: Mapping[str, Sequence[float]] | None = None
    ) -> None:
        self.channels = tuple(channels)
        self.low = np.full(len(self.channels), -MODEL_INPUT_LIMIT)
        self.high = np.full(len(self.channels), MODEL_INPUT_LIMIT)
        for name, bounds in (ranges or {}).items():
            if name not in self.channels:
                raise ValueError(f"valid_range names channel {name!r}, which the source does "
                                 f"not have (channels: {list(self.channels)})")
            low, high = float(bounds[0]), float(bounds[1])
            if not low <= high:
                raise ValueError(f"valid_range of {name!r}: low {low} above high {high}")
            i = self.channels.index(name)
            self.low[i], self.high[i] = max(low, -MODEL_INPUT_LIMIT), min(high, MODEL_INPUT_LIMIT)
        self._bounds = (list(zip(self.low.tolist(), self.high.tolist(), strict=True))
                        if len(self.channels) <= PY_CHECK_MAX else None)

    def check(self, values: FloatArray) -> RecordError | None:
        """None when every value of ``values`` (``(C,)``) is inside its range, else the error
        naming the first channel outside (NaN is no value outside a range: it passes)."""
        if self._bounds is not None and len(values) == len(self._bounds):
            for x, (low, high) in zip(values.tolist(), self._bounds, strict=True):
                if x < low or x > high:
                    break
            else:
                return None
        outside = (values < self.low) | (values > self.high)
        if not outside.any():
            return None
        i = int(np.flatnonzero(outside)[0])
        return RecordError(
            f"{self.channels[i]} = {values[i]:.6g} outside its valid range "
            f"[{self.low[i]:.6g}, {self.high[i]:.6g}]",
            reason="out_of_range",
        )
