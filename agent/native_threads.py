"""Threads that run native code, and a process exit that never ends in the C++ runtime's abort.

Why: CPython up to 3.13 ends a daemon thread that wants the GIL back after interpreter
finalization has begun with ``pthread_exit()``. The forced unwind runs through the C++ frame
that released the GIL (OpenCV's and ONNX Runtime's guards, whose destructors take it back and
must not throw), and the C++ runtime aborts: ``terminate called without an active exception``,
SIGABRT, exit status 134, after everything else went right. A camera's frame grabber still
inside ``cv2.VideoCapture.read()`` when the interpreter exits is such a thread.

How the agent avoids it: every component whose thread calls into native code registers that
thread (:func:`track`) and joins it when it closes, with a bounded wait (camera grabbers and
camera streams: :mod:`agent.sources.camera`, :mod:`agent.services.camera`). The last thing the
CLI (and the camera benchmark) does is :func:`finish`: it joins what is still tracked and alive,
for at most ``timeout_s`` in all. When a thread is still alive after that (a camera read that
never returns, a hung RTSP peer), it logs one WARNING naming the threads, flushes the log
handlers, stdout and stderr (the store and its outbox were closed by the shutdown before), and
ends the process with ``os._exit(status)``: the exit status is the one the agent meant, and the
interpreter never finalizes under a thread that could abort it. When every thread ended,
:func:`finish` returns ``status`` and the process exits normally.

Tracked threads are held weakly in effect: ended ones are pruned on every call.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import NoReturn

log = logging.getLogger("agent")

#: Longest wait, in seconds, for the tracked threads at exit (all of them together).
EXIT_JOIN_S = 5.0

_lock = threading.Lock()
_tracked: list[tuple[threading.Thread, str]] = []


def track(thread: threading.Thread, what: str) -> None:
    """Register ``thread`` (started or about to be) as one that may be inside native code.

    Args:
        thread: The thread.
        what: What it does, for the exit WARNING (``"camera cam0 frame grabber"``).
    """
    with _lock:
        _tracked[:] = [(t, w) for t, w in _tracked if t.is_alive() or not t.ident]
        _tracked.append((thread, what))


def alive() -> list[str]:
    """What the tracked threads still running do (their ``what``), in registration order."""
    with _lock:
        return [w for t, w in _tracked if t.is_alive()]


def join_tracked(timeout_s: float, monotonic: Callable[[], float] = time.monotonic) -> list[str]:
    """Join the tracked threads for at most ``timeout_s`` seconds in all.

    The calling thread is never joined (a tracked thread may call this).

    Returns:
        What the threads still alive afterwards do (empty: every one ended).
    """
    deadline = monotonic() + max(0.0, timeout_s)
    with _lock:
        threads = [(t, w) for t, w in _tracked if t.is_alive()]
    me = threading.current_thread()
    for thread, _ in threads:
        if thread is not me:
            thread.join(max(0.0, deadline - monotonic()))
    return [w for t, w in threads if t.is_alive() and t is not me]


def flush_output() -> None:
    """Flush every handler of every logger, then stdout and stderr (errors ignored)."""
    loggers = [logging.getLogger()] + [
        lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)]
    for lg in loggers:
        for handler in lg.handlers:
            try:
                handler.flush()
            except Exception:  # noqa: S112 - a broken handler must not stop the exit
                continue
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            continue


def _hard_exit(status: int) -> NoReturn:
    os._exit(status)


def finish(status: int, timeout_s: float = EXIT_JOIN_S,
           exit_now: Callable[[int], NoReturn] = _hard_exit) -> int:
    """End the process safely with ``status``: see the module docstring.

    Args:
        status: The exit status the process should have.
        timeout_s: Longest wait for the tracked threads, seconds.
        exit_now: Ends the process without interpreter finalization (``os._exit``; tests
            pass a fake that raises).

    Returns:
        ``status``, when every tracked thread ended (the caller then exits normally).
        Otherwise it does not return: ``exit_now(status)`` after one WARNING and the flush.
    """
    stuck = join_tracked(timeout_s)
    if not stuck:
        return status
    log.warning("exiting with %d thread(s) still inside native code after %.0f s (%s); "
                "ending the process without interpreter shutdown, exit status %d",
                len(stuck), timeout_s, ", ".join(stuck), status)
    flush_output()
    exit_now(status)
