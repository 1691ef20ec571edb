"""A Modbus device on this machine: pymodbus's own server, in a background thread.

Used by ``edge-agent sim-modbus`` (a recorded SKAB file served as holding registers in real
time), by the tests (TCP, and RTU on a pseudo-terminal) and by ``benchmarks/ingest.py``.

:class:`SimServer` holds one unit's holding and input registers in plain lists that any thread
may write (:meth:`SimServer.set_holding`); each read request copies the requested range into
pymodbus's datastore through the device's ``action`` hook, which also injects faults: an
exception response (:attr:`SimServer.exception_code`) or a late response
(:attr:`SimServer.delay_s` for the next :attr:`SimServer.delay_count` requests).

:func:`serve_csv` replays a CSV through :func:`agent.sources.sim_replay.play_csv` (the
parser and real-time pacing of :class:`agent.sources.replay.ReplaySource`) and writes each row
as float32 registers, channel ``i`` at addresses ``2i, 2i+1`` (big-endian word order), so a
``modbus`` stream with the same channel order reads the recording as if a PLC served it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

from agent.errors import AgentError
from agent.records import Reading
from agent.sources.modbus_map import encode_float32
from agent.sources.sim_replay import play_csv


class SimServer:
    """A one-unit Modbus server (TCP, or RTU on a serial port) running in its own thread.

    Args:
        port: TCP port (``transport="tcp"``).
        host: Address to bind.
        transport: ``tcp`` or ``rtu``.
        serial_port: ``rtu``: the serial device (e.g. one end of a socat pty pair).
        baudrate, parity, stopbits, bytesize: ``rtu`` line settings.
        unit: The unit id served (other ids get exception 4 or no answer, as pymodbus does).
        registers: Holding and input registers served (addresses 0 .. registers-1).
        coils: Values of coils 0 .. len-1 (discrete inputs are all off).

    Attributes:
        holding, input: Register values, 0-65535, written by any thread.
        exception_code: When set, every request gets this exception response.
        delay_s, delay_count: Delay the next ``delay_count`` responses by ``delay_s`` seconds.
        requests: Read requests answered (or refused) so far, numbered from 1.
        delayed: Numbers of the requests that were delayed.
        stamp_register: When set, this holding register reads as the number of the request
            that reads it (mod 65536): a test can tell which request a response answers.
    """

    def __init__(
        self,
        port: int = 5020,
        host: str = "127.0.0.1",
        *,
        transport: str = "tcp",
        serial_port: str | None = None,
        baudrate: int = 19200,
        parity: str = "E",
        stopbits: int = 1,
        bytesize: int = 8,
        unit: int = 1,
        registers: int = 256,
        coils: list[bool] | None = None,
    ) -> None:
        self.port, self.host, self.transport = port, host, transport
        self.serial = {"port": serial_port, "baudrate": baudrate, "parity": parity,
                       "stopbits": stopbits, "bytesize": bytesize}
        self.unit = unit
        self.holding = [0] * registers
        self.input = [0] * registers
        self.coils = list(coils) if coils else [False] * 16
        self.exception_code: int | None = None
        self.delay_s = 0.0
        self.delay_count = 0
        self.requests = 0
        self.delayed: list[int] = []
        self.stamp_register: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        logging.getLogger("pymodbus").setLevel(logging.CRITICAL)

    def set_holding(self, address: int, values: list[int]) -> None:
        """Write holding registers ``address ..`` (ints 0-65535)."""
        self.holding[address: address + len(values)] = values

    def _device(self) -> Any:
        from pymodbus.simulator import DataType, SimData, SimDevice  # noqa: PLC0415

        n = len(self.holding)
        return SimDevice(id=self.unit, action=self._action, simdata=(
            [SimData(0, values=list(self.coils), datatype=DataType.BITS)],
            [SimData(0, count=16, values=False, datatype=DataType.BITS)],
            [SimData(0, count=n, values=0, datatype=DataType.REGISTERS)],
            [SimData(0, count=n, values=0, datatype=DataType.REGISTERS)],
        ))

    async def _action(self, function: int, start: int, address: int, count: int,
                      registers: list[int], values: object) -> Any:
        from pymodbus.constants import ExcCodes  # noqa: PLC0415

        self.requests += 1
        number = self.requests
        if self.delay_count > 0:
            self.delay_count -= 1
            self.delayed.append(number)
            await asyncio.sleep(self.delay_s)
        if self.exception_code is not None:
            return ExcCodes(self.exception_code)
        source = {3: self.holding, 4: self.input}.get(function)
        if source is not None:
            lo = address - start
            registers[lo: lo + count] = source[address: address + count]
            stamp = self.stamp_register
            if function == 3 and stamp is not None and address <= stamp < address + count:
                registers[stamp - start] = number & 0xFFFF
        return None

    def start(self, timeout_s: float = 10.0) -> SimServer:
        """Start serving; return once the server listens.

        Raises:
            AgentError: When it does not start within ``timeout_s`` (port taken, no device).
        """
        self._ready.clear()
        self._error = None
        self._thread = threading.Thread(target=self._serve, name="modbus-sim", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s) or self._error is not None:
            self.stop()
            raise AgentError(f"Modbus server did not start: {self._error}")
        return self

    def _serve(self) -> None:
        from pymodbus import FramerType  # noqa: PLC0415
        from pymodbus.server import ModbusSerialServer, ModbusTcpServer  # noqa: PLC0415

        async def main() -> None:
            if self.transport == "tcp":
                self._server = ModbusTcpServer(self._device(), address=(self.host, self.port))
            else:
                s = self.serial
                self._server = ModbusSerialServer(
                    self._device(), framer=FramerType.RTU, port=str(s["port"]),
                    baudrate=int(str(s["baudrate"])), parity=str(s["parity"]),
                    stopbits=int(str(s["stopbits"])), bytesize=int(str(s["bytesize"])))
            task = asyncio.create_task(self._server.serve_forever())
            for _ in range(200):
                if getattr(self._server, "transport", None) is not None or task.done():
                    break
                await asyncio.sleep(0.01)
            if task.done() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
            self._ready.set()
            await task

        self._loop = asyncio.new_event_loop()
        try:
            self._loop.run_until_complete(main())
        except BaseException as exc:  # reported by start()
            self._error = exc
            self._ready.set()
        finally:
            self._loop.close()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop serving and close every connection (a device switched off)."""
        loop, server = self._loop, self._server
        if loop is not None and server is not None and loop.is_running():
            # RuntimeError etc.: the loop ended meanwhile
            with contextlib.suppress(RuntimeError, TimeoutError, asyncio.CancelledError):
                asyncio.run_coroutine_threadsafe(server.shutdown(), loop).result(timeout_s)
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._thread, self._server, self._loop = None, None, None


