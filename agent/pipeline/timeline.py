"""Clock steps in a stream's timestamps, found against the monotonic receive clock (pure code).

A live source stamps its readings with the wall clock (a serial port without a timestamp
field); NTP correcting it, or a gateway without a real-time clock learning the time, steps that
clock by seconds to years. Stream time then jumps while the monotonic clock runs on. Left
alone, a backward step of an hour made the alert cooldown (which compared timestamps) suppress
every alert for an hour, and kept the open aggregate interval open for an hour.

:class:`StepDetector` compares consecutive readings' timestamps ``ts`` with their monotonic
receive times ``mono`` (``Reading.received_mono``):

* **backward**: ``ts`` goes back by more than ``back_s`` (readings are stamped in order, so
  this needs no receive time);
* **forward**: ``ts`` advances more than ``forward_s`` beyond the monotonic time elapsed
  between the two receptions (needs both receive times). A recording replayed faster than
  real time with a gap longer than ``forward_s`` looks the same, and is treated the same.

Each step's size is the timestamp jump minus the monotonic time elapsed (negative = back).
The pipeline (:class:`agent.pipeline.stream.StreamPipeline`) closes the open aggregate interval
at a step and adds the opposite of the step to the stream time its alert rules see, so
cooldowns and debounce keep counting monotonic seconds across the step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agent.records import FloatArray

#: Timestamps going back by more than this many seconds: a step back.
STEP_BACK_S = 2.0
#: Timestamps running ahead of the monotonic clock by more than this many seconds: a step forward.
STEP_FORWARD_S = 300.0


@dataclass(frozen=True, slots=True)
class ClockStep:
    """One step in a block of readings.

    Attributes:
        index: Index in the block of the first reading after the step.
        size_s: Timestamp jump minus monotonic time elapsed, seconds (negative = back).
        at_ts: That reading's timestamp, epoch seconds.
    """

    index: int
    size_s: float
    at_ts: float

    @property
    def direction(self) -> str:
        """``back`` or ``forward``."""
        return "back" if self.size_s < 0 else "forward"


class StepDetector:
    """Find clock steps block by block (state: the previous block's last reading).

    Args:
        back_s: See :data:`STEP_BACK_S`.
        forward_s: See :data:`STEP_FORWARD_S`.

    >>> d = StepDetector()
    >>> ts = np.array([100.0, 101.0, 102.0, -3400.0, -3399.0])
    >>> mono = np.array([5.0, 6.0, 7.0, 8.0, 9.0])
    >>> d.find(ts, mono)
    [ClockStep(index=3, size_s=-3503.0, at_ts=-3400.0)]
    >>> d.find(np.array([-3398.0, 3.0e9]), np.array([10.0, 11.0]))[0].direction
    'forward'
    >>> d.find(np.array([3.0e9 + 400]), np.array([0.0]))  # no receive time: back steps only
    []
    """

    def __init__(self, back_s: float = STEP_BACK_S, forward_s: float = STEP_FORWARD_S) -> None:
        self.back_s = back_s
        self.forward_s = forward_s
        self._last: tuple[float, float] | None = None

    def find(self, ts: FloatArray, mono: FloatArray | None = None) -> list[ClockStep]:
        """Steps within ``ts`` (``(N,)``, epoch s) and between the previous block and it.

        Args:
            ts: Timestamps of the block's readings.
            mono: Their monotonic receive times, ``(N,)`` seconds; 0 or None = unknown.
        """
        n = ts.shape[0]
        if n == 0:
            return []
        m = np.zeros(n) if mono is None else mono
        if self._last is None:
            prev_ts = np.concatenate([ts[:1], ts[:-1]])
            prev_m = np.concatenate([m[:1], m[:-1]])
        else:
            prev_ts = np.concatenate([[self._last[0]], ts[:-1]])
            prev_m = np.concatenate([[self._last[1]], m[:-1]])
        self._last = (float(ts[-1]), float(m[-1]))
        known = (m > 0) & (prev_m > 0)
        elapsed = np.where(known, np.maximum(m - prev_m, 0.0), 0.0)
        dts = ts - prev_ts
        step = (dts < -self.back_s) | (known & (dts - elapsed > self.forward_s))
        return [ClockStep(int(i), float(dts[i] - elapsed[i]), float(ts[i]))
                for i in np.flatnonzero(step)]
