"""Files the fleet writes that hold secrets or data: owner-only, whatever the caller's umask.

* :func:`private_umask` makes every file and directory the process creates from then on
  0600/0700 (``umask 077``): the SQLite database and its WAL/SHM files, the state directory, the
  generated admin token, training outputs. systemd's ``UMask=0077`` does the same for the unit;
  this covers ``edge-fleet`` run by hand or under another supervisor.
* :func:`create_secret_file` opens a NEW file for a secret (``O_EXCL``: an existing file or a
  symlink planted at the path is refused, never overwritten or followed) with mode 0600.
* :func:`private_copy` puts a secret in a fresh 0700 directory as a 0600 file, so worker
  processes can read it by path instead of inheriting it in their environment.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import IO

from fleet.errors import ConfigError

#: File and directory modes the fleet gives what it writes.
FILE_MODE, DIR_MODE = 0o600, 0o700


def private_umask() -> int:
    """Set the process umask to 077; returns the previous one."""
    return os.umask(0o077)


def create_secret_file(path: Path) -> IO[str]:
    """Open a new file at ``path`` for writing, mode 0600 (text, UTF-8).

    Raises:
        ConfigError: ``path`` exists (a file or a symlink) or cannot be created.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)
    except FileExistsError:
        raise ConfigError(f"{path} exists: refusing to overwrite it") from None
    except OSError as exc:
        raise ConfigError(f"cannot create {path}: {exc}") from None
    os.fchmod(fd, FILE_MODE)  # whatever the umask
    return os.fdopen(fd, "w", encoding="utf-8")


def private_copy(secret: str, name: str) -> Path:
    """Write ``secret`` to ``<new 0700 temp dir>/<name>`` (0600); remove it with
    :func:`remove_private_copy`.

    Raises:
        ConfigError: The temporary directory cannot be written.
    """
    try:
        folder = Path(tempfile.mkdtemp(prefix="edge-fleet-"))  # mode 0700 by mkdtemp
        path = folder / name
        with create_secret_file(path) as fh:
            fh.write(secret + "\n")
    except OSError as exc:
        raise ConfigError(f"cannot write a private copy of {name}: {exc}") from None
    return path


def remove_private_copy(path: Path) -> None:
    """Remove a file made by :func:`private_copy` and its directory."""
    shutil.rmtree(path.parent, ignore_errors=True)
