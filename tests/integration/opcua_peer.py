"""A real asyncua server in a thread, for the OPC UA source's tests.

``OpcuaPeer(port).start()`` serves an object ``2:Pump1`` with float variables (NodeIds
``ns=2;s=Pump1.<name>``) and, with ``secure=True``, only Basic256Sha256 (``mode``
SignAndEncrypt or Sign) with a self-signed certificate made here with ``cryptography``
(:func:`make_certificate`); with ``users``, only those user names and passwords may open a
session (an asyncua user manager; anonymous sessions are refused). Values are
written from the test thread with :meth:`OpcuaPeer.write`; :meth:`stop` and :meth:`start` again
on the same port emulate a server restart.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

NAMESPACE = "urn:edge-agent:test"


def make_certificate(directory: Path, name: str, uri: str) -> tuple[Path, Path]:
    """A self-signed RSA-2048 application certificate (DER) and key (PEM) whose subject
    alternative name holds the application URI ``uri`` (OPC 10000-6 §6.2.2)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1)).not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(uri),
                                                    x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=True,
                                     key_encipherment=True, data_encipherment=True,
                                     key_agreement=False, key_cert_sign=False, crl_sign=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH,
                                              x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]),
                       critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / f"{name}-cert.der", directory / f"{name}-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.DER))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.TraditionalOpenSSL,
                                           serialization.NoEncryption()))
    return cert_path, key_path


class OpcuaPeer:
    """An asyncua server on 127.0.0.1:``port`` with ``Pump1.<name>`` variables."""

    def __init__(self, port: int, names: tuple[str, ...] = ("Pressure", "Flow"), *,
                 secure: bool = False, certificate: tuple[Path, Path] | None = None,
                 mode: str = "SignAndEncrypt", users: dict[str, str] | None = None) -> None:
        self.port = port
        self.names = names
        self.secure = secure
        self.certificate = certificate
        self.mode = mode
        self.users = users
        self.logins: list[tuple[str | None, bool]] = []  # (user name, accepted), in order
        self.endpoint = f"opc.tcp://127.0.0.1:{port}/edge/"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: Any = None
        self._vars: dict[str, Any] = {}

    def _call(self, coro: Coroutine[Any, Any, Any], timeout: float = 60.0) -> Any:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def start(self) -> OpcuaPeer:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        # asyncua builds its standard address space at start: seconds of CPU, far more on a
        # loaded 2-core machine running the suite in several workers
        self._call(self._start(), timeout=120.0)
        return self

    async def _start(self) -> None:
        from asyncua import Server, ua  # noqa: PLC0415 - asyncua is optional

        server = Server(user_manager=self._user_manager() if self.users is not None else None)
        await server.init()
        server.set_endpoint(self.endpoint)
        if self.users is not None:
            server.set_identity_tokens([ua.UserNameIdentityToken])
        if self.secure:
            assert self.certificate is not None
            server.set_security_policy([getattr(ua.SecurityPolicyType,
                                                f"Basic256Sha256_{self.mode}")])
            await server.load_certificate(str(self.certificate[0]))
            await server.load_private_key(str(self.certificate[1]))
        idx = await server.register_namespace(NAMESPACE)
        pump = await server.nodes.objects.add_object(ua.NodeId("Pump1", idx), f"{idx}:Pump1")
        for name in self.names:
            var = await pump.add_variable(ua.NodeId(f"Pump1.{name}", idx), f"{idx}:{name}", 0.0)
            self._vars[name] = var
        text = await pump.add_variable(ua.NodeId("Pump1.Label", idx), f"{idx}:Label", "P-101")
        self._vars["Label"] = text
        await server.start()
        self._server = server

    def _user_manager(self) -> Any:
        from asyncua.crypto.permission_rules import User, UserRole  # noqa: PLC0415

        peer = self

        class Users:
            def get_user(self, iserver: Any, username: str | None = None,
                         password: str | None = None, certificate: Any = None) -> Any:
                ok = (username is not None and peer.users is not None
                      and peer.users.get(username) == password)
                peer.logins.append((username, ok))
                return User(role=UserRole.User, name=username) if ok else None

        return Users()

    def write(self, name: str, value: Any, *, status: str = "Good",
              source_ts: dt.datetime | None = None) -> None:
        """Write a value (with a status code name and a source timestamp) from the test."""
        self._call(self._write(name, value, status, source_ts))

    async def _write(self, name: str, value: Any, status: str,
                     source_ts: dt.datetime | None) -> None:
        from asyncua import ua  # noqa: PLC0415 - asyncua is optional

        dv = ua.DataValue(ua.Variant(value, ua.VariantType.String if isinstance(value, str)
                                     else ua.VariantType.Double),
                          StatusCode=ua.StatusCode(getattr(ua.StatusCodes, status)),
                          SourceTimestamp=source_ts or dt.datetime.now(dt.timezone.utc),
                          ServerTimestamp=dt.datetime.now(dt.timezone.utc))
        await self._server.write_attribute_value(self._vars[name].nodeid, dv)

    def write_many(self, values: dict[str, float], source_ts: dt.datetime) -> None:
        """Write several variables in one coroutine of the server's loop, so no publish falls
        between them (one coherent row)."""
        async def all_of_them() -> None:
            for name, value in values.items():
                await self._write(name, value, "Good", source_ts)

        self._call(all_of_them())

    def stop(self) -> None:
        if self._loop is None:
            return
        if self._server is not None:
            self._call(self._server.stop())
            self._server = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        self._loop.close()
        self._loop = None
