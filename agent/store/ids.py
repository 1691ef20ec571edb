"""The alert-id ledger: the highest alert sequence number issued per stream, outside SQLite.

Why: damaged WAL frames make SQLite drop its last commits at the next open without reporting
corruption (the WAL is read up to the first frame whose checksum fails; ``quick_check`` passes).
The stored counters then lie below numbers already delivered, and the restarted agent issued
those alert ids again for different alerts (a tester saw 13), which consumers and the fleet
discard as duplicates. The ledger is a second, independent record of the same counters: a small
JSON file next to the database (``<db>.ids``, ``{"stream": last seq}``) rewritten atomically
(temporary file, fsync, rename, fsync of the folder) after every new alert number the store
commits. At open the store takes ``max(stored counter, ledger)`` per stream, so a number is never
issued twice unless both the database's tail and the ledger's last rewrite are lost.

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

log = logging.getLogger("agent.store")

#: Longest ledger file read, bytes (a few thousand streams).
MAX_LEDGER_BYTES = 1 << 20


class IdLedger:
    """Per-stream high-water marks of alert sequence numbers (thread-safe).

    Args:
        path: The ledger file; None keeps it in memory only (``:memory:`` stores).
    """

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._failing = False
        self.marks: dict[str, int] = self._load()

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
        """The highest number the ledger knows issued for ``stream`` (0 for none)."""
        with self._lock:
            return self.marks.get(stream, 0)

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
                self._write()
            except OSError as exc:
                if not self._failing:
                    self._failing = True
                    log.warning("alert id ledger %s: cannot save (%s); retried with the next "
                                "alert", self.path, exc)
                return
            if self._failing:
                self._failing = False
                log.info("alert id ledger %s saved again", self.path)

    def _write(self) -> None:
        assert self.path is not None
        tmp = self.path + ".tmp"
        data = json.dumps(self.marks, sort_keys=True, separators=(",", ":")).encode("utf-8")
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
