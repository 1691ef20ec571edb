"""An OPC UA server on this machine that serves a recorded CSV as variables, in real time.

Used by ``edge-agent sim-opcua``: what ``edge-agent sim-modbus`` (:mod:`agent.sources.modbus_sim`)
is for Modbus, so a user can see the whole path, PLC to alert, over OPC UA on one machine.

:class:`OpcuaSimServer` runs an asyncua server (security None, anonymous) in a background
thread with one object ``<ns>:Pump1`` holding one Double variable per channel, NodeId
``ns=<ns>;s=Pump1.<name>`` (spaces in the channel name become ``_``). :func:`serve_csv` plays
the file with :func:`agent.sources.sim_replay.play_csv` and writes each row's values in one
step of the server's loop, with the row's time as SourceTimestamp, so a subscription never
sees half a row.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import importlib
import threading
from collections.abc import Coroutine
from typing import Any

from agent.errors import AgentError
from agent.records import Reading
from agent.sources.sim_replay import play_csv

NAMESPACE = "urn:edge-anomaly-agent:sim"
OBJECT = "Pump1"


def node_name(channel: str) -> str:
    """The variable's name for a channel (``Volume Flow RateRMS`` -> ``Volume_Flow_RateRMS``)."""
    return channel.replace(" ", "_")


class OpcuaSimServer:
    """An asyncua server with ``Pump1.<channel>`` Double variables, in its own thread.

    Args:
        channels: The channel names, in order.
        port: TCP port.
        host: Address to bind.

    Attributes:
        endpoint: ``opc.tcp://host:port/edge-agent/sim/``.
        namespace: The index of :data:`NAMESPACE` (2 on a fresh asyncua server).
    """

    def __init__(self, channels: tuple[str, ...], port: int = 4840,
                 host: str = "127.0.0.1") -> None:
        self.channels = channels
        self.endpoint = f"opc.tcp://{host}:{port}/edge-agent/sim/"
        self.namespace = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: Any = None
        self._nodes: list[Any] = []

    def node_id(self, channel: str) -> str:
        """The NodeId text of a channel's variable."""
        return f"ns={self.namespace};s={OBJECT}.{node_name(channel)}"

    def _call(self, coro: Coroutine[Any, Any, Any], timeout_s: float) -> Any:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def start(self, timeout_s: float = 120.0) -> OpcuaSimServer:
        """Start serving (asyncua builds its address space first: seconds of CPU).

        Raises:
            AgentError: asyncua is not installed, or the server did not start (port taken).
        """
        try:
            import asyncua  # noqa: F401, PLC0415 - optional: only for this command
        except ImportError as exc:
            raise AgentError("edge-agent sim-opcua needs asyncua: pip install "
                             "'edge-anomaly-agent[opcua]'") from exc
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="opcua-sim",
                                        daemon=True)
        self._thread.start()
        try:
            self._call(self._start(), timeout_s)
        except Exception as exc:  # asyncua and the OS raise many kinds
            self.stop()
            raise AgentError(f"OPC UA server did not start on {self.endpoint}: "
                             f"{type(exc).__name__}: {exc}") from exc
        return self

    async def _start(self) -> None:
        asyncua: Any = importlib.import_module("asyncua")  # lazy; its stubs are stricter than it
        ua = asyncua.ua
        server = asyncua.Server()
        await server.init()
        server.set_endpoint(self.endpoint)
        server.set_server_name("edge-agent sim-opcua")
        server.set_security_policy([ua.SecurityPolicyType.NoSecurity])
        self.namespace = int(await server.register_namespace(NAMESPACE))
        ns = self.namespace
        pump = await server.nodes.objects.add_object(ua.NodeId(OBJECT, ns), f"{ns}:{OBJECT}")
        for channel in self.channels:
            name = node_name(channel)
            self._nodes.append(await pump.add_variable(ua.NodeId(f"{OBJECT}.{name}", ns),
                                                       f"{ns}:{name}", 0.0))
        await server.start()
        self._server = server

    def write(self, reading: Reading, timeout_s: float = 10.0) -> None:
        """Write one row: every variable, with the row's time as SourceTimestamp."""
        self._call(self._write([float(v) for v in reading.values], reading.ts), timeout_s)

    async def _write(self, values: list[float], ts: float) -> None:
        ua: Any = importlib.import_module("asyncua.ua")
        stamp = dt.datetime.fromtimestamp(ts, dt.timezone.utc)
        for node, value in zip(self._nodes, values, strict=True):
            await self._server.write_attribute_value(node.nodeid, ua.DataValue(
                ua.Variant(value, ua.VariantType.Double), SourceTimestamp=stamp,
                ServerTimestamp=dt.datetime.now(dt.timezone.utc)))

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop serving and end the thread."""
        loop = self._loop
        if loop is None:
            return
        if self._server is not None:
            with contextlib.suppress(Exception):  # stopping anyway; nothing left to report
                self._call(self._server.stop(), timeout_s)
            self._server = None
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout_s)
        loop.close()
        self._loop, self._thread = None, None


def serve_csv(server: OpcuaSimServer, path: str, *, speed: float = 1.0, loop: bool = True,
              stop: threading.Event | None = None) -> tuple[str, ...]:
    """Serve a recorded CSV row by row on a started ``server`` until its end or ``stop``.

    Raises:
        SourceError: When the file cannot be read.
    """
    def check(channels: tuple[str, ...]) -> None:
        if channels != server.channels:
            raise AgentError(f"the file's channels {channels} are not the server's "
                             f"{server.channels}")

    return play_csv(path, server.write, speed=speed, loop=loop, stop=stop, check=check)