def write_reading(server: SimServer, reading: Reading) -> None:
    """Write one reading's values as float32 registers 2i, 2i+1 (big-endian words)."""
    words: list[int] = []
    for value in reading.values:
        words += encode_float32(float(value))
    server.set_holding(0, words)


def serve_csv(
    server: SimServer,
    path: str,
    *,
    speed: float = 1.0,
    loop: bool = True,
    stop: threading.Event | None = None,
    on_row: Callable[[Reading], None] | None = None,
) -> tuple[str, ...]:
    """Serve a recorded CSV (SKAB layout) row by row on ``server`` until its end or ``stop``.

    Args:
        server: A started :class:`SimServer` with at least 2 x channels registers.
        path: The CSV file.
        speed: 1.0 = the file's own pace (SKAB: one row per second), N = N times faster.
        loop: Start again at the end of the file.
        stop: Set to return.
        on_row: Called after each row is served.

    Returns:
        The channel names, in register order (returned when the file ends or ``stop`` is set).

    Raises:
        SourceError: When the file cannot be read.
    """
    def check(channels: tuple[str, ...]) -> None:
        if 2 * len(channels) > len(server.holding):
            raise AgentError(f"{len(channels)} channels need {2 * len(channels)} registers; "
                             f"the server has {len(server.holding)}")

    def write(reading: Reading) -> None:
        write_reading(server, reading)
        if on_row is not None:
            on_row(reading)

    return play_csv(path, write, speed=speed, loop=loop, stop=stop, check=check)
