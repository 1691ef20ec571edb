"""A real HTTP peer on loopback that answers one byte per second (a hung or trickling fleet).

:class:`TricklePeer` reads each request (headers and its ``Content-Length`` body), then sends a
valid-looking ``200`` answer with a pause between bytes: in ``headers`` mode the status line and
headers trickle, in ``body`` mode the headers come at once and the body trickles. Each byte
resets a client's per-read timeout, so only a total deadline ends such a call. After
``max_bytes`` bytes the peer closes the connection by itself.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import socket
import ssl
import threading
import time
from pathlib import Path
from typing import Literal

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

Mode = Literal["headers", "body"]


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key: ``(cert.pem, key.pem)`` in
    ``folder`` (the certificate is also the CA a client trusts)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


class TricklePeer:
    """A socket server on 127.0.0.1 (a free port) that trickles every answer.

    Args:
        mode: ``headers`` or ``body`` (module docstring).
        interval_s: Seconds between two bytes.
        max_bytes: Bytes sent before the peer closes the connection itself.
        tls: Serve HTTPS with this ``(cert.pem, key.pem)`` (:func:`self_signed`); None = HTTP.

    Attributes:
        requests: Requests read so far (request line of each).
        open: Connections open now.
        cut_by_client: Answers the client broke off (its end closed) before the peer had sent
            ``max_bytes``: a client that gave up, not one the peer outlasted.
    """

    def __init__(self, mode: Mode, interval_s: float = 1.0, max_bytes: int = 300,
                 tls: tuple[Path, Path] | None = None) -> None:
        self.mode = mode
        self.interval_s = interval_s
        self.max_bytes = max_bytes
        self.requests: list[str] = []
        self.open = 0
        self.cut_by_client = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self.port: int = self._sock.getsockname()[1]
        self._tls: ssl.SSLContext | None = None
        if tls is not None:
            self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self._tls.load_cert_chain(str(tls[0]), str(tls[1]))
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self._conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, name="trickle-peer", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _read_request(self, conn: socket.socket) -> bool:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return False
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                return False
            body += chunk
        with self._lock:
            self.requests.append(head.split(b"\r\n", 1)[0].decode("latin-1"))
        return True

    def _serve(self, conn: socket.socket) -> None:
        with self._lock:
            self.open += 1
        try:
            conn.settimeout(5.0)
            if self._tls is not None:
                conn = self._tls.wrap_socket(conn, server_side=True)
            if not self._read_request(conn):
                return
            body = b'{"results": []}' + b" " * 4096
            head = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode())
            if self.mode == "body":
                conn.sendall(head)
                slow = body
            else:
                slow = head + body
            for i in range(min(len(slow), self.max_bytes)):
                if self._stop.wait(self.interval_s):
                    return
                try:
                    conn.sendall(slow[i:i + 1])
                except OSError:
                    with self._lock:
                        self.cut_by_client += 1
                    return
        except OSError:
            return  # the client closed its end
        finally:
            with self._lock:
                self.open -= 1
            conn.close()

    def wait_for_request(self, timeout_s: float = 30.0) -> None:
        """Wait until the peer has read a request (AssertionError on timeout)."""
        deadline = time.monotonic() + timeout_s
        while not self.requests:
            if time.monotonic() > deadline:
                raise AssertionError(f"no request reached the peer in {timeout_s} s")
            time.sleep(0.05)

    def wait_for_cut(self, timeout_s: float = 15.0) -> None:
        """Wait until the client broke off an answer (the peer notices at its next byte)."""
        deadline = time.monotonic() + timeout_s
        while self.cut_by_client == 0:
            if time.monotonic() > deadline:
                raise AssertionError(f"the client did not break off in {timeout_s} s")
            time.sleep(0.05)

    def wait_for_open(self, timeout_s: float = 30.0) -> None:
        """Wait until a connection is open (a request is being answered right now)."""
        deadline = time.monotonic() + timeout_s
        while self.open == 0:
            if time.monotonic() > deadline:
                raise AssertionError(f"no connection open at the peer in {timeout_s} s")
            time.sleep(0.02)

    def close(self) -> None:
        """Stop serving and close every connection."""
        self._stop.set()
        self._sock.close()
        with self._lock:
            for c in self._conns:
                with contextlib.suppress(OSError):
                    c.shutdown(socket.SHUT_RDWR)
        self._thread.join(5.0)
