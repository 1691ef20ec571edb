"""The free space of the file system that holds the store (the ``/healthz`` component ``disk``).

The disk budget (:mod:`agent.disk_budget`) judges what the agent's own files take; this module
adds what the file system has left, so the ``disk`` component agrees with the ``store``
component when the disk fills for any reason (other programs, logs, a small partition):

* **red** while the store cannot write for lack of space: its last failed statement is at most
  :data:`NO_SPACE_RECENT_S` seconds old and says ``disk full`` (SQLITE_FULL, ENOSPC), or failed
  while less than :data:`agent.store.deferred.FULL_BELOW_BYTES` were free; the same window as
  the ``store`` component's red (:data:`agent.monitor.STORE_RECOVERY_S`);
* **yellow** while less than ``min(LOW_FREE_BYTES, LOW_FREE_SHARE x size)`` bytes are free;
* else the budget's own verdict.

The figures are in the component's details: ``fs_free_bytes``, ``fs_size_bytes``,
``fs_path`` (``os.statvfs``: bytes an unprivileged writer may still use, and the size).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from agent.health import RED, YELLOW, Component, rank
from agent.store.connection import StoreFailure
from agent.store.deferred import FULL_BELOW_BYTES

#: Yellow below this many free bytes ...
LOW_FREE_BYTES = 256 * 1024 * 1024
#: ... or below this share of the file system's size, whichever is smaller.
LOW_FREE_SHARE = 0.05
#: A store failure for lack of space keeps ``disk`` red this long, seconds (as ``store``).
NO_SPACE_RECENT_S = 30.0


@dataclass(frozen=True)
class FsSpace:
    """A file system's space, bytes.

    Attributes:
        free: Bytes available to an unprivileged writer (``f_bavail x f_frsize``).
        size: The file system's size (``f_blocks x f_frsize``).
    """

    free: int
    size: int

    @property
    def low_bytes(self) -> int:
        """Free bytes under which the space is low.

        >>> FsSpace(0, 100 * 2**30).low_bytes == 256 * 2**20, FsSpace(0, 1000).low_bytes
        (True, 50)
        """
        return int(min(LOW_FREE_BYTES, LOW_FREE_SHARE * self.size))


def fs_space(directory: str) -> FsSpace | None:
    """The space of the file system holding ``directory``; None when it cannot be read."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    return FsSpace(st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize)


def no_space_failure(failure: StoreFailure, space: FsSpace | None, now: float) -> str | None:
    """The store's recent failure for lack of space (its text), or None.

    Args:
        failure: The store's failures (:meth:`agent.store.sqlite.Store.failure`).
        space: The file system's space now, if known.
        now: ``monotonic()`` now, seconds (the clock of ``failure.last_mono``).

    >>> f = StoreFailure(3, "disk full: the SQLite store cannot grow", 100.0, 1)
    >>> no_space_failure(f, FsSpace(0, 10**6), 110.0)
    'disk full: the SQLite store cannot grow'
    >>> no_space_failure(f, FsSpace(0, 10**6), 200.0) is None
    True
    """
    if failure.last_mono is None or failure.last_error is None:
        return None
    if now - failure.last_mono > NO_SPACE_RECENT_S:
        return None
    text = failure.last_error
    if "disk full" in text or "No space left" in text:
        return text
    if space is not None and space.free < FULL_BELOW_BYTES:
        return text
    return None


def with_free_space(budget: Component, directory: str, failure: StoreFailure,
                    now: float) -> Component:
    """The ``disk`` component: the budget's verdict ``budget`` joined with the free space of
    ``directory``'s file system and the store's failures (module docstring); the worse state
    wins, and its reason comes first."""
    space = fs_space(directory)
    details = dict(budget.details)
    if space is not None:
        details.update(fs_path=directory, fs_free_bytes=space.free, fs_size_bytes=space.size)
    full = no_space_failure(failure, space, now)
    if full is not None:
        free = "" if space is None else f" ({space.free} bytes free of {space.size})"
        mine = Component("disk", RED, f"the file system of {directory} is full{free}: the "
                         f"store cannot write ({full}); free space there", details)
    elif space is not None and space.free < space.low_bytes:
        mine = Component("disk", YELLOW, f"low space on the file system of {directory}: "
                         f"{space.free} bytes free of {space.size} (below {space.low_bytes}); "
                         "the store fails when it is full", details)
    else:
        return replace(budget, details=details)
    if rank(budget.state) > rank(mine.state):
        return replace(budget, details=details)
    if budget.reason is not None:
        return replace(mine, reason=f"{mine.reason}; {budget.reason}")
    return mine
