"""Starting without the store: a database that cannot be opened for want of disk space.

A full disk at start (the store cleanly closed, absent or corrupt) made every start exit 1, so
under systemd the agent restart-looped into a failed state and sent no alert although the broker
was up. Now :class:`agent.store.sqlite.Store` first deletes its reserve file (``<db>-reserve``)
and tries again; if that is not enough it starts *unopened*: every call raises
:class:`agent.errors.StoreError` ("disk full", counted like a failing write, so ``/healthz``
shows the store red), alerts go over MQTT from memory as they do when a running agent's disk
fills (:mod:`agent.publish.keeper`), and each call at most every :data:`RETRY_S` seconds tries
to open the database again. The first that succeeds logs the recovery and the store works from
then on (a quarantined file's id floor included).
"""

from __future__ import annotations

import errno

from agent.errors import AgentError
from agent.store import codes
from agent.store import maintenance as mt

#: Least seconds between two attempts to open a store that could not be opened.
RETRY_S = 1.0


#: An I/O error while fewer bytes than this are free counts as a full disk: opening a WAL
#: database creates its ``-shm`` file, and on a full tmpfs SQLite reports that as
#: SQLITE_IOERR (an extended code of it), not SQLITE_FULL.
FULL_BELOW_BYTES = 1 << 20


def no_room(exc: BaseException, path: str) -> bool:
    """True when ``exc`` (or its cause) means the disk holding ``path`` is full: SQLITE_FULL,
    ENOSPC/EDQUOT, or SQLITE_IOERR with less than :data:`FULL_BELOW_BYTES` free.

    >>> no_room(OSError(errno.ENOSPC, "No space left on device"), "/")
    True
    >>> no_room(OSError(errno.EACCES, "Permission denied"), "/")
    False
    """
    if mt.is_disk_full(exc):
        return True
    for e in (exc, exc.__cause__):
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if (codes.primary_code(e) == codes.SQLITE_IOERR
                and mt.free_bytes(path) < FULL_BELOW_BYTES):
            return True
    return False


def bare_message(exc: AgentError) -> str:
    """``exc``'s message without its ``(key=value, ...)`` context suffix.

    >>> bare_message(AgentError("disk full", op="open"))
    'disk full'
    """
    text = str(exc)
    details = ", ".join(f"{k}={v}" for k, v in exc.context.items())
    suffix = f" ({details})"
    return text[: -len(suffix)] if details and text.endswith(suffix) else text


class Deferred:
    """The state of a store that is not open yet.

    Args:
        error: Why the last attempt failed (the store's description).
        now: ``monotonic()`` of that attempt.
    """

    def __init__(self, error: str, now: float) -> None:
        self.error = error
        self.since = now
        self.next_try = now + RETRY_S
        self.attempts = 1

    def due(self, now: float) -> bool:
        """True when another attempt to open may be made now."""
        return now >= self.next_try

    def failed(self, error: str, now: float) -> None:
        """Another attempt failed."""
        self.error = error
        self.attempts += 1
        self.next_try = now + RETRY_S
