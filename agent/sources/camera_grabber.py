"""The camera source's frame grabber: one capture and the thread reading it.

A :class:`Grabber` reads its capture in a thread of its own and hands each frame to its owner
(:meth:`agent.sources.camera.CameraSource.offer`); it is replaced as a whole (new capture, new
thread, next generation) on reconnect. Its loop ends when the owner's ``stopping`` flag is set
or the owner moved to another generation, when the input ends or a live read fails; the capture
is released by the thread itself as it ends (OpenCV captures are not thread-safe), and
:meth:`Grabber.join` waits for that, bounded. The thread is tracked by
:mod:`agent.native_threads`, so a read that never returns cannot make the process abort at exit.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Protocol

import numpy as np

from agent import native_threads
from agent.errors import RecordError, SourceError
from agent.records import FrameOrigin
from agent.sources.base import StatusListener
from agent.sources.camera_capture import Capture, Image, capture_origin
from agent.sources.camera_config import CameraConfig
from agent.sources.camera_watch import IDLE


class GrabberOwner(Protocol):
    """What a grabber needs of its source (:class:`agent.sources.camera.CameraSource`)."""

    stream: str
    config: CameraConfig
    live: bool
    stopping: threading.Event
    generation: int
    idle_mono: float | None
    status_listener: StatusListener | None
    monotonic: Callable[[], float]

    def offer(self, image: Image, generation: int, origin: FrameOrigin | None = None) -> None:
        """Hand a frame to the consumer."""
        ...

    def bad_input(self, error: RecordError) -> None:
        """Count and report a rejected input."""
        ...

    def wake(self) -> None:
        """Wake the consumer."""
        ...


class Grabber:
    """One capture and the thread reading it (replaced as a whole on reconnect)."""

    def __init__(self, cap: Capture, owner: GrabberOwner, generation: int) -> None:
        self.cap = cap
        self.generation = generation
        self.ended = False  # the file or folder ended
        self.failed = False  # a read failed on a live source
        self._owner = owner
        self.thread = threading.Thread(target=self._run, name=f"camera-grab-{owner.stream}",
                                       daemon=True)

    def start(self) -> None:
        """Start the thread (tracked by :mod:`agent.native_threads`: it runs OpenCV code)."""
        native_threads.track(self.thread, f"camera {self._owner.stream} frame grabber")
        self.thread.start()

    def join(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the thread to end (after the owner set its ``stopping``
        flag or moved to a new generation); True when it ended, its capture then released.

        A thread still inside a blocking ``read()`` (a silent RTSP peer) is left running: its
        capture is not released from this thread (OpenCV captures are not thread-safe); it
        releases it itself when the read returns, and :func:`agent.native_threads.finish`
        ends the process without interpreter shutdown if it is still running at exit.
        """
        if self.thread.ident is not None:
            self.thread.join(max(0.0, timeout_s))
        return not self.thread.is_alive()

    def _run(self) -> None:
        o = self._owner
        period = 1.0 / o.config.fps if o.config.fps > 0 and not o.live else 0.0
        due = o.monotonic()
        folder_down = False  # a watched folder that cannot be listed (share unmounted)
        try:
            while not o.stopping.is_set() and o.generation == self.generation:
                if period:
                    delay = due - o.monotonic()
                    if delay > 0 and o.stopping.wait(delay):
                        return
                    due = max(due + period, o.monotonic() - period)
                ok, img = self.cap.read()
                if bool(getattr(self.cap, "listing_failed", False)) != folder_down:
                    # an outage (red in /healthz, one line when it starts and one when it
                    # ends), not idle polls: those kept the stream green while the folder was gone
                    folder_down = not folder_down
                    if o.status_listener is not None:
                        o.status_listener(SourceError("camera folder cannot be listed",
                                                path=str(o.config.folder))
                                    if folder_down else None)
                if img is IDLE:  # a watched folder with nothing new: poll again later
                    if not folder_down:
                        o.idle_mono = o.monotonic()
                    if o.stopping.wait(o.config.poll_s):
                        return
                    continue
                if not ok or img is None:
                    if o.generation != self.generation:
                        return  # abandoned while blocked in read()
                    if o.live:
                        self.failed = True
                    else:
                        self.ended = True
                    o.wake()
                    return
                if isinstance(img, RecordError):
                    o.bad_input(img)
                    continue
                # counted abandoned if replaced
                o.offer(np.asarray(img), self.generation, capture_origin(self.cap))
        finally:
            with contextlib.suppress(Exception):  # a failing release must not kill the thread
                self.cap.release()

