"""sd_notify: tell systemd READY, WATCHDOG, STATUS and STOPPING (no-op without NOTIFY_SOCKET).

Protocol: newline-separated ``KEY=VALUE`` assignments in one datagram to the AF_UNIX socket named
by ``$NOTIFY_SOCKET`` (a leading ``@`` means the abstract namespace); see sd_notify(3).
"""

from __future__ import annotations

import os
import socket


class Notifier:
    """Send sd_notify messages.

    Args:
        socket_path: The notify socket; default ``$NOTIFY_SOCKET``. None or empty = no-op.
    """

    def __init__(self, socket_path: str | None = None) -> None:
        path = socket_path if socket_path is not None else os.environ.get("NOTIFY_SOCKET", "")
        self._address = "\0" + path[1:] if path.startswith("@") else path
        self._sock: socket.socket | None = None
        if self._address:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    @property
    def enabled(self) -> bool:
        """True when running under a service manager that listens."""
        return self._sock is not None

    def notify(self, **fields: str) -> bool:
        """Send ``KEY=VALUE`` lines (e.g. ``notify(READY="1", STATUS="running")``).

        Returns:
            True when sent; False when disabled or the socket is gone (never raises: a missing
            service manager must not stop the agent).
        """
        if self._sock is None:
            return False
        msg = "\n".join(f"{k}={v}" for k, v in fields.items()).encode()
        try:
            self._sock.sendto(msg, self._address)
        except OSError:
            return False
        return True

    def ready(self, status: str) -> bool:
        """READY=1 with a STATUS line."""
        return self.notify(READY="1", STATUS=status)

    def watchdog(self) -> bool:
        """WATCHDOG=1 (only call while every stage makes progress)."""
        return self.notify(WATCHDOG="1")

    def status(self, status: str) -> bool:
        """A STATUS= line for ``systemctl status``."""
        return self.notify(STATUS=status)

    def stopping(self) -> bool:
        """STOPPING=1."""
        return self.notify(STOPPING="1")

    def close(self) -> None:
        """Close the socket."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
