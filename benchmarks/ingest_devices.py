"""Pump devices that speak OPC UA or MQTT, each in a child process, for benchmarks/ingest.py.

Both make a new pump-like row of 8 values (:class:`PumpDevice`) every ``period_s`` and, while
the shared ``spike`` flag is set, rows with a spike. The OPC UA device is an asyncua server whose
``Pump1.<channel>`` variables are written in one server-loop coroutine per row (so one publish
never mixes two rows); the MQTT device publishes one JSON object per row (QoS 0, the row time in
``ts``) to a broker. The matching agent source configs are :func:`opcua_config` and
:func:`mqtt_config`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import multiprocessing as mp
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import paho.mqtt.client as mqtt
from latency import SKAB_CHANNELS, SPIKE_STD
from paho.mqtt.enums import CallbackAPIVersion
from workspace import free_port

from agent.sources.mqtt_in_config import MqttInConfig
from agent.sources.opcua_config import OpcuaConfig
from agent.sources.simulator import DEFAULT_CHANNEL, PUMP_CHANNELS

TOPIC = "bench/pump1/telemetry"


class PumpDevice:
    """A pump's 8 values: a fresh noisy row per read; ``spike`` adds SPIKE_STD noise std."""

    def __init__(self, seed: int = 1) -> None:
        models = [PUMP_CHANNELS.get(c, DEFAULT_CHANNEL) for c in SKAB_CHANNELS]
        self.level = np.array([m.level + 2 / 3 * m.load_gain for m in models])
        self.std = np.array([m.noise_std for m in models])
        self.rng = np.random.default_rng(seed)

    def row(self, spike: bool) -> np.ndarray:
        values = self.level + self.std * self.rng.standard_normal(len(self.level))
        return values + SPIKE_STD * self.std if spike else values


def _node_name(channel: str) -> str:
    return channel.replace(" ", "_")


def _opcua_main(port: int, period_s: float, spike: Any, ready: Any, stop: Any) -> None:
    from asyncua import Server, ua  # noqa: PLC0415 - the extra 'opcua', only in the child

    async def serve() -> None:
        server = Server()
        await server.init()
        server.set_endpoint(f"opc.tcp://127.0.0.1:{port}/bench/")
        idx = await server.register_namespace("urn:edge-agent:bench")
        pump = await server.nodes.objects.add_object(ua.NodeId("Pump1", idx), f"{idx}:Pump1")
        device = PumpDevice()
        nodes = []
        for c, v in zip(SKAB_CHANNELS, device.row(False), strict=True):
            name = _node_name(c)
            nodes.append(await pump.add_variable(ua.NodeId(f"Pump1.{name}", idx), f"{idx}:{name}",
                                                 float(v)))
        await server.start()
        ready.set()
        due = time.monotonic()
        while not stop.is_set():
            now = dt.datetime.now(dt.timezone.utc)
            for node, v in zip(nodes, device.row(bool(spike.value)), strict=True):
                await server.write_attribute_value(node.nodeid, ua.DataValue(
                    ua.Variant(float(v), ua.VariantType.Double), SourceTimestamp=now,
                    ServerTimestamp=now))
            due += period_s
            await asyncio.sleep(max(0.0, due - time.monotonic()))
        await server.stop()

    asyncio.run(serve())


def _mqtt_main(host: str, port: int, period_s: float, spike: Any, ready: Any,
               stop: Any) -> None:
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="bench-pump")
    client.connect(host, port)
    client.loop_start()
    device = PumpDevice()
    ready.set()
    due = time.monotonic()
    while not stop.is_set():
        row = device.row(bool(spike.value))
        client.publish(TOPIC, json.dumps({"ts": time.time(), **dict(zip(
            SKAB_CHANNELS, (float(v) for v in row), strict=True))}), qos=0)
        due += period_s
        time.sleep(max(0.0, due - time.monotonic()))
    client.loop_stop()
    client.disconnect()


class DeviceProcess:
    """A device in a spawned child process; ``spike`` is a shared flag.

    Args:
        target: :func:`_opcua_main` or :func:`_mqtt_main`.
        args: Its leading arguments (before ``period_s``).
        period_s: Seconds between rows.
    """

    def __init__(self, target: Callable[..., None], args: tuple[Any, ...],
                 period_s: float) -> None:
        ctx = mp.get_context("spawn")
        self.spike = ctx.Value("b", 0)
        self._stop, ready = ctx.Event(), ctx.Event()
        self._proc = ctx.Process(target=target, args=(*args, period_s, self.spike, ready,
                                                      self._stop), daemon=True)
        self._proc.start()
        if not ready.wait(60.0):
            self.close()
            raise RuntimeError(f"the {target.__name__} device did not start")

    def close(self) -> None:
        self._stop.set()
        self._proc.join(10.0)
        if self._proc.is_alive():
            self._proc.kill()


def opcua_device(period_s: float) -> tuple[DeviceProcess, OpcuaConfig]:
    """An OPC UA pump and the agent's source config subscribing to it every ``period_s``."""
    port = free_port()
    device = DeviceProcess(_opcua_main, (port,), period_s)
    ms = period_s * 1000
    config = OpcuaConfig.model_validate({
        "endpoint": f"opc.tcp://127.0.0.1:{port}/bench/", "publishing_interval_ms": max(10, ms),
        "sampling_interval_ms": 0, "queue_size": 1, "timestamp": "receive",
        "nodes": [{"channel": c, "node_id": f"ns=2;s=Pump1.{_node_name(c)}"}
                  for c in SKAB_CHANNELS]}, strict=False)
    return device, config


def mqtt_device(host: str, port: int, period_s: float) -> tuple[DeviceProcess, MqttInConfig]:
    """An MQTT pump publishing to ``host:port`` and the agent's source config reading it."""
    device = DeviceProcess(_mqtt_main, (host, port), period_s)
    config = MqttInConfig.model_validate({
        "host": host, "port": port, "format": "json", "topics": [TOPIC], "qos": 0,
        "clean_session": True, "client_id": "bench-agent-in",
        "fields": {c: c for c in SKAB_CHANNELS}}, strict=False)
    return device, config
