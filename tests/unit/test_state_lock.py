"""One agent per state directory (agent.app.lock_state_dir)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.app import lock_state_dir
from agent.errors import AgentError


def test_second_lock_on_the_same_state_dir_is_refused_naming_the_holder(tmp_path: Path) -> None:
    first = lock_state_dir(tmp_path / "state")
    try:
        with pytest.raises(AgentError, match=f"in use by another edge-agent \\(pid {os.getpid()}"):
            lock_state_dir(tmp_path / "state")
    finally:
        first.close()
    again = lock_state_dir(tmp_path / "state")  # released on close
    again.close()


def test_separate_state_dirs_do_not_conflict(tmp_path: Path) -> None:
    a = lock_state_dir(tmp_path / "a")
    b = lock_state_dir(tmp_path / "b")
    a.close()
    b.close()


def test_a_state_dir_that_cannot_be_created_is_one_agent_error(tmp_path: Path) -> None:
    """Its parent is a regular file (a tester saw a traceback from mkdir here)."""
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(AgentError, match="cannot create the state lock"):
        lock_state_dir(blocker / "state")
