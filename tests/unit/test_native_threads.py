"""agent.native_threads: tracked threads are joined at exit; one that stays alive ends the
process with ``os._exit(status)`` after one WARNING and a flush (a real subprocess)."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from agent import native_threads

REPO = Path(__file__).resolve().parents[2]

STUCK = """
import logging, sys, threading
from agent import native_threads
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
never = threading.Event()
t = threading.Thread(target=never.wait, daemon=True, name="stuck")
native_threads.track(t, "camera cam0 frame grabber")
t.start()
print("last words", end="")  # unflushed: finish() must flush it
raise SystemExit(native_threads.finish(int(sys.argv[1]), timeout_s=0.2))
"""


def test_a_thread_still_alive_ends_the_process_with_the_status_after_a_flush() -> None:
    done = subprocess.run([sys.executable, "-c", STUCK, "3"], capture_output=True, text=True,
                          timeout=60, cwd=REPO, check=False)
    assert done.returncode == 3, done.stderr
    assert done.stdout == "last words"
    warnings = [line for line in done.stderr.splitlines() if "native code" in line]
    assert len(warnings) == 1 and "camera cam0 frame grabber" in warnings[0]


def test_ended_threads_are_joined_and_the_status_returned() -> None:
    go = threading.Event()
    t = threading.Thread(target=go.wait, args=(5.0,))
    native_threads.track(t, "worker")
    t.start()
    assert native_threads.alive() == ["worker"]
    go.set()

    def refuse(status: int) -> None:
        raise AssertionError(f"exit_now({status}) called")

    assert native_threads.finish(7, timeout_s=5.0, exit_now=refuse) == 7  # type: ignore[arg-type]
    assert not t.is_alive() and native_threads.alive() == []


def test_the_calling_thread_is_not_joined() -> None:
    result: list[list[str]] = []
    t = threading.Thread(target=lambda: result.append(native_threads.join_tracked(0.1)))
    native_threads.track(t, "self")
    t.start()
    t.join(5)
    assert result == [[]]
