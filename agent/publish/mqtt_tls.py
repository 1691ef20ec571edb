"""TLS of the MQTT alert publisher: client certificates (mTLS), and why a connection failed.

:func:`tls_context` builds the ``ssl.SSLContext`` of ``[mqtt]`` (``tls = true``): the broker's
chain is verified against ``ca_file`` (unset = the system's trust store) and its certificate must
name ``host`` (``check_hostname``); ``cert_file``/``key_file`` are the client certificate and key
that brokers with ``require_certificate`` (mosquitto) or AWS IoT Core ask for, the key optionally
encrypted with the password in ``key_password_file``. The key file and the password file are
secrets (:func:`agent.secret_files.check_secret_file`).

Why a connection failed (:class:`DiagnosedClient`, :func:`describe_failure`): paho's network
loop swallows the exception of a failed connection attempt and calls ``on_connect_fail`` with
nothing; a broker that rejects the client certificate after a TLS 1.3 handshake shows up only as
a socket error in paho's log and a disconnect before any CONNACK. The client remembers both, so
the publisher can log "certificate verify failed: self-signed certificate in certificate chain"
or "the broker requires a client certificate" instead of "unreachable".

A password sent over plain TCP to a host other than this machine is warned about once
(:func:`warn_plain_password`).
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
from typing import Any, Protocol

import paho.mqtt.client as paho
from paho.mqtt.enums import MQTTErrorCode

from agent.errors import ConfigError
from agent.loopback import is_loopback
from agent.secret_files import check_secret_file, check_trust_file, read_secret


class BrokerEndpoint(Protocol):
    """The ``[mqtt]`` fields this module reads (:class:`agent.publish.mqtt_config.MqttConfig`;
    a protocol, so this module needs nothing from the config module that imports it)."""

    @property
    def host(self) -> str: ...

    @property
    def port(self) -> int: ...

    @property
    def tls(self) -> bool: ...

    @property
    def username(self) -> str | None: ...

    @property
    def password_file(self) -> str | None: ...

    @property
    def ca_file(self) -> str | None: ...

    @property
    def cert_file(self) -> str | None: ...

    @property
    def key_file(self) -> str | None: ...

    @property
    def key_password_file(self) -> str | None: ...


log = logging.getLogger("agent.publish.mqtt")

_warned: set[tuple[str, int]] = set()
_warned_lock = threading.Lock()

#: OpenSSL alert reasons a broker sends about the client's certificate, and what they mean.
_CLIENT_CERT_ALERTS = {
    "CERTIFICATE_REQUIRED": "the broker requires a client certificate (set mqtt.cert_file and "
                            "mqtt.key_file)",
    "BAD_CERTIFICATE": "the broker rejected the client certificate (mqtt.cert_file)",
    "UNKNOWN_CA": "the broker does not trust the CA that signed the client certificate",
    "CERTIFICATE_EXPIRED": "the broker says the client certificate has expired",
    "CERTIFICATE_REVOKED": "the broker says the client certificate is revoked",
    "CERTIFICATE_UNKNOWN": "the broker rejected the client certificate (mqtt.cert_file)",
}


def _load_error(key: str, path: str | None, exc: BaseException) -> ConfigError:
    msg = f"mqtt.{key}: cannot load {path!r}: {exc}"
    return ConfigError(msg, problems=[msg])


def tls_context(config: BrokerEndpoint) -> ssl.SSLContext:
    """The client TLS context of ``[mqtt]`` (``config.tls`` is true).

    Raises:
        ConfigError: The CA file, certificate or key cannot be loaded (a wrong key password
            included), or the CA, key or password file is writable by others; the message names
            the key (``mqtt.key_file``) and the cause.
    """
    if config.ca_file is not None:
        check_trust_file(config.ca_file, "mqtt.ca_file")
    try:
        context = ssl.create_default_context(cafile=config.ca_file)
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise _load_error("ca_file", config.ca_file, exc) from exc
    if config.cert_file is None:
        return context
    check_secret_file(config.key_file or config.cert_file,
                      "mqtt.key_file" if config.key_file else "mqtt.cert_file")
    password = None
    if config.key_password_file is not None:
        password = read_secret(config.key_password_file, "mqtt.key_password_file")
    try:
        context.load_cert_chain(config.cert_file, config.key_file, password)
    except (OSError, ssl.SSLError, ValueError) as exc:
        key = "key_file" if config.key_file and "PEM lib" in str(exc) else "cert_file"
        raise _load_error(key, config.key_file if key == "key_file" else config.cert_file,
                          exc) from exc
    return context


def describe_failure(exc: BaseException | None, socket_error: str | None = None) -> str:
    """Why a connection attempt failed, in words an operator can act on.

    Args:
        exc: The exception of the attempt (from :class:`DiagnosedClient`), or None.
        socket_error: paho's last socket error message, for failures after the handshake.

    >>> describe_failure(ConnectionRefusedError(111, "Connection refused"))
    'connection refused'
    >>> describe_failure(None, "failed to receive on socket: [SSL: "
    ...                  "TLSV13_ALERT_CERTIFICATE_REQUIRED] tlsv13 alert certif")[:45]
    'TLS: the broker requires a client certificate'
    """
    if isinstance(exc, ssl.SSLCertVerificationError):
        message = exc.verify_message or str(exc)
        hint = ("the broker's certificate does not name the configured mqtt.host"
                if "mismatch" in message.lower() else "check mqtt.ca_file")
        return f"TLS: certificate verify failed: {message} ({hint})"
    text = socket_error if exc is None else str(exc)
    if isinstance(exc, ssl.SSLError) or (text and "[SSL" in text):
        for reason, meaning in _CLIENT_CERT_ALERTS.items():
            if reason in (text or "").upper():
                return f"TLS: {meaning}: {text}"
        return f"TLS handshake failed: {text}"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, socket.gaierror):
        return f"host name not resolved: {exc}"
    if isinstance(exc, TimeoutError):
        return "timed out"
    if exc is not None:
        return f"{type(exc).__name__}: {exc}"
    return text or "unreachable"


class DiagnosedClient(paho.Client):
    """paho's client that remembers why its last connection attempt failed.

    ``connect_error``: the exception of the last failed :meth:`reconnect` (paho's loop drops
    it), None after a successful one. ``socket_error``: paho's last error-level log line
    (e.g. the broker's TLS alert), cleared at each attempt.

    A packet from the broker that paho cannot decode ends the connection as a protocol error
    instead of paho's network thread: paho 2.1's ``ReasonCode`` raises ``ValueError`` for a
    reason code it does not know for that packet type (mosquitto 2.0 answers an MQTT 5 PUBLISH
    over its ``message_size_limit`` with such a PUBACK), and the exception ended the thread
    that reads, reconnects and calls back, so nothing was delivered again until a restart.
    ``undecodable``: how many such packets ended a connection (paho then reconnects; the
    publisher's size-limit learning sees short connections as for a dropped one).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.connect_error: BaseException | None = None
        self.socket_error: str | None = None
        self.undecodable = 0
        self.on_log = self._record_log

    def _packet_handle(self) -> MQTTErrorCode:
        try:
            return super()._packet_handle()
        except ValueError as exc:  # see the class docstring
            self.undecodable += 1
            self.socket_error = f"undecodable packet from the broker ({exc})"
            return MQTTErrorCode.MQTT_ERR_PROTOCOL

    def reconnect(self) -> MQTTErrorCode:
        self.socket_error = None
        try:
            rc = super().reconnect()
        except (OSError, ValueError) as exc:  # ssl.CertificateError is a ValueError
            self.connect_error = exc
            raise
        self.connect_error = None
        return rc

    def _record_log(self, client: paho.Client, userdata: object, level: int, buf: str) -> None:
        if level == paho.MQTT_LOG_ERR:
            self.socket_error = buf


def failure_of(client: paho.Client) -> str | None:
    """:func:`describe_failure` of ``client``'s last attempt; None when nothing is known (a
    plain paho client, or no error recorded)."""
    exc = getattr(client, "connect_error", None)
    socket_error = getattr(client, "socket_error", None)
    if exc is None and not socket_error:
        return None
    return describe_failure(exc, socket_error)


def warn_plain_password(config: BrokerEndpoint, logger: logging.Logger | None = None) -> bool:
    """Warn once per process and broker when a password would cross the network in clear.

    Returns:
        True when this call logged the warning.
    """
    if config.tls or config.password_file is None or is_loopback(config.host):
        return False
    with _warned_lock:
        if (config.host, config.port) in _warned:
            return False
        _warned.add((config.host, config.port))
    (logger or log).warning(
        "mqtt: the password for user %r goes to %s:%d over plain TCP, readable by anyone on "
        "the path; set mqtt.tls = true (port 8883) or use client certificates "
        "(docs/security.md)", config.username, config.host, config.port,
    )
    return True
