"""One agent per state directory: an exclusive ``flock`` on ``<state_dir>/agent.lock``."""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path
from typing import TextIO

from agent.errors import AgentError

log = logging.getLogger("agent")


def lock_state_dir(state_dir: Path) -> TextIO:
    """Take an exclusive lock on ``state_dir/agent.lock`` (one agent per state directory).

    Two agents on one state directory would share one outbox and sequence counter and fight over
    one MQTT client id. The lock (``fcntl.flock``) is released by the kernel when the process
    exits, however it exits.

    Returns:
        The open lock file (keep a reference for the life of the process).

    Raises:
        AgentError: another process holds the lock (its pid is named) or the file cannot be made.
    """
    path = state_dir / "agent.lock"
    try:
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        fh = open(path, "a+", encoding="utf-8",  # noqa: SIM115 - held for the process's life
                  opener=lambda p, f: os.open(p, f, 0o600))
    except OSError as exc:
        raise AgentError(f"cannot create the state lock {path}: {exc}") from exc
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.seek(0)
        holder = fh.read().strip() or "unknown"
        fh.close()
        raise AgentError(
            f"state directory {state_dir} is in use by another edge-agent (pid {holder}); "
            "give each agent its own agent.state_dir"
        ) from None
    try:  # unbuffered: a full disk leaves nothing in a buffer for close() to fail on
        os.ftruncate(fh.fileno(), 0)
        os.pwrite(fh.fileno(), f"{os.getpid()}\n".encode(), 0)
    except OSError as exc:  # e.g. a full disk: the lock is held, only the pid note failed
        log.warning("state lock %s: cannot write this process's pid into it (%s); the lock "
                    "holds, a second agent will not name this one", path, exc)
    return fh
