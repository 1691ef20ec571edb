"""Ingest benchmarks per source kind: read -> alert p99, sustained readings/s, CPU per register.

    python benchmarks/ingest.py [--alerts 200] [--seconds 10]

A benchmark, not a test: it prints figures and never asserts them. Measured for ``modbus``,
``opcua`` and ``mqtt`` (MQTT in, JSON):

1. **read -> alert** (``modbus_p99_ms``): the real :class:`agent.app.Agent` (shipped model
   ``skab-wstat``, SQLite outbox, MQTT publisher to a private mosquitto, a subscriber in another
   process, all from ``benchmarks/latency.py``) with a ``modbus`` stream polling, at 100 Hz, a
   pymodbus server in a child process whose device makes a new pump-like row of 8 float32
   values for every request. After calibration the device switches to a spike (30 noise std on
   every channel) until its alert arrives, then back to normal until the rule has cleared.
   Latency = the subscriber's ``time.monotonic()`` at delivery minus the spike reading's
   ``received_mono`` (taken by the source right after the response arrived; CLOCK_MONOTONIC is
   system-wide on Linux). The same run with an in-process source polled at 100 Hz (no protocol)
   gives ``direct_p99_ms``: the difference is what Modbus adds. Rules k=1 of n=1, the model's
   window (20), hop 1, as in benchmarks/latency.py. The same for ``opcua`` (an asyncua server in
   a child process writing a row every 10 ms, the agent subscribed with a 10 ms publishing
   interval) and ``mqtt`` (a child process publishing one JSON row every 10 ms to the same
   mosquitto): latency from the source's ``received_mono`` (when the data change or message
   arrived).
2. **CPU** (``modbus_cpu_pct``): a :class:`agent.sources.modbus.ModbusSource` alone (no
   scoring) polling a 100-register map (100 uint16 channels, one request) at 10 Hz for
   ``--seconds``: this process's CPU time / wall time (the server is in the child process), and
   the same at 100 Hz to give CPU per 1,000 registers/s.
3. **Sustained readings/s** with scoring on, pinned to CPU 0: the agent polling as fast as the
   server answers (poll_interval_s 0.0001), hop 1, for ``--seconds``.

The last line is ``modbus_p99_ms=... opcua_p99_ms=... mqtt_p99_ms=... modbus_cpu_pct=...``.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from ingest_devices import PumpDevice, mqtt_device, opcua_device  # noqa: E402
from latency import (  # noqa: E402
    MOSQUITTO_BIN,
    SKAB_CHANNELS,
    Broker,
    Subscriber,
)
from workspace import add_arguments, free_port, workspace  # noqa: E402

from agent.app import Agent  # noqa: E402
from agent.config.schema import (  # noqa: E402
    AgentConfig,
    AgentSection,
    RulesConfig,
    StoreSection,
    StreamConfig,
)
from agent.metrics import Metrics  # noqa: E402
from agent.publish.mqtt import MqttConfig  # noqa: E402
from agent.records import Reading  # noqa: E402
from agent.sources.modbus import ModbusSource  # noqa: E402
from agent.sources.modbus_config import ModbusConfig  # noqa: E402
from agent.sources.modbus_map import encode_float32  # noqa: E402
from agent.sources.modbus_sim import SimServer  # noqa: E402
from agent.sources.mqtt_in import MqttInSource  # noqa: E402
from agent.sources.opcua import OpcuaSource  # noqa: E402

CALIBRATION = 400
WAIT_S = 5.0
WINDOW = 20  # the fixed window of skab-wstat@2 (its manifest); a stream may not change it


class PumpServer(SimServer):
    """A SimServer whose holding registers 0-15 are a new PumpDevice row at every request."""

    def __init__(self, port: int, spike: Any) -> None:
        super().__init__(port, registers=256)
        self.device, self.spike = PumpDevice(), spike

    async def _action(self, function: int, start: int, address: int, count: int,
                      registers: list[int], values: object) -> Any:
        if function == 3 and address < 16:
            words: list[int] = []
            for v in self.device.row(bool(self.spike.value)):
                words += encode_float32(float(v))
            self.holding[0:16] = words
        return await super()._action(function, start, address, count, registers, values)


def _server_main(port: int, spike: Any, ready: Any, stop: Any) -> None:
    server = PumpServer(port, spike).start()
    ready.set()
    stop.wait()
    server.stop()


class ServerProcess:
    """A PumpServer in a spawned child process; ``spike`` is a shared flag."""

    def __init__(self) -> None:
        ctx = mp.get_context("spawn")
        self.port = free_port()
        self.spike = ctx.Value("b", 0)
        self._stop, ready = ctx.Event(), ctx.Event()
        self._proc = ctx.Process(target=_server_main, args=(self.port, self.spike, ready,
                                                            self._stop), daemon=True)
        self._proc.start()
        if not ready.wait(30.0):
            raise RuntimeError("the Modbus server did not start")

    def close(self) -> None:
        self._stop.set()
        self._proc.join(10.0)
        if self._proc.is_alive():
            self._proc.kill()


def _modbus_config(port: int, interval: float, channels: list[dict[str, Any]]) -> ModbusConfig:
    return ModbusConfig.model_validate({"port": port, "poll_interval_s": interval,
                                        "timeout_s": 1.0, "channels": channels}, strict=False)


PUMP_MAP = [{"name": c, "address": 2 * i, "type": "float32"} for i, c in enumerate(SKAB_CHANNELS)]


class Timed:
    """Wraps a source: remembers ``received_mono`` by timestamp (ms) of every reading."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.stream, self.channels = inner, inner.stream, inner.channels
        self.received: dict[int, float] = {}
        self.readings = 0

    def run(self, emit: Any, reject: Any, stop: threading.Event) -> None:
        def timed(reading: Reading) -> None:
            key = math.floor(reading.ts * 1000)  # window_end is truncated to ms (iso_utc)
            self.received[key] = reading.received_mono
            self.readings += 1
            emit(reading)

        self.inner.run(timed, reject, stop)


