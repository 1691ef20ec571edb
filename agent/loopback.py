"""Whether a configured host is this machine (plain-text warnings spare loopback peers).

Host names are not resolved: ``localhost`` and ``*.localhost`` (RFC 6761, section 6.3) and
loopback addresses (``127.0.0.0/8``, ``::1``) count as this machine, every other name as remote.
"""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """True for ``localhost``, ``*.localhost`` and loopback addresses (IPv6 may be bracketed).

    >>> [is_loopback(h) for h in ("127.0.0.1", "[::1]", "localhost", "10.0.0.1", "broker.lan")]
    [True, True, True, False, False]
    """
    name = host.strip().strip("[]").rstrip(".").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False
