"""sd_notify: tell systemd READY, WATCHDOG, STATUS and STOPPING (no-op without NOTIFY_SOCKET).

Protocol: newline-separated ``KEY=VALUE`` assignments in one datagram to the AF_UNIX socket named
by ``$NOTIFY_SOCKET`` (a leading ``@`` means the abstract namespace); see sd_notify(3).

The watchdog interval: systemd passes ``WatchdogSec=`` as ``$WATCHDOG_USEC`` (microseconds, and
``$WATCHDOG_PID``, the process meant); sd_watchdog_enabled(3) recommends pinging at half of it.
"""

from __future__ import annotations

import math
import os
import socket
import time

#: Ping interval when systemd passes no ``$WATCHDOG_USEC`` (harmless: no watchdog listens).
DEFAULT_WATCHDOG_INTERVAL_S = 5.0


def watchdog_interval_s(environ: dict[str, str] | None = None, pid: int | None = None) -> float:
    """Seconds between WATCHDOG=1 pings: ``$WATCHDOG_USEC / 2``, else the default.

    Args:
        environ: The environment; default ``os.environ``.
        pid: This process's id; default ``os.getpid()``. A ``$WATCHDOG_PID`` naming another
            process means the watchdog is not ours (the default interval is used).

    >>> watchdog_interval_s({"WATCHDOG_USEC": "30000000"})
    15.0
    >>> watchdog_interval_s({})
    5.0
    """
    env = dict(os.environ) if environ is None else environ
    owner = env.get("WATCHDOG_PID", "")
    if owner and owner != str(os.getpid() if pid is None else pid):
        return DEFAULT_WATCHDOG_INTERVAL_S
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return DEFAULT_WATCHDOG_INTERVAL_S
    return usec / 2e6 if usec > 0 else DEFAULT_WATCHDOG_INTERVAL_S


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

    def extend_timeout(self, seconds: float, status: str | None = None) -> bool:
        """EXTEND_TIMEOUT_USEC: ask for ``seconds`` more of start-up (or reload/stop) time.

        Sent before each long start-up step (model load, compile, warm-up) so that a slow
        step is not killed by ``TimeoutStartSec`` while it is still making progress.
        """
        fields = {"EXTEND_TIMEOUT_USEC": str(math.ceil(seconds * 1e6))}
        if status is not None:
            fields["STATUS"] = status
        return self.notify(**fields)

    def reloading(self, status: str = "reloading configuration") -> bool:
        """RELOADING=1 with ``MONOTONIC_USEC`` (systemd >= 253 requires it); READY=1 ends it."""
        return self.notify(
            RELOADING="1",
            MONOTONIC_USEC=str(time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000),
            STATUS=status,
        )

    def close(self) -> None:
        """Close the socket."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
