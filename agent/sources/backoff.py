"""Exponential backoff with jitter, shared by the serial reconnect loop and the source supervisor.

The delay before retry ``n`` (0-based, counting failures since the last success) is::

    base_n  = min(max_s, initial_s * multiplier ** n)
    delay_n = base_n * (1 - jitter * U),   U ~ uniform[0, 1)

so delays grow geometrically up to ``max_s`` and each one is shortened by up to ``jitter`` of
itself ("equal jitter" when ``jitter = 0.5``; see Marc Brooker, "Exponential Backoff And Jitter",
AWS Architecture Blog, 2015). Jitter spreads the reconnects of many gateways that lost the same
peer at the same moment. :meth:`Backoff.reset` starts again at ``initial_s`` after a success.

A small class of our own rather than ``tenacity``: both users need a delay that can be reset from
inside a long-lived loop and a wait that is interrupted by a stop event, which tenacity's
``Retrying`` (one retry session per call) does not model naturally.
"""

from __future__ import annotations

import random


class Backoff:
    """Delay generator for exponential backoff with jitter (seconds).

    Args:
        initial_s: First delay in seconds, > 0.
        max_s: Largest delay in seconds, >= ``initial_s``.
        multiplier: Growth factor per failure, >= 1.
        jitter: Fraction in [0, 1] by which each delay may be randomly shortened.
        rng: Random source (inject a seeded ``random.Random`` in tests).

    Raises:
        ValueError: On a parameter outside the ranges above.

    >>> b = Backoff(0.5, 4.0, jitter=0.0)
    >>> [b.next_delay() for _ in range(5)]
    [0.5, 1.0, 2.0, 4.0, 4.0]
    >>> b.reset(); b.next_delay()
    0.5
    """

    def __init__(
        self,
        initial_s: float,
        max_s: float,
        multiplier: float = 2.0,
        jitter: float = 0.5,
        rng: random.Random | None = None,
    ) -> None:
        if initial_s <= 0 or max_s < initial_s:
            raise ValueError(f"need 0 < initial_s <= max_s, got {initial_s}, {max_s}")
        if multiplier < 1 or not 0.0 <= jitter <= 1.0:
            raise ValueError(
                f"need multiplier >= 1 and 0 <= jitter <= 1, got {multiplier}, {jitter}"
            )
        self.initial_s = initial_s
        self.max_s = max_s
        self.multiplier = multiplier
        self.jitter = jitter
        self._rng = rng if rng is not None else random.Random()  # jitter only, not crypto
        self._failures = 0

    @property
    def failures(self) -> int:
        """Delays handed out since the last :meth:`reset`."""
        return self._failures

    def next_delay(self) -> float:
        """Return the next delay in seconds and count one more failure."""
        exponent = min(self._failures, 64)  # no float overflow on very long outages
        base = min(self.max_s, self.initial_s * self.multiplier**exponent)
        self._failures += 1
        if self.jitter == 0.0:
            return base
        return base * (1.0 - self.jitter * self._rng.random())

    def reset(self) -> None:
        """Start again at ``initial_s`` (call after a success)."""
        self._failures = 0
