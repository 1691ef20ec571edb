"""The alert-id ledger: the highest alert sequence number issued per stream, outside SQLite.

Why: damaged WAL frames make SQLite drop its last commits at the next open without reporting
corruption (the WAL is read up to the first frame whose checksum fails; ``quick_check`` passes).
The stored counters then lie below numbers already delivered, and the restarted agent issued
those alert ids again for different alerts (13 in one such case), which consumers and the fleet
discard as duplicates. The ledger is a second, independent record of the same counters: a small
JSON file next to the database (``<db>.ids``, ``{"stream": last seq}``) rewritten atomically
(temporary file, fsync, rename, fsync of the folder) after every new alert number the store
commits. At open the store takes ``max(stored counter, ledger)`` per stream, so a number is never
issued twice unless both the database's tail and the ledger's last rewrite are lost.

Reservations (publish while committing, :mod:`agent.store.writer`): an alert that is published
before its row commits must hold a number no restarted agent issues again even if the process dies
before the commit. :meth:`IdLedger.take` hands out numbers from a block reserved in the ledger
(``"<stream>/reserved": top``, written durably before the first number of the block is handed out;
``/`` is not allowed in stream names), :data:`RESERVE_BLOCK` numbers per rewrite, so the hot path
rewrites the file once per block, not per alert; a block the store writer's top-up is still
writing (or failed to write) is not handed out from. :meth:`IdLedger.mark` is the larger of the
issued and the reserved mark, so the store numbers on above every reserved block at the next
start: after a restart the stream's ids jump by at most one block (gaps, never reuse). Only the
issued marks are compared with the stored counters at open (a reserved block is not a lost
commit).

The file survives a quarantined database (it is not renamed with it). A missing or unreadable
ledger counts as empty (WARNING); a failed rewrite (disk full) is logged once per episode and the
store carries on (the keeper's wall-clock jump covers alerts numbered while the disk is full,
:mod:`agent.publish.volatile`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import Callable

log = logging.getLogger("agent.store")

#: Longest ledger file read, bytes (a few thousand streams).
MAX_LEDGER_BYTES = 1 << 20
#: Numbers reserved per ledger rewrite by :meth:`IdLedger.take`.
RESERVE_BLOCK = 1000
#: Key suffix of a stream's reserved mark in the ledger file.
RESERVED_SUFFIX = "/reserved"


class IdLedger:
    """Per-stream high-water marks of alert sequence numbers (thread-safe).

    Args:
        path: The ledger file; None keeps it in memory only (``:memory:`` stores).
    """

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._lock = threading.Lock()  # the marks (held briefly, never across file I/O)
        self._io_lock = threading.Lock()  # one rewrite at a time, each of the newest marks
        self._failing = False
        loaded = self._load()
        #: Highest number issued (committed) per stream.
        self.marks: dict[str, int] = {k: v for k, v in loaded.items()
                                      if not k.endswith(RESERVED_SUFFIX)}
        #: Highest number reserved per stream (:meth:`take`; may lie above ``marks``).
        self.reserved: dict[str, int] = {k[:-len(RESERVED_SUFFIX)]: v for k, v in loaded.items()
                                         if k.endswith(RESERVED_SUFFIX)}
        self._next: dict[str, int] = {}  # next number :meth:`take` hands out, per stream
        #: Reserved marks known to be in the file (``reserved`` may run ahead of it while a
        #: rewrite is in progress or failing): :meth:`take` hands out numbers up to these only.
        self._durable: dict[str, int] = dict(self.reserved)

    def _load(self) -> dict[str, int]:
        if self.path is None:
            return {}
        try:
            with open(self.path, "rb") as fh:
                raw = fh.read(MAX_LEDGER_BYTES + 1)
        except FileNotFoundError:
            return {}
        except OSError as exc:
            log.warning("alert id ledger %s unreadable (%s); ids continue from the store",
                        self.path, exc)
            return {}
        try:
            if len(raw) > MAX_LEDGER_BYTES:
                raise ValueError(f"over {MAX_LEDGER_BYTES} bytes")
            body = json.loads(raw.decode("utf-8"))
            if not isinstance(body, dict):
                raise ValueError("not a JSON object")
            return {str(k): int(v) for k, v in body.items()
                    if isinstance(v, int) and not isinstance(v, bool) and v > 0}
        except (ValueError, UnicodeDecodeError) as exc:
            log.warning("alert id ledger %s is damaged (%s); ids continue from the store",
                        self.path, exc)
            return {}

    def mark(self, stream: str) -> int:
        """The highest number the ledger knows issued or reserved for ``stream`` (0 for none)."""
        with self._lock:
            return max(self.marks.get(stream, 0), self.reserved.get(stream, 0))

    def take(self, stream: str, floor: Callable[[], int], block: int = RESERVE_BLOCK) -> int:
        """The next number of ``stream`` from its reserved block, reserving a new block
        durably first when the block is used up (see the module docstring).

        Args:
            stream: Stream name.
            floor: The last number the store issued (read once per stream, before the first
                number this ledger hands out; not called with the ledger's lock held).
            block: Numbers reserved per rewrite.

        Returns:
            A number above every number issued or reserved before, recorded in the file
            before it is returned (or the ledger is in memory only).

        Raises:
            OSError: The ledger could not be rewritten (disk full); nothing was taken.
        """
        with self._lock:
            known = stream in self._next
        low = 0 if known else int(floor())
        with self._lock:
            nxt = max(self._next.get(stream, 0), low + 1, self.marks.get(stream, 0) + 1)
            if not known:  # a block reserved by an earlier process may be partly published
                nxt = max(nxt, self.reserved.get(stream, 0) + 1)
            elif nxt <= self._durable.get(stream, 0):  # not a block whose rewrite is pending
                self._next[stream] = nxt + 1
                return nxt
        self._reserve(stream, nxt + block - 1)
        with self._lock:
            nxt = max(nxt, self._next.get(stream, 0))
            self._next[stream] = nxt + 1
            return nxt

    def top_up(self, stream: str, block: int = RESERVE_BLOCK) -> None:
        """Reserve the next block of ``stream`` ahead when less than half of its block is left
        (the store writer's thread, so that :meth:`take` rarely writes; never raises)."""
        with self._lock:
            nxt = self._next.get(stream)
            if nxt is None or self.reserved.get(stream, 0) - nxt >= block // 2:
                return
        try:
            self._reserve(stream, nxt + block - 1)
        except OSError:
            return  # logged by _save; take() tries again when the block is used up

    def _reserve(self, stream: str, top: int) -> None:
        """Raise the reserved mark of ``stream`` to ``top`` and rewrite the file.

        Raises:
            OSError: The rewrite failed; the mark is restored.
        """
        with self._lock:
            if self._durable.get(stream, 0) >= top:
                return
            old = self.reserved.get(stream)
            top = self.reserved[stream] = max(top, old or 0)
            if self.path is None:
                self._durable[stream] = top
                return
        try:
            self._save()
        except OSError:
            with self._lock:
                if self.reserved.get(stream) == top and self._durable.get(stream, 0) < top:
                    if old is None:
                        del self.reserved[stream]
                    else:
                        self.reserved[stream] = old
            raise

    def record(self, stream: str, seq: int) -> None:
        """Remember ``seq`` as issued for ``stream`` (durable when the rewrite succeeds; never
        raises: a failure is logged once per episode)."""
        with self._lock:
            if seq <= self.marks.get(stream, 0):
                return
            self.marks[stream] = int(seq)
            if self.path is None:
                return
        try:
            self._save()
        except OSError:
            return

    def _save(self) -> None:
        """Rewrite the file with the newest marks; a failure is logged once per episode.

        Raises:
            OSError: The rewrite failed.
        """
        with self._io_lock:
            try:
                self._write()
            except OSError as exc:
                if not self._failing:
                    self._failing = True
                    log.warning("alert id ledger %s: cannot save (%s); retried with the next "
                                "alert", self.path, exc)
                raise
            if self._failing:
                self._failing = False
                log.info("alert id ledger %s saved again", self.path)

    def _write(self) -> None:
        assert self.path is not None
        tmp = self.path + ".tmp"
        with self._lock:  # the newest marks, taken once this rewrite may run
            body = dict(self.marks)
            reserved = dict(self.reserved)
            body.update({k + RESERVED_SUFFIX: v for k, v in reserved.items()})
        data = json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except OSError:
            with contextlib.suppress(OSError):
                os.remove(tmp)
            raise
        folder = os.open(os.path.dirname(self.path) or ".", os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
        with self._lock:
            for stream, top in reserved.items():
                self._durable[stream] = max(self._durable.get(stream, 0), top)
