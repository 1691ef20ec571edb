"""A small TCP proxy in front of a real broker that can eat MQTT packets or stay silent.

Client -> broker bytes are forwarded as they come. Broker -> client bytes are split into MQTT
packets by their fixed header (packet type in the high nibble of byte 0, then the Remaining
Length as a variable byte integer: MQTT 3.1.1 section 2.2 / MQTT 5.0 section 2.1) so that whole
packets of a given type can be dropped, e.g. PUBACK (type 4) while PINGRESP still passes.

``silent = True`` makes it accept TCP connections and never answer (a broker that sends no
CONNACK).
"""

from __future__ import annotations

import contextlib
import socket
import threading

PUBACK = 4


class MqttProxy:
    """Listens on ``127.0.0.1:<free port>`` and forwards to ``upstream``.

    Args:
        upstream: ``(host, port)`` of the real broker.
        drop_types: Broker -> client packet types dropped on the first ``drop_connections``
            connections (later ones pass everything).
        drop_connections: How many connections drop packets (None: all of them).
        silent: Accept and read, never connect upstream nor answer.
    """

    def __init__(self, upstream: tuple[str, int], *, drop_types: frozenset[int] = frozenset(),
                 drop_connections: int | None = None, silent: bool = False) -> None:
        self.upstream = upstream
        self.drop_types = drop_types
        self.drop_connections = drop_connections
        self.silent = silent
        self.host = "127.0.0.1"
        self._listener = socket.create_server((self.host, 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self.connections = 0
        #: Packets dropped, by type.
        self.dropped: dict[int, int] = {}
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
                n = self.connections
                self._socks.append(client)
            if self.silent:
                threading.Thread(target=self._swallow, args=(client,), daemon=True).start()
                continue
            try:
                broker = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._socks.append(broker)
            drop = (self.drop_types if self.drop_connections is None or n <= self.drop_connections
                    else frozenset())
            threading.Thread(target=self._pipe, args=(client, broker), daemon=True).start()
            threading.Thread(target=self._packets, args=(broker, client, drop),
                             daemon=True).start()

    @staticmethod
    def _swallow(sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while sock.recv(4096):
                pass

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            _shut(src, dst)

    def _packets(self, src: socket.socket, dst: socket.socket, drop: frozenset[int]) -> None:
        buf = b""
        try:
            while data := src.recv(65536):
                buf += data
                while (packet := _split(buf)) is not None:
                    size = packet
                    kind = buf[0] >> 4
                    if kind in drop:
                        with self._lock:
                            self.dropped[kind] = self.dropped.get(kind, 0) + 1
                    else:
                        dst.sendall(buf[:size])
                    buf = buf[size:]
        except OSError:
            pass
        finally:
            _shut(src, dst)

    def cut(self) -> None:
        """Reset every open connection (both sides)."""
        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        self.cut()


def _shut(*socks: socket.socket) -> None:
    for s in socks:
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)


def _split(buf: bytes) -> int | None:
    """Length of the first whole MQTT packet in ``buf`` (None: incomplete).

    >>> _split(bytes([0x40, 2, 0, 1]))
    4
    >>> _split(bytes([0x30, 0x80])) is None
    True
    """
    multiplier, length, i = 1, 0, 1
    while True:
        if i >= len(buf):
            return None
        byte = buf[i]
        length += (byte & 0x7F) * multiplier
        i += 1
        if not byte & 0x80:
            break
        multiplier *= 128
        if i > 4:
            raise OSError("malformed Remaining Length from the broker")
    total = i + length
    return total if len(buf) >= total else None
