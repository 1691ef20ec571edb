"""Modbus source (pymodbus sync client): polls a register map over Modbus TCP or RTU.

One poll is one reading: the requests of :func:`agent.sources.modbus_map.plan_reads` are sent
in order and the reading carries the arrival time of the last response (``ts``, wall clock;
``received_mono`` for latency). Polls start on a fixed grid of ``poll_interval_s``:

* **jitter**: how late a poll started after its due time (``edge_agent_poll_jitter_seconds``);
* **overrun**: a poll that took longer than the interval (``edge_agent_poll_overruns_total``);
  due times that passed by a whole interval meanwhile are skipped and counted
  (``edge_agent_polls_missed_total{reason="overrun"}``), the next poll starts at once;
* while the device is down, the polls that would have been made are counted on reconnect
  (``edge_agent_polls_missed_total{reason="unreachable"}``), from the slot after the poll that
  found the connection lost (its timeout and late-answer wait may span many slots).

A poll whose reading cannot be accepted is rejected with one of these reasons (the supervisor
counts ``edge_agent_records_rejected_total{reason}`` and logs once per reason per minute):

* ``timeout``: no response within ``timeout_s`` (after ``retries`` resends);
* ``exception_<name>``: an exception response (``exception_illegal_address``,
  ``exception_device_busy`` ...; spec 7, codes 1-11; ``exception_other`` beyond);
* ``short_read``: fewer registers or bits than requested; ``bad_response``: another function;
* ``non_finite``, ``out_of_range``: a decoded value (:func:`agent.sources.modbus_map.decode`).

Stale responses: a response that arrives after its request timed out is never taken as the
answer to a later one. Over TCP every request carries a new transaction id and pymodbus skips
frames whose id differs (MBAP header, Modbus Messaging on TCP/IP Implementation Guide V1.0b,
3.1.3); that is not enough, since a server may stamp a late answer with the id of the request
in flight (pymodbus 3.16's own server does), so after a timeout, or a poll in which pymodbus
had to resend a request, the connection is closed and the next poll opens a new one. RTU frames
carry no id: the source keeps at most one request outstanding on the line, and a request that
timed out is retired (by its own late answer, or when ``late_answer_s`` has passed) before
anything else is sent, resends included (made by the source, never by pymodbus); the rule and
why a quiet-line drain was not enough: :mod:`agent.sources.modbus_rtu`.
``reconnect_after_timeouts`` polls in a row without any response count as a lost connection:
closed, reported (:class:`agent.sources.base.ReportsStatus`) and reopened with
:class:`agent.sources.backoff.Backoff`, like a refused or broken connection.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from agent.errors import ConfigError, RecordError, SourceError
from agent.records import Reading
from agent.sources.backoff import Backoff
from agent.sources.base import DeviceHooks, Emit, Reject, StatusListener, WaitListener, paced_wait
from agent.sources.modbus_config import ModbusConfig
from agent.sources.modbus_map import ReadBlock, decode, plan_reads
from agent.sources.modbus_rtu import inter_frame_s, retire
from agent.sources.serial_line import describe_line

if TYPE_CHECKING:
    from agent.metrics import Metrics

#: Exception codes (Modbus Application Protocol V1.1b3, section 7) -> reject reason suffix.
EXCEPTION_NAMES = {
    1: "illegal_function", 2: "illegal_address", 3: "illegal_value", 4: "device_failure",
    5: "acknowledge", 6: "device_busy", 7: "negative_acknowledge", 8: "memory_parity_error",
    10: "gateway_path_unavailable", 11: "gateway_no_response",
}

#: Read function per table (client method name, function code).
READS = {"holding": ("read_holding_registers", 3), "input": ("read_input_registers", 4),
         "coil": ("read_coils", 1), "discrete_input": ("read_discrete_inputs", 2)}

ClientFactory = Callable[[ModbusConfig], Any]


def make_client(config: ModbusConfig) -> Any:
    """A pymodbus sync client for ``config`` (not connected yet)."""
    from pymodbus import FramerType  # noqa: PLC0415 - lazy: only when a modbus stream runs
    from pymodbus.client import ModbusSerialClient, ModbusTcpClient  # noqa: PLC0415

    if config.transport == "tcp":
        return ModbusTcpClient(config.host, port=config.port, timeout=config.timeout_s,
                               retries=config.retries)
    # retries=0: RTU resends are the source's own, made only once the request is retired
    return ModbusSerialClient(
        str(config.serial_port), framer=FramerType.RTU, baudrate=config.baudrate,
        bytesize=config.bytesize, parity=config.parity, stopbits=config.stopbits,
        timeout=config.timeout_s, retries=0,
    )


def _serial_failure(config: ModbusConfig) -> str:
    """Why pymodbus could not open the RTU line (it logs the cause and returns False).

    Opens the port once more with pyserial to name the cause: a missing device, no permission,
    or a setting the port refuses (a Linux pseudo-terminal refuses parity: tcsetattr EINVAL).
    """
    import serial  # noqa: PLC0415 - lazy, as pymodbus's own serial client

    line = describe_line(config.baudrate, config.bytesize, config.parity, config.stopbits)
    try:
        serial.Serial(str(config.serial_port), baudrate=config.baudrate,
                      bytesize=config.bytesize, parity=config.parity,
                      stopbits=config.stopbits, timeout=0).close()
    except Exception as exc:  # pyserial raises SerialException, termios.error, ValueError
        return f"cannot open serial port at {line}: {type(exc).__name__}: {exc}"
    return f"cannot open serial port at {line}"


class _ConnectionLost(Exception):
    """Internal: the connection broke during a poll (message = why)."""


class ModbusSource(DeviceHooks):
    """Polls a Modbus device; reconnects by itself; one reading per poll.

    Args:
        config: The ``modbus`` config.
        stream: Stream name stamped on every reading.
        client_factory: Builds a pymodbus sync client; default :func:`make_client`.
        clock: Wall clock, epoch seconds (reading timestamps).
        monotonic: Monotonic clock, seconds (poll grid, ``received_mono``).
        rng: Random source for the reconnect jitter.

    Attributes:
        stream: The stream name.
        channels: Channel names of the register map, in order.
        blocks: The read requests of one poll.
        polls, overruns: Polls made, and polls longer than the interval.
        late_answers: RTU answers that came after their request timed out (dropped).
        missed: Polls not made, by reason (``overrun``, ``unreachable``).
        max_jitter_s: Largest poll start lateness seen, seconds.
    """

    def __init__(
        self,
        config: ModbusConfig,
        stream: str,
        *,
        client_factory: ClientFactory | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        try:
            from pymodbus.exceptions import (  # noqa: PLC0415 - lazy: only for modbus streams
                ConnectionException,
                ModbusIOException,
            )
        except ImportError as exc:
            raise ConfigError("source kind 'modbus' needs pymodbus: pip install "
                              "'edge-anomaly-agent[modbus]'", stream=stream) from exc
        self._lost_errors: tuple[type[BaseException], ...] = (ConnectionException, OSError)
        self._no_answer: type[BaseException] = ModbusIOException
        self.config = config
        self.stream = stream
        self.channels: tuple[str, ...] = tuple(ch.name for ch in config.channels)
        self.blocks = plan_reads(config.channels, config.max_gap,
                                 config.max_registers_per_read, config.max_bits_per_read)
        self._factory = client_factory if client_factory is not None else make_client
        self._clock = clock
        self._monotonic = monotonic
        self._backoff = Backoff(config.reconnect_initial_s,
                                max(config.reconnect_max_s, config.reconnect_initial_s), rng=rng)
        self._listener: StatusListener | None = None
        self._wait_listener: WaitListener | None = None
        self._metrics: Metrics | None = None
        self._client: Any = None
        self._healthy = False
        self._resent = False
        self._no_response = 0
        self.polls = 0
        self.late_answers = 0
        self.overruns = 0
        self.missed: dict[str, int] = {"overrun": 0, "unreachable": 0}
        self.max_jitter_s = 0.0
        # pymodbus logs every failed request itself; the agent counts and rate-limits instead.
        logging.getLogger("pymodbus").setLevel(logging.CRITICAL)

    def set_wait_listener(self, listener: WaitListener | None) -> None:
        """Announce each wait for the next poll's due time (a slow poll interval is no stall)."""
        self._wait_listener = listener

    # -- the loop -------------------------------------------------------------------------------

    def run(self, emit: Emit, reject: Reject, stop: threading.Event) -> None:
        """Poll until ``stop`` is set; never raises for a device that is down or misbehaves."""
        interval = self.config.poll_interval_s
        down_since: float | None = None
        due = 0.0
        try:
            while not stop.is_set():
                if self._client is None:
                    if down_since is None:
                        down_since = self._monotonic()
                    if not self._connect():
                        stop.wait(self._backoff.next_delay())
                        continue
                    now = self._monotonic()
                    if self.polls:  # polls missed while down (not before the first connect)
                        self._missed("unreachable", int((now - down_since) / interval))
                    down_since, due = None, now
                now = self._monotonic()
                if now < due:
                    paced_wait(stop.wait, due - now, now, self._wait_listener)
                    continue
                self._observe_jitter(now - due)
                try:
                    self._poll(emit, reject)
                except _ConnectionLost as exc:
                    self._lose(str(exc))
                    # the failed poll had its own slot; every later one is missed until the
                    # reconnect (an RTU timeout and its late-answer wait span many slots)
                    down_since = now + interval
                    stop.wait(self._backoff.next_delay())
                    continue
                end = self._monotonic()
                self._observe_duration(end - now, interval)
                due += interval
                if end - due >= interval:
                    skipped = int((end - due) / interval)
                    self._missed("overrun", skipped)
                    due += skipped * interval
        finally:
            self._close()

    def _connect(self) -> bool:
        cfg = self.config
        where = f"{cfg.host}:{cfg.port}" if cfg.transport == "tcp" else str(cfg.serial_port)
        client: Any = None
        try:
            client = self._factory(cfg)
            ok = bool(client.connect())
        except Exception as exc:  # pyserial/pymodbus raise many kinds
            ok, why = False, f"{type(exc).__name__}: {exc}"
        else:
            why = ("connection refused or unreachable" if cfg.transport == "tcp"
                   else _serial_failure(cfg))
        if not ok:
            _close_quietly(client)
            self._report(SourceError(f"cannot connect to Modbus device: {why}",
                                     stream=self.stream, device=where))
            return False
        self._client = client
        return True

    def _lose(self, why: str) -> None:
        self._close()
        self._report(SourceError(f"Modbus connection lost: {why}", stream=self.stream))

    def _close(self) -> None:
        _close_quietly(self._client)
        self._client = None
        self._healthy = False

    # -- one poll -------------------------------------------------------------------------------

    def _poll(self, emit: Emit, reject: Reject) -> None:
        """Send every request of one poll; emit the reading or reject it with one reason.

        Raises:
            _ConnectionLost: the connection broke, or too many polls went unanswered.
        """
        self.polls += 1
        self._resent = False
        values = np.empty(len(self.channels), dtype=np.float64)
        try:
            for block in self.blocks:
                data = self._read(block)
                for i in block.channels:
                    values[i] = decode(self.config.channels[i], data, block.address)
        except RecordError as exc:
            reject(exc)
            if self._no_response >= self.config.reconnect_after_timeouts:
                raise _ConnectionLost(f"{self._no_response} polls in a row without a "
                                      "response") from None
            return
        finally:
            if self._resent and self._client is not None:
                # TCP: pymodbus sent a request again; the other answer may still come
                self._forget_late_answers()
        received_mono, ts = self._monotonic(), self._clock()
        emit(Reading(self.stream, ts, values, received_mono=received_mono))

    def _answered(self) -> None:
        """The device answered (data or an exception response): the connection works."""
        self._no_response = 0
        if not self._healthy:
            self._healthy = True
            self._backoff.reset()
            self._report(None)

    def _read(self, block: ReadBlock) -> list[int] | list[bool]:
        """One request; its registers or bits.

        Raises:
            RecordError: timeout, exception_*, short_read, bad_response.
            _ConnectionLost: the connection broke.
        """
        method, function = READS[block.table]
        rtu = self.config.transport == "rtu"
        sends = 1 + self.config.retries if rtu else 1  # TCP: pymodbus resends
        for send in range(1, sends + 1):
            try:
                response = getattr(self._client, method)(
                    block.address, count=block.count, device_id=block.unit)
                break
            except self._no_answer as exc:
                if rtu:
                    self._retire(block, function)
                else:
                    self._forget_late_answers()
                if send == sends:
                    self._no_response += 1
                    raise RecordError(f"no response from unit {block.unit} to {block.table} "
                                      f"{block.address}+{block.count} within "
                                      f"{self.config.timeout_s} s", reason="timeout") from exc
            except self._lost_errors as exc:  # pymodbus ConnectionException, socket errors
                raise _ConnectionLost(str(exc) or type(exc).__name__) from exc
        self._answered()
        self._resent = self._resent or bool(getattr(response, "retries", 0))
        where = f"unit {block.unit} {block.table} {block.address}+{block.count}"
        if response.isError():
            code = int(getattr(response, "exception_code", 0))
            name = EXCEPTION_NAMES.get(code, "other")
            raise RecordError(f"exception response {code} ({name}) to {where}",
                              reason=f"exception_{name}")
        if response.function_code != function:
            raise RecordError(f"function {response.function_code} answered {where}",
                              reason="bad_response")
        data: list[int] | list[bool] = (response.bits if block.table in ("coil",
                                        "discrete_input") else response.registers)
        if len(data) < block.count:
            raise RecordError(f"{len(data)} values in the response to {where}",
                              reason="short_read")
        return data

    def _forget_late_answers(self) -> None:
        """TCP, after a timeout or a resend: open a new connection at the next poll (a late
        answer dies with the old one, whatever transaction id it carries)."""
        _close_quietly(self._client)
        self._client = None

    def _retire(self, block: ReadBlock, function: int) -> None:
        """RTU, after a timeout: nothing more is sent until the request is retired
        (:func:`agent.sources.modbus_rtu.retire`)."""
        port = getattr(self._client, "socket", None)
        if port is None:
            return  # pymodbus closed the port; a late answer cannot reach a new one
        cfg = self.config
        if retire(port, unit=block.unit, function=function, count=block.count,
                  late_answer_s=cfg.late_answer_bound_s,
                  gap_s=inter_frame_s(cfg.baudrate, cfg.bytesize, cfg.parity, cfg.stopbits)):
            self.late_answers += 1

    # -- statistics -----------------------------------------------------------------------------

    def _observe_jitter(self, late_s: float) -> None:
        self.max_jitter_s = max(self.max_jitter_s, late_s)
        if self._metrics is not None:
            self._metrics.poll_jitter_seconds.labels(stream=self.stream).observe(late_s)

    def _observe_duration(self, took_s: float, interval: float) -> None:
        overrun = took_s > interval
        self.overruns += overrun
        if self._metrics is not None:
            self._metrics.poll_duration_seconds.labels(stream=self.stream).observe(took_s)
            if overrun:
                self._metrics.poll_overruns_total.labels(stream=self.stream).inc()

    def _missed(self, reason: str, count: int) -> None:
        if count <= 0:
            return
        self.missed[reason] += count
        if self._metrics is not None:
            self._metrics.polls_missed_total.labels(stream=self.stream, reason=reason).inc(count)


def _close_quietly(client: Any) -> None:
    if client is not None:
        with contextlib.suppress(Exception):  # already broken; nothing to report
            client.close()
