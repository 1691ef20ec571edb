"""Permissions of the secret files the agent reads and of the data files it writes.

Secret files read (``fleet.token_file``, ``mqtt.password_file``, ``mqtt.key_file``,
``mqtt.cert_file`` when it holds the key, ``mqtt.key_password_file``, the ``password_file`` of
``mqtt`` and ``opcua`` stream sources), checked each time one is read
(:func:`check_secret_file`), as OpenSSH checks private keys:

* writable by the group or by others (``mode & 0o022``): **refused** with :class:`ConfigError`
  (whoever can write it can swap the device's identity or key for their own); ``edge-agent
  check-config`` reports it and ``run`` exits 78;
* readable by the group or by others (``mode & 0o044``): a **warning**, once per file and
  process (a service group that must read the file, ``0640 root:edge-agent``, is a deliberate
  choice this does not forbid). Files inside ``$CREDENTIALS_DIRECTORY`` are not warned about:
  systemd restricts them to the service with an ACL, whose mask shows as group bits.

The mode is the file's own after symlinks are followed (the target is what is read). The CA
files (``mqtt.ca_file``, ``fleet.ca_file``) are trust anchors, not secrets: refused when others
can write them (:func:`check_trust_file`), never warned about for being readable.

Files written (:func:`private_umask`, :func:`secure_state`): the agent runs with umask ``0o077``,
so every file and directory it creates (store, WAL, state lock, model packages, downloads) is
``0600``/``0700`` whatever the caller's umask; the state directory, the store's files and the
model directories that already exist with wider modes (made by an older version, or by hand)
are narrowed at start when the agent owns them, otherwise warned about.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from collections.abc import Mapping
from pathlib import Path

from agent.errors import ConfigError

log = logging.getLogger("agent.secrets")

#: umask of the agent process: files 0600, directories 0700.
PRIVATE_UMASK = 0o077
#: The store's files besides the database (WAL, shared memory, rollback journal, disk reserve).
STORE_SIDECARS = ("-wal", "-shm", "-journal", "-reserve")

_warned: set[str] = set()
_warned_lock = threading.Lock()


def _first_time(key: str) -> bool:
    with _warned_lock:
        if key in _warned:
            return False
        _warned.add(key)
        return True


def _who(bits: int) -> str:
    return " and ".join(w for w, b in (("its group", 0o070), ("others", 0o007)) if bits & b)


def _in_credentials_dir(path: str, environ: Mapping[str, str]) -> bool:
    cred = environ.get("CREDENTIALS_DIRECTORY", "")
    if not cred:
        return False
    try:
        return os.path.commonpath([os.path.realpath(path), os.path.realpath(cred)]) == \
            os.path.realpath(cred)
    except ValueError:
        return False


def _refuse_writable(path: str, key: str, what: str, fix: str) -> int | None:
    """The file's permission bits; ConfigError when its group or others can write it; None
    when it cannot be stat'ed (reading it reports that)."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return None
    if mode & 0o022:
        msg = (f"{key}: {path!r} is writable by {_who(mode & 0o022)} (mode {mode:04o}); "
               f"refusing {what} that others can replace: chmod {fix} {path}")
        raise ConfigError(msg, problems=[msg])
    return mode


def check_trust_file(path: str, key: str) -> None:
    """Refuse a trust anchor (``mqtt.ca_file``, ``fleet.ca_file``) its group or others can
    write: whoever can add a CA to it can impersonate the broker or the fleet. Reading it is
    fine (it holds no secret).

    Raises:
        ConfigError: The file is writable by its group or by others.
    """
    _refuse_writable(path, key, "a CA file", "644")


def check_secret_file(
    path: str, key: str, *, environ: Mapping[str, str] | None = None,
    logger: logging.Logger | None = None,
) -> None:
    """Refuse a secret file others can write; warn (once) when others can read it.

    Args:
        path: The file (symlinks followed).
        key: Its config key, named in the messages (``fleet.token_file``).
        environ: Environment (``CREDENTIALS_DIRECTORY``); None = ``os.environ``.
        logger: Where the warning goes; None = ``agent.secrets``.

    Raises:
        ConfigError: The file is writable by its group or by others. A file that cannot be
            stat'ed passes: reading it reports that problem.
    """
    mode = _refuse_writable(path, key, "a secret", "600")
    if mode is None:
        return
    env = os.environ if environ is None else environ
    if mode & 0o044 and not _in_credentials_dir(path, env) and _first_time("read:" + path):
        (logger or log).warning(
            "%s: %r is readable by %s (mode %04o); a secret should be readable by this "
            "service only: chmod 600 %s (or use systemd's LoadCredential=)",
            key, path, _who(mode & 0o044), mode, path,
        )


