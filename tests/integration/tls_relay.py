"""A TLS-terminating TCP relay on loopback (as nginx or a load balancer in front of the fleet).

``TlsRelay(cert, key, backend_port)`` accepts TLS on ``127.0.0.1:<port>`` and relays the
decrypted bytes to ``127.0.0.1:<backend_port>`` (a real ``edge-fleet serve``); it counts the
handshakes done and the bytes it relayed to the backend, so a test can show that a refused
connection carried no request (no token) at all.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from pathlib import Path


class TlsRelay:
    """TLS on a free loopback port, plaintext to ``backend_port``; ``close`` stops it."""

    def __init__(self, cert_file: Path, key_file: Path, backend_port: int) -> None:
        self._ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._ctx.load_cert_chain(str(cert_file), str(key_file))
        self._backend = backend_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.port = int(self._listener.getsockname()[1])
        self.url = f"https://127.0.0.1:{self.port}"
        self.handshakes = 0
        self.bytes_to_backend = 0
        self.handshake_errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="tls-relay", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                raw, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(raw,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        raw.settimeout(10)
        try:
            tls = self._ctx.wrap_socket(raw, server_side=True)
        except (ssl.SSLError, OSError) as exc:
            with self._lock:
                self.handshake_errors.append(str(exc))
            raw.close()
            return
        with self._lock:
            self.handshakes += 1
        try:
            backend = socket.create_connection(("127.0.0.1", self._backend), timeout=10)
        except OSError:
            tls.close()
            return
        back = threading.Thread(target=self._pipe, args=(backend, tls, False), daemon=True)
        back.start()
        self._pipe(tls, backend, True)
        back.join(10)
        tls.close()
        backend.close()

    def _pipe(self, src: socket.socket, dst: socket.socket, count: bool) -> None:
        try:
            while chunk := src.recv(65536):
                if count:
                    with self._lock:
                        self.bytes_to_backend += len(chunk)
                dst.sendall(chunk)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._stop.set()
        self._listener.close()
        self._thread.join(2)
