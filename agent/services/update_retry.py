"""Bounded tries with backoff for model updates that fail for want of the right bytes or room.

A download that breaks (:class:`~cloud_sync.errors.FleetUnavailable`) is resumed at the next
poll and costs no try, as long as each resume brings new bytes; one that ends short again
without a new byte (:class:`~cloud_sync.errors.FleetDownloadShort`: a fleet announcing more than
it sends) costs a try. A download that completes but fails its check (the size or sha256
differs from the assignment, or the fleet answers with a ``Content-Range`` that does not continue
the file: :class:`~cloud_sync.errors.FleetProtocolError`) is a wrong archive, and one that
cannot be written or unpacked (``OSError``: a full or read-only disk) fails the same way again:
trying at every poll would download the whole archive over and over. :class:`RetryBudget`
allows ``tries`` per assignment, waits ``backoff_s``, then twice that, ... (at most ``cap_s``)
between them on the monotonic clock, and then says the assignment is spent: the updater rejects
it and reports the reason to the fleet.

>>> t = [0.0]
>>> b = RetryBudget(3, 10.0, clock=lambda: t[0])
>>> b.ready("k"), b.failed("k"), b.ready("k")
(True, 10.0, False)
>>> t[0] = 10.0
>>> b.ready("k"), b.failed("k"), b.failed("k")
(True, 20.0, None)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass


@dataclass
class _Tries:
    failed: int = 0
    not_before: float = 0.0


class RetryBudget:
    """Failed tries per key (an assignment), with exponential backoff.

    Args:
        tries: Downloads allowed per key (>= 1).
        backoff_s: Wait after the first failed try, seconds; doubled after each further one.
        cap_s: Longest wait, seconds.
        clock: Monotonic clock, seconds.
    """

    def __init__(
        self, tries: int, backoff_s: float, *, cap_s: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if tries < 1:
            raise ValueError("tries must be at least 1")
        self.tries = tries
        self.backoff_s = backoff_s
        self.cap_s = cap_s
        self._clock = clock
        self._keys: dict[Hashable, _Tries] = {}

    def ready(self, key: Hashable) -> bool:
        """True when ``key`` may be tried now (never failed, or its backoff has passed)."""
        t = self._keys.get(key)
        return t is None or self._clock() >= t.not_before

    def failed(self, key: Hashable) -> float | None:
        """Record a failed try of ``key``.

        Returns:
            Seconds to wait before the next try, or None when the tries are spent (the key is
            then forgotten: a later :meth:`ready` is True again).
        """
        t = self._keys.setdefault(key, _Tries())
        t.failed += 1
        if t.failed >= self.tries:
            del self._keys[key]
            return None
        wait = min(self.cap_s, self.backoff_s * 2.0 ** (t.failed - 1))
        t.not_before = self._clock() + wait
        return wait

    def tried(self, key: Hashable) -> int:
        """Failed tries of ``key`` so far."""
        t = self._keys.get(key)
        return 0 if t is None else t.failed

    def forget(self, key: Hashable) -> None:
        """Drop what is known of ``key`` (it succeeded)."""
        self._keys.pop(key, None)
