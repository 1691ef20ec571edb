"""Work folders and ports of the benchmarks that start peers (fleet, broker, databases).

Every benchmark cleans up after itself: :func:`workspace` yields the folder it writes to,
``--workdir`` as given (created when missing and kept afterwards: the user asked for it), else a
fresh temporary folder that is removed when the benchmark ends, also after an error, Ctrl-C or
SIGTERM (turned into ``SystemExit`` while the folder is in use, so ``finally`` blocks run).
:func:`pick_port` is ``--port`` or a free loopback port. :func:`add_arguments` adds both options.

Used as ``from workspace import ...`` (a benchmark's own folder is on ``sys.path`` when it runs
as ``python benchmarks/<name>.py``).
"""

from __future__ import annotations

import argparse
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType


def _exit_on_sigterm(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


@contextmanager
def workspace(workdir: Path | None, prefix: str, parent: Path | None = None) -> Iterator[Path]:
    """The benchmark's work folder (module docstring).

    Args:
        workdir: ``--workdir``: used as is and kept; None = a temporary folder.
        prefix: Name prefix of the temporary folder.
        parent: Where the temporary folder is made (None = the system's temp dir).

    Yields:
        The folder (exists).
    """
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm) if main else None
    try:
        if workdir is not None:
            workdir.mkdir(parents=True, exist_ok=True)
            yield workdir
        else:
            with tempfile.TemporaryDirectory(prefix=prefix, dir=parent,
                                             ignore_cleanup_errors=True) as tmp:
                yield Path(tmp)
    finally:
        if main and previous is not None:
            signal.signal(signal.SIGTERM, previous)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pick_port(port: int | None) -> int:
    """``port`` when given, else a free one."""
    return port if port is not None else free_port()


def add_arguments(ap: argparse.ArgumentParser, port_help: str | None = None) -> None:
    """Add ``--workdir`` and (with ``port_help``) ``--port`` to ``ap``."""
    ap.add_argument("--workdir", type=Path, default=None,
                    help="work folder (created, kept afterwards); default: a temporary folder "
                    "removed at the end")
    if port_help is not None:
        ap.add_argument("--port", type=int, default=None, help=port_help)


if __name__ == "__main__":  # pragma: no cover - a library module
    sys.exit("benchmarks/workspace.py is a helper of the other benchmarks")