class DirectSource:
    """The same pump polled in process at a fixed interval (no protocol): the baseline."""

    def __init__(self, stream: str, interval: float, spike: Any) -> None:
        self.stream, self.channels = stream, tuple(SKAB_CHANNELS)
        self.interval, self.spike, self.device = interval, spike, PumpDevice()

    def run(self, emit: Any, reject: Any, stop: threading.Event) -> None:
        due = time.monotonic()
        while not stop.is_set():
            now = time.monotonic()
            if now < due:
                stop.wait(due - now)
                continue
            values = self.device.row(bool(self.spike.value))
            emit(Reading(self.stream, time.time(), values, received_mono=time.monotonic()))
            due += self.interval


def run_latency(kind: str, alerts: int, broker: Broker, server: Any,
                workdir: Path, source_config: Any = None) -> np.ndarray:
    """Read -> alert delivered latencies (seconds) of ``alerts`` spikes; kind modbus/direct, or
    opcua/mqtt with their ``source_config`` (``server`` is then their device process)."""
    device, stream = f"bench-{kind}", "pump"
    if source_config is None:
        source_config = _modbus_config(server.port, 0.01, PUMP_MAP)
    config = AgentConfig(
        agent=AgentSection(device_id=device, state_dir=str(workdir / kind),
                           console_alerts=False, log_level="WARNING"),
        streams=[StreamConfig(name=stream, source=source_config, model="builtin:skab-wstat",
                              window=WINDOW, hop=1, calibration_samples=CALIBRATION,
                              recalibrate_on_start=True,
                              rules=RulesConfig(k=1, n=1, clear_windows=1, cooldown_s=0.0))],
        store=StoreSection(path=f"{kind}.db"),
        mqtt=MqttConfig(enabled=True, host=broker.host, port=broker.port, topic_prefix="bench",
                        client_id=f"bench-{kind}-agent"),
    ).resolved(workdir)
    inner: Any = {"modbus": lambda: ModbusSource(source_config, stream),
                   "opcua": lambda: OpcuaSource(source_config, stream),
                   "mqtt": lambda: MqttInSource(source_config, stream),
                   "direct": lambda: DirectSource(stream, 0.01, server.spike)}[kind]()
    source = Timed(inner)
    subscriber = Subscriber(broker.host, broker.port, f"bench/{device}/alerts")
    agent = Agent(config, Metrics(), console=None, sources={stream: source})
    rules = agent.streams[stream].pipeline.rules
    latencies: list[float] = []
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    try:
        while source.readings < CALIBRATION + 50:
            time.sleep(0.05)
        for _ in range(alerts):
            server.spike.value = 1
            msg = subscriber.get(WAIT_S)
            server.spike.value = 0
            if msg is not None:
                import datetime as dt  # noqa: PLC0415

                end = dt.datetime.fromisoformat(msg[1].replace("Z", "+00:00")).timestamp()
                received = source.received.get(round(end * 1000))
                if received is not None:
                    latencies.append(msg[2] - received)
            time.sleep(WINDOW * 0.01 + 0.05)  # the spike leaves the window (100 Hz)
            while rules.active:
                time.sleep(0.01)
            while subscriber.get(0.0) is not None:
                pass
    finally:
        agent.stop_event.set()
        thread.join(30.0)
        subscriber.close()
    return np.array(latencies)


