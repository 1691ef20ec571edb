"""TLS of the agent's fleet connection: a CA file and pinned server public keys.

The HTTP session of :class:`cloud_sync.client.FleetClient` (:func:`fleet_session`) verifies the
server's certificate chain against ``ca_file`` (a PEM bundle; None = the trust store that
``requests`` uses) and the host name, as ``requests`` always does for ``https://``. With pins it
also checks, on every new connection and before the first byte of a request (the token) is
sent, that the server's public key is one of them.

Pin syntax (curl's ``--pinnedpubkey``): ``sha256//<base64>``, several separated by ``;`` (the
current key and its successor, for a rotation). ``<base64>`` is the SHA-256 of the DER
SubjectPublicKeyInfo of the server's (leaf) certificate, the ``pin-sha256`` of HPKP (RFC 7469,
section 2.4), so it survives a certificate renewal that keeps the key. From a certificate::

    openssl x509 -in server.pem -pubkey -noout | openssl pkey -pubin -outform der \\
        | openssl dgst -sha256 -binary | openssl enc -base64

A connection whose key matches no pin fails like a certificate that does not verify: the
request raises ``requests.exceptions.SSLError`` whose text names :class:`PinMismatch` and the
key's actual pin (the uploader backs off and retries, see :mod:`cloud_sync.errors`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import ssl
from typing import Any

import requests
import requests.adapters
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from urllib3.connection import HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

PIN_PREFIX = "sha256//"


class PinMismatch(ssl.SSLError):
    """The server's public key is none of the pinned ones (an ``ssl.SSLError``, so urllib3 and
    requests report it as a TLS failure)."""


def parse_pins(text: str) -> frozenset[bytes]:
    """The SHA-256 digests named by a pin string.

    >>> len(parse_pins("sha256//" + "A" * 43 + "=;sha256//" + "B" * 43 + "="))
    2

    Raises:
        ValueError: An entry does not start with ``sha256//`` or is not the base64 of 32 bytes.
    """
    pins = set()
    for entry in (part.strip() for part in text.split(";")):
        if not entry.startswith(PIN_PREFIX):
            raise ValueError(f"pin {entry!r} must look like 'sha256//<base64 of 32 bytes>'")
        try:
            digest = base64.b64decode(entry.removeprefix(PIN_PREFIX), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ValueError(f"pin {entry!r} is not valid base64: {exc}") from exc
        if len(digest) != 32:
            raise ValueError(f"pin {entry!r} is {len(digest)} bytes, a SHA-256 is 32")
        pins.add(digest)
    return frozenset(pins)


def spki_sha256(cert_der: bytes) -> bytes:
    """SHA-256 of the DER SubjectPublicKeyInfo of a DER certificate (32 bytes).

    Raises:
        ValueError: ``cert_der`` is not a certificate.
    """
    cert = x509.load_der_x509_certificate(cert_der)
    spki = cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(spki).digest()


def pin_of(cert_der: bytes) -> str:
    """The ``sha256//<base64>`` pin of a DER certificate's public key."""
    return PIN_PREFIX + base64.b64encode(spki_sha256(cert_der)).decode("ascii")


class _PinnedHTTPSConnection(HTTPSConnection):
    """An HTTPS connection that checks the server key against ``pins`` after the handshake."""

    pins: frozenset[bytes] = frozenset()

    def connect(self) -> None:
        super().connect()
        sock: Any = self.sock
        der = sock.getpeercert(binary_form=True) if sock is not None else None
        try:
            ok = der is not None and spki_sha256(der) in self.pins
        except ValueError:
            ok = False
        if not ok:
            actual = pin_of(der) if der else "no certificate"
            self.close()
            raise PinMismatch(
                f"PinMismatch: the server's public key ({actual}) is not a pinned one "
                "(fleet.pinned_pubkey)"
            )


class FleetAdapter(requests.adapters.HTTPAdapter):
    """A ``requests`` adapter for ``https://`` that verifies against ``ca_file`` and ``pins``.

    ``ca_file`` is applied here, per request, because requests lets ``REQUESTS_CA_BUNDLE`` /
    ``CURL_CA_BUNDLE`` from the environment override a session's ``verify`` (psf/requests
    issue 3829): the configured CA always wins.

    Args:
        ca_file: PEM bundle to verify the chain against; None = requests' default.
        pins: SHA-256 digests of accepted SubjectPublicKeyInfos (:func:`parse_pins`); empty =
            no pinning.
    """

    def __init__(self, ca_file: str | None, pins: frozenset[bytes] = frozenset()) -> None:
        self._ca_file = ca_file
        self._pool_classes: dict[str, type] | None = None
        if pins:
            conn = type("PinnedHTTPSConnection", (_PinnedHTTPSConnection,), {"pins": pins})
            self._pool_classes = {
                "http": HTTPConnectionPool,
                "https": type("PinnedHTTPSConnectionPool", (HTTPSConnectionPool,),
                              {"ConnectionCls": conn}),
            }
        super().__init__()

    def send(self, request: requests.PreparedRequest, *args: Any, **kwargs: Any
             ) -> requests.Response:
        if self._ca_file is not None:
            kwargs["verify"] = self._ca_file
        elif kwargs.get("verify") is False:
            kwargs["verify"] = True  # never unverified, whatever the caller says
        return super().send(request, *args, **kwargs)

    def init_poolmanager(
        self, connections: int, maxsize: int, block: bool = False, **pool_kwargs: Any
    ) -> None:
        super().init_poolmanager(connections, maxsize, block, **pool_kwargs)
        if self._pool_classes is not None:
            self.poolmanager.pool_classes_by_scheme = self._pool_classes

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if self._pool_classes is None:
            return manager
        if not hasattr(manager, "pool_classes_by_scheme") or proxy.startswith("socks"):
            raise PinMismatch(f"public key pinning does not work through the proxy {proxy!r}")
        manager.pool_classes_by_scheme = self._pool_classes
        return manager


def fleet_session(ca_file: str | None = None, pins: str | None = None) -> requests.Session:
    """An HTTP session for the fleet: chain checked against ``ca_file``, key against ``pins``.

    Args:
        ca_file: PEM bundle of the CA(s) that sign the fleet's certificate; None = the default
            trust store of ``requests``.
        pins: Pin string (module docstring); None = no pinning.

    Raises:
        ValueError: ``pins`` is malformed.
    """
    session = requests.Session()
    if ca_file is not None or pins is not None:
        session.mount("https://", FleetAdapter(
            ca_file, parse_pins(pins) if pins is not None else frozenset()))
    return session
