"""A watched image folder (``watch = true``): new images scored once each, across restarts.

Like Telegraf's ``directory_monitor`` input, :class:`WatchFolderCapture` keeps polling the
folder every ``poll_s`` seconds and never ends by itself. Each poll lists the folder's images
(the suffixes of :data:`agent.sources.camera_files.IMAGE_SUFFIXES` that pass the config's
``include``/``exclude`` globs, :class:`~agent.sources.camera_files.ImageNames`; not recursive)
and takes, in
name order, every file not scored yet whose size and ``st_mtime_ns`` are the same as at the
previous poll: a file still being written (it grew, or was touched, within the last poll) waits
for the next one. So an image is scored at the earliest one poll after it appeared. A writer that
pauses longer than ``poll_s`` in the middle of a file can still be read early; the truncated
file is then rejected (``unreadable_image``), and scored when it has changed again (its size and
mtime no longer match what was remembered).

A file is identified by its name relative to the folder, its size and its mtime (ns): a file
rewritten in place under the same name counts as a new image.

Checkpoint (:class:`FolderCheckpoint`): the files done are remembered in the agent's store
(table ``camera_files``, :mod:`agent.store.camera_files`). A file is marked only after its
frame was scored and the alert it raised (if any) was stored: the camera stream hands the mark
(:class:`ScoredFile`) to the agent's main loop behind the frame's alert, on the same queue. A
rejected file (unreadable, too small, cannot be converted) is marked when rejected, so it is said
once, not again after a restart. A frame the model failed on is not marked (scored again after
a restart). Delivery is at least once: a crash (``kill -9``) between scoring and marking
scores the file in flight again at the next start (its alert then has a new id); a power cut
may also forget the last marks (the store commits them without an fsync of their own). Without a
store (tests, benchmarks) the checkpoint lives in memory only.

The remembered set is bounded by the folder: every :data:`PRUNE_EVERY_POLLS` polls, entries of
files missing from the folder at every pruning for :data:`FORGET_AFTER_S` (a day) are forgotten
(never when a poll lists no image at all). The grace period is what keeps an unmounted share
from being scored all over again: with an empty file system mounted over a watched folder
of 3,210 scored files and one image put in it, after 60 polls the entries were forgotten and
3,082 files were scored again once the share was back. An entry is forgotten only after a day
of absence counted by this process (a restart counts afresh), so the table holds at most about a
day's worth of deleted files beyond the folder's own.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from agent.errors import RecordError, SourceError, StoreError
from agent.extras import install_hint
from agent.records import FrameOrigin
from agent.sources.camera_files import ImageNames
from agent.sources.image_file import read_image_file

log = logging.getLogger("agent.camera")

#: Polls between two prunings of the checkpoint (files gone from the folder are forgotten).
PRUNE_EVERY_POLLS = 60
#: Seconds a done file must have been missing (at every pruning since) before it is forgotten.
FORGET_AFTER_S = 86_400.0
#: What :meth:`WatchFolderCapture.read` returns when no file is ready: wait ``poll_s``, ask again.
IDLE = object()
#: Reason of a folder that cannot be listed (metric label).
UNLISTABLE = "unreadable_folder"

FileKey = tuple[int, int]
"""``(size in bytes, st_mtime_ns)`` of a file."""


class CheckpointStore(Protocol):
    """What the checkpoint needs of the store (:class:`agent.store.sqlite.Store` has it)."""

    def scored_files(self, stream: str) -> dict[str, FileKey]:
        """Every file marked for ``stream``: relative name -> ``(size, mtime_ns)``."""
        ...

    def mark_file_scored(self, stream: str, name: str, size: int, mtime_ns: int) -> None:
        """Remember one file as done (replacing an older entry of the same name)."""
        ...

    def forget_scored_files(self, stream: str, names: Sequence[str]) -> None:
        """Forget the entries of ``names``."""
        ...


class FolderCheckpoint:
    """The files of one stream's watched folder that are done, in memory and in the store.

    Thread-safe: the grabber takes files and marks rejected ones; the agent's main loop marks
    scored ones (:class:`ScoredFile`).

    Args:
        stream: The stream name (the store's key).
        store: Where marks are kept; None = in memory only.
        clock: Monotonic seconds, for :data:`FORGET_AFTER_S`.

    Raises:
        SourceError: From the constructor when the store cannot be read.
    """

    def __init__(self, stream: str, store: CheckpointStore | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream
        self._store = store
        self._clock = clock
        #: Done files missing from the folder: name -> clock() when first found missing.
        self._missing_since: dict[str, float] = {}
        self._lock = threading.Lock()
        try:
            self._done: dict[str, FileKey] = ({} if store is None else store.scored_files(stream))
        except StoreError as exc:
            raise SourceError(f"camera checkpoint cannot be read: {exc}", stream=stream) from exc
        self._inflight: dict[str, FileKey] = {}
        self.mark_errors = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._done)

    def known(self, name: str, key: FileKey) -> bool:
        """The file ``name`` with ``key`` was scored already or is in flight."""
        with self._lock:
            return self._done.get(name) == key or self._inflight.get(name) == key

    def forget_inflight(self) -> None:
        """Drop the files taken but never marked (a new capture reads them again)."""
        with self._lock:
            self._inflight.clear()

    def take(self, name: str, key: FileKey) -> None:
        """The file is being read and scored (not marked yet)."""
        with self._lock:
            self._inflight[name] = key

    def done(self, name: str) -> None:
        """Mark the file taken as ``name`` as done (memory and store); no-op if not taken.

        A store that fails is counted in :attr:`mark_errors` and said once: the file is
        remembered in memory and scored again after a restart (at least once).
        """
        with self._lock:
            key = self._inflight.pop(name, None)
            if key is None:
                return
            self._done[name] = key
        if self._store is None:
            return
        try:
            self._store.mark_file_scored(self.stream, name, *key)
        except StoreError as exc:
            self.mark_errors += 1
            if self.mark_errors == 1:
                log.warning("camera %s: scored file not checkpointed (scored again after a "
                            "restart): %s", self.stream, exc)

    def prune(self, present: set[str]) -> int:
        """Forget the done files missing from ``present`` at every pruning for
        :data:`FORGET_AFTER_S`; returns how many were forgotten."""
        now = self._clock()
        with self._lock:
            missing = {n for n in self._done if n not in present}
            self._missing_since = {n: self._missing_since.get(n, now) for n in missing}
            gone = [n for n, t in self._missing_since.items() if now - t >= FORGET_AFTER_S]
            for name in gone:
                del self._done[name]
                del self._missing_since[name]
        if gone and self._store is not None:
            # the store counts a failure; the rows load at the next start and are pruned then
            with contextlib.suppress(StoreError):
                self._store.forget_scored_files(self.stream, gone)
        return len(gone)


@dataclass(frozen=True)
class ScoredFile:
    """A watched folder's file whose frame was scored: marked by :meth:`commit` once the
    alerts it raised are stored (the agent's main loop, behind those alerts).

    Attributes:
        stream: The stream name.
        name: The file, relative to the folder (``FrameOrigin.file``).
        checkpoint: The folder's checkpoint.
    """

    stream: str
    name: str
    checkpoint: FolderCheckpoint

    def commit(self) -> None:
        """Mark the file done."""
        self.checkpoint.done(self.name)


class WatchFolderCapture:
    """A watched folder as a capture: one new, stable image per :meth:`read`; see the module
    docstring.

    Args:
        folder: The folder.
        checkpoint: Files done (skipped) and where new marks go.
        names: Which files are scored (default: every image suffix).

    Raises:
        SourceError: From the constructor when Pillow is not installed. A missing folder is an
            outage (the polls fail until it can be listed), not an error: a share may be
            mounted after the agent starts.
    """

    def __init__(self, folder: Path, checkpoint: FolderCheckpoint,
                 names: ImageNames | None = None) -> None:
        try:
            import PIL  # noqa: F401, PLC0415 - checked here, used by read_image_file
        except ImportError as exc:
            raise SourceError(f"Pillow is not installed: {install_hint('camera')}") from exc
        # A missing folder is not an error here: a share mounted after the agent starts is
        # listed by a later poll; until then each poll fails as an outage (red, one WARNING).
        self._folder = folder
        self._checkpoint = checkpoint
        self._names = names if names is not None else ImageNames()
        checkpoint.forget_inflight()  # abandoned by a previous capture: read them again
        self._ready: deque[tuple[Path, str, FileKey]] = deque()
        self._pending: dict[str, FileKey] = {}  # seen at the last poll, not stable yet
        self.listing_failed = False  # the last poll could not list the folder (an outage)
        self.polls = 0
        self.origin: FrameOrigin | None = None  # the file read last

    def read(self) -> tuple[bool, Any]:
        """The next stable new image, a :class:`agent.errors.RecordError` for a rejected one
        (or a folder that cannot be listed, said once per outage), or ``(True, IDLE)`` when
        none is ready (the caller waits ``poll_s``). Never ``(False, None)``: it never ends."""
        if not self._ready:
            problem = self._poll()
            if problem is not None:
                return True, problem
            if not self._ready:
                return True, IDLE
        path, name, key = self._ready.popleft()
        self.origin = FrameOrigin(name)
        self._checkpoint.take(name, key)
        try:
            img = read_image_file(path)
        except RecordError as exc:
            self._checkpoint.done(name)  # rejected: said once, also across restarts
            return True, exc
        return True, img

    def _poll(self) -> RecordError | None:
        """List the folder once; queue the files that are stable and not done."""
        self.polls += 1
        try:
            # os.scandir and plain names, not pathlib: measured, 55 ms per poll of
            # 2,609 files through pathlib (about 5 % of a core idle at poll_s = 1); 2,600 files
            # here (CI load): 64-69 ms pathlib, 21 ms scandir, the same names, keys and order
            names = self._names
            with os.scandir(self._folder) as it:
                entries = sorted((e for e in it if names(os.fsdecode(e.name))),
                                 key=lambda e: e.name)
        except OSError as exc:
            if self.listing_failed:
                return None
            self.listing_failed = True
            return RecordError(f"camera folder cannot be listed: {exc}", UNLISTABLE,
                               path=str(self._folder))
        self.listing_failed = False
        pending: dict[str, FileKey] = {}
        present: set[str] = set()
        for entry in entries:
            try:
                st = entry.stat()  # follows a symlink, as Path.stat
            except OSError:
                continue  # gone since the listing
            if not stat.S_ISREG(st.st_mode):
                continue
            name = os.fsdecode(entry.name)
            path = self._folder / entry.name
            present.add(name)
            key = (st.st_size, st.st_mtime_ns)
            if self._checkpoint.known(name, key):
                continue
            if self._pending.get(name) == key:
                self._ready.append((path, name, key))
            else:
                pending[name] = key
        self._pending = pending
        if present and self.polls % PRUNE_EVERY_POLLS == 0:
            self._checkpoint.prune(present)
        return None

    def release(self) -> None:
        self._ready.clear()