def cpu_of_polling(server: ServerProcess, registers: int, hz: float, seconds: float) -> float:
    """Percent of one core this process spends polling ``registers`` uint16 at ``hz``."""
    channels = [{"name": f"r{i}", "address": 100 + i} for i in range(registers)]
    source = ModbusSource(_modbus_config(server.port, 1.0 / hz, channels), "cpu")
    source.set_metrics(Metrics(CollectorRegistry()))
    stop, count = threading.Event(), [0]
    thread = threading.Thread(target=source.run, args=(lambda r: count.__setitem__(
        0, count[0] + 1), lambda e: None, stop), daemon=True)
    thread.start()
    time.sleep(1.0)  # connected and polling
    c0, w0, n0 = time.process_time(), time.monotonic(), count[0]
    time.sleep(seconds)
    c1, w1, n1 = time.process_time(), time.monotonic(), count[0]
    stop.set()
    thread.join(5.0)
    print(f"  polling {registers} registers at {hz:g} Hz: {(n1 - n0) / (w1 - w0):.1f} polls/s, "
          f"{100 * (c1 - c0) / (w1 - w0):.2f} % of one core, overruns {source.overruns}, "
          f"max jitter {1000 * source.max_jitter_s:.1f} ms")
    return 100 * (c1 - c0) / (w1 - w0)


def sustained(server: ServerProcess, seconds: float, workdir: Path) -> float:
    """Readings/s the agent scores with the modbus source polling as fast as it can."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})
    source_config = _modbus_config(server.port, 0.0001, PUMP_MAP)
    config = AgentConfig(
        agent=AgentSection(device_id="bench-rate", state_dir=str(workdir / "rate"),
                           console_alerts=False, log_level="WARNING"),
        streams=[StreamConfig(name="pump", source=source_config, hop=1,
                              calibration_samples=CALIBRATION, recalibrate_on_start=True)],
        store=StoreSection(path="rate.db"),
    ).resolved(workdir)
    metrics = Metrics()
    agent = Agent(config, metrics, console=None)
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    time.sleep(2.0)
    n0 = metrics.registry.get_sample_value("edge_agent_windows_total", {"stream": "pump"}) or 0
    t0 = time.monotonic()
    time.sleep(seconds)
    n1 = metrics.registry.get_sample_value("edge_agent_windows_total", {"stream": "pump"}) or 0
    rate = (n1 - n0) / (time.monotonic() - t0)
    agent.stop_event.set()
    thread.join(30.0)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
    return rate


def _p(a: np.ndarray, q: float) -> float:
    return float(np.percentile(a, q) * 1000) if a.size else math.nan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--alerts", type=int, default=200, help="spikes per latency run")
    parser.add_argument("--seconds", type=float, default=10.0, help="CPU and rate runs")
    add_arguments(parser, port_help="port of the private mosquitto (default: a free one)")
    args = parser.parse_args()
    server = ServerProcess()
    try:
        with workspace(args.workdir, "bench-ingest-") as workdir:
            broker = Broker(MOSQUITTO_BIN, workdir, args.port)
            try:
                lat = {kind: run_latency(kind, args.alerts, broker, server, workdir)
                       for kind in ("direct", "modbus")}
                opc, opc_config = opcua_device(0.01)
                try:
                    lat["opcua"] = run_latency("opcua", args.alerts, broker, opc, workdir,
                                               opc_config)
                finally:
                    opc.close()
                pub, mqtt_config = mqtt_device(broker.host, broker.port, 0.01)
                try:
                    lat["mqtt"] = run_latency("mqtt", args.alerts, broker, pub, workdir,
                                              mqtt_config)
                finally:
                    pub.close()
            finally:
                broker.stop()
            print(f"read -> alert delivered (ms), 100 Hz polls, k=1 of n=1, window {WINDOW}, "
                  "hop 1:")
            for kind, a in lat.items():
                print(f"  {kind:7s} n={a.size:4d} p50={_p(a, 50):7.2f} p99={_p(a, 99):7.2f} "
                      f"max={_p(a, 100):7.2f}")
            print("CPU of the modbus source alone (this process; the server is another):")
            cpu10 = cpu_of_polling(server, 100, 10.0, args.seconds)
            cpu100 = cpu_of_polling(server, 100, 100.0, args.seconds)
            rate = sustained(server, args.seconds, workdir)
    finally:
        server.close()
    print(f"CPU per 1,000 registers/s polled: {cpu100 / 10:.2f} % of one core "
          f"(100 registers at 100 Hz)")
    print(f"sustained modbus readings/s, scoring on, pinned to CPU 0: {rate:.0f}")
    print(f"modbus_p99_ms={_p(lat['modbus'], 99):.2f} opcua_p99_ms={_p(lat['opcua'], 99):.2f} "
          f"mqtt_p99_ms={_p(lat['mqtt'], 99):.2f} "
          f"modbus_cpu_pct={cpu10:.2f} direct_p99_ms={_p(lat['direct'], 99):.2f} "
          f"modbus_readings_per_s={rate:.0f}")


if __name__ == "__main__":
    main()
