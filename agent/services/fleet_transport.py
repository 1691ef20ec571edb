"""The agent's HTTP transport to the fleet: TLS settings of ``[fleet]`` and the plain-HTTP warning.

* ``fleet.ca_file`` and ``fleet.pinned_pubkey`` go to :func:`cloud_sync.tls.fleet_session`
  (chain against the CA file, then the server key against the pins);
* a plain ``http://`` url whose host is not a loopback address (``127.0.0.0/8``, ``::1``,
  ``localhost``) is warned about once per process: the device token and every upload cross the
  network readable and alterable by anyone on the path (docs/security.md). Host names are not
  resolved for this check (:func:`agent.loopback.is_loopback`).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Protocol

from agent.loopback import is_loopback
from agent.secret_files import check_trust_file

# requests, urllib3 and cryptography (about 15 MB resident together) load with the first use of
# the fleet transport, not with the config schema that imports this module: an agent without
# ``[fleet]`` never loads them.
if TYPE_CHECKING:
    import requests


class FleetEndpoint(Protocol):
    """The ``[fleet]`` fields the transport reads (:class:`agent.services.uploader.FleetConfig`;
    a protocol, so this module needs nothing from the uploader that imports it)."""

    @property
    def url(self) -> str | None: ...

    @property
    def ca_file(self) -> str | None: ...

    @property
    def pinned_pubkey(self) -> str | None: ...


log = logging.getLogger("agent.uploader")

_warned: set[str] = set()
_warned_lock = threading.Lock()


def check_tls_fields(url: str | None, ca_file: str | None, pinned_pubkey: str | None) -> None:
    """Validate ``[fleet]``'s TLS keys (pydantic turns the ValueError into a config problem).

    Raises:
        ValueError: ``ca_file`` or ``pinned_pubkey`` with a url that is not https, or a
            malformed pin.
    """
    for key, value in (("ca_file", ca_file), ("pinned_pubkey", pinned_pubkey)):
        if value is not None and url is not None and not url.startswith("https://"):
            raise ValueError(f"{key} is set but url {url!r} is not https://")
    if pinned_pubkey is not None:
        from cloud_sync.tls import parse_pins  # noqa: PLC0415 - lazy, see the imports

        parse_pins(pinned_pubkey)


def warn_plaintext(url: str, logger: logging.Logger | None = None) -> bool:
    """Warn once per process and url when ``url`` is ``http://`` to a non-loopback host.

    Returns:
        True when this call logged the warning.
    """
    from urllib3.util import parse_url  # noqa: PLC0415 - lazy, see the imports

    # the host urllib3 connects to (requests' parser): urllib.parse reads
    # 'http://10.0.0.5\\@127.0.0.1' as 127.0.0.1, urllib3 connects to 10.0.0.5
    parts = parse_url(url)
    if (parts.scheme or "").lower() != "http" or is_loopback(parts.host or ""):
        return False
    with _warned_lock:
        if url in _warned:
            return False
        _warned.add(url)
    (logger or log).warning(
        "fleet.url %s is plain http to a host that is not this machine: the device token, "
        "uploads and model assignments cross the network unencrypted and unauthenticated; "
        "use https:// (with fleet.ca_file and fleet.pinned_pubkey, docs/security.md)", url,
    )
    return True


def session_for(config: FleetEndpoint) -> requests.Session:
    """The HTTP session of a :class:`~cloud_sync.client.FleetClient` for ``[fleet]``; warns
    about a plain-http url (:func:`warn_plaintext`).

    Raises:
        ConfigError: ``fleet.ca_file`` is writable by others
            (:func:`agent.secret_files.check_trust_file`).
    """
    if config.url is not None:
        warn_plaintext(config.url)
    if config.ca_file is not None:
        check_trust_file(config.ca_file, "fleet.ca_file")
    from cloud_sync.tls import fleet_session  # noqa: PLC0415 - lazy, see the imports

    return fleet_session(config.ca_file, config.pinned_pubkey)