def private_umask() -> int:
    """Set the process umask to :data:`PRIVATE_UMASK`; returns the previous one (to restore)."""
    return os.umask(PRIVATE_UMASK)


def tighten(path: Path, mode: int) -> bool:
    """Clear every permission bit of ``path`` outside ``mode`` (``0o700``, ``0o600``).

    Only a file or directory this process owns is changed, never a symlink, nor a sticky
    directory (``/tmp``-like, shared on purpose); those are warned about once instead.

    Returns:
        True when the mode was changed.
    """
    try:
        st = path.lstat()
    except OSError:
        return False
    current = stat.S_IMODE(st.st_mode)
    if stat.S_ISLNK(st.st_mode) or not current & ~mode & 0o777:
        return False
    if st.st_uid != os.geteuid() or current & stat.S_ISVTX:
        if _first_time("loose:" + str(path)):
            log.warning("%s is accessible to others (mode %04o) and not this process's to "
                        "narrow; it holds the agent's data: chmod %o it", path, current,
                        mode)
        return False
    try:
        os.chmod(path, current & mode)
    except OSError as exc:
        log.warning("cannot narrow %s to mode %04o: %s", path, current & mode, exc)
        return False
    log.info("narrowed %s from mode %04o to %04o (agent data is private)", path, current,
             current & mode)
    return True


def secure_state(state_dir: Path, store_path: Path) -> None:
    """Narrow what exists of the agent's data to owner-only: ``state_dir`` (0700), the store
    and its sidecars (0600), ``<state_dir>/models`` and every directory below it (0700) and
    their files (0600). Missing paths are skipped (the umask covers what is made later)."""
    tighten(state_dir, 0o700)
    for suffix in ("", *STORE_SIDECARS):
        tighten(Path(str(store_path) + suffix), 0o600)
    models = state_dir / "models"
    if not models.is_dir() or models.is_symlink():
        return
    tighten(models, 0o700)
    for root, dirs, files in os.walk(models):
        for name in dirs:
            tighten(Path(root, name), 0o700)
        for name in files:
            tighten(Path(root, name), 0o600)


def read_secret(path: str, key: str, what: str = "secret") -> str:
    """The first line of a secret file, after :func:`check_secret_file`.

    Args:
        path: The file.
        key: Its config key, named in the messages (``mqtt.key_password_file``).
        what: What the line is, for the message about an empty file ("password").

    Raises:
        ConfigError: The file is writable by others, unreadable, not UTF-8, or its first line
            is empty.
    """
    check_secret_file(path, key)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        msg = f"{key}: cannot read {path!r}: {exc}"
        raise ConfigError(msg, problems=[msg]) from exc
    lines = text.splitlines()
    secret = lines[0] if lines else ""
    if not secret:
        msg = f"{key}: {path!r} is empty (the {what} is its first line)"
        raise ConfigError(msg, problems=[msg])
    return secret


def warn_clear_password(
    key: str, host: str, port: int, username: str | None, fix: str,
    logger: logging.Logger | None = None,
) -> bool:
    """Warn once per process, key and peer that a password goes to a non-loopback ``host``
    without transport encryption (the ``[mqtt]`` publisher's warning, for the other clients
    that send one: the ``mqtt`` and ``opcua`` sources).

    Args:
        key: The config key of the password file, named in the message.
        host, port: The peer.
        username: The user the password belongs to.
        fix: What to configure instead (``set source.ca_file``).
        logger: Where the warning goes; None = ``agent.secrets``.

    Returns:
        True when this call logged the warning.
    """
    from agent.loopback import is_loopback  # noqa: PLC0415 - keep this module's imports small

    if is_loopback(host) or not _first_time(f"clear:{key}:{host}:{port}"):
        return False
    (logger or log).warning(
        "%s: the password for user %r goes to %s:%d over plain TCP, readable by anyone on the "
        "path; %s (docs/security.md)", key, username, host, port, fix,
    )
    return True
