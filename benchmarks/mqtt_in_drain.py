"""MQTT in: how fast the ``mqtt`` source drains a broker into the agent's reading queue.

    python benchmarks/mqtt_in_drain.py [--messages 30000] [--repeat 3] [--profile out.prof]
    python benchmarks/mqtt_in_drain.py --flood --rate 1600 --messages 30000

A benchmark, not a test: it prints figures and never asserts them. It starts a private
mosquitto (``/usr/sbin/mosquitto``, or ``$MOSQUITTO_BIN``) on ``--port`` or a free port.

**Drain** (default). For each reader, on a fresh broker with unbounded queues
(``max_queued_messages 0``, ``max_queued_bytes 0``; ``max_inflight_messages`` at its default
of 20): the reader's persistent session is made (clean_session false, QoS 1 subscription),
``--messages`` JSON objects (8 fields and ``ts``, the shape of benchmarks/ingest_devices.py) are
published QoS 1 while the reader is away, then the reader connects and the time from its first
message to its last is taken: messages/s = (messages - 1) / that time. Readers:

* ``paho``: a bare paho client in ``loop_forever`` whose ``on_message`` only counts (the
  ceiling: paho's own packet handling and acknowledgements, nothing of ours);
* ``agent``: :class:`agent.sources.mqtt_in.MqttInSource` under the real
  :class:`agent.services.supervisor.SourceSupervisor` with the agent's metrics, handing each
  reading to the agent's bounded reading queue (:class:`agent.handoff.ReadingQueue`) that a
  second thread empties in batches, as the pipeline does (:mod:`agent.run_loop`).

With ``--profile FILE`` the agent reader's thread runs under cProfile (the figure then includes
the profiler's overhead) and the top functions by own time are printed.

**Flood** (``--flood``): a broker with mosquitto's default queue limits
(``max_queued_messages 1000``), the agent reader connected, and a publisher in a child process
sending ``--messages`` QoS 1 messages at ``--rate`` per second. Reported: the rate the publisher
reached (it waits for the broker's acknowledgements), readings received, and lost = sent -
received, with the number of mosquitto's "Outgoing messages are being dropped" notices (one per
burst of drops, not per message).

The last line is ``paho_msgs_s=... agent_msgs_s=... agent_vs_paho=...`` (drain) or
``sent=... sent_per_s=... received=... lost=... broker_drop_notices=...`` (flood).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import logging
import multiprocessing as mp
import os
import pstats
import queue
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import paho.mqtt.client as mqtt  # noqa: E402
from latency import MOSQUITTO_BIN, SKAB_CHANNELS, Broker  # noqa: E402
from paho.mqtt.enums import CallbackAPIVersion  # noqa: E402
from prometheus_client import CollectorRegistry  # noqa: E402
from workspace import add_arguments, workspace  # noqa: E402

from agent.metrics import Metrics  # noqa: E402
from agent.reading_queue import ReadingQueue  # noqa: E402
from agent.records import Reading  # noqa: E402
from agent.run_loop import QUEUE_SIZE  # noqa: E402
from agent.services.supervisor import SourceSupervisor  # noqa: E402
from agent.sources.mqtt_in import MqttInSource  # noqa: E402
from agent.sources.mqtt_in_config import MqttInConfig  # noqa: E402

TOPIC = "bench/pump1/telemetry"
CLIENT_ID = "bench-reader"
UNBOUNDED = ("max_queued_messages 0", "max_queued_bytes 0")
#: Longest wait for a drain or a flood to finish, seconds.
TIMEOUT_S = 300.0
#: Readings taken from the queue per batch by the pipeline stand-in (agent.run_loop's BATCH).
BATCH = 256


def payload(k: int) -> bytes:
    """Message ``k``: 8 channel values and a timestamp, as a pump publishes them."""
    row = {"ts": 1_700_000_000.0 + k * 0.01}
    row.update({c: 1.0 + (k % 97) * 0.01 + j for j, c in enumerate(SKAB_CHANNELS)})
    return json.dumps(row).encode()


def make_session(port: int) -> None:
    """Create the reader's persistent session (its QoS 1 subscription) and leave."""
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=CLIENT_ID, clean_session=False,
                    protocol=mqtt.MQTTv311)
    done = threading.Event()
    c.on_subscribe = lambda *_a: done.set()
    c.on_connect = lambda cl, *_a: cl.subscribe(TOPIC, qos=1)
    c.connect("127.0.0.1", port)
    c.loop_start()
    if not done.wait(10):
        raise RuntimeError("subscription not acknowledged")
    c.disconnect()
    c.loop_stop()


def publish(port: int, n: int, rate: float | None = None) -> None:
    """Publish ``n`` messages QoS 1 (at ``rate`` per second, or as fast as acknowledged)."""
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="bench-publisher",
                    protocol=mqtt.MQTTv311)
    c.max_queued_messages_set(0)
    c.max_inflight_messages_set(100)
    c.connect("127.0.0.1", port)
    c.loop_start()
    start = time.monotonic()
    last = None
    for k in range(n):
        if rate is not None:
            delay = start + k / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        last = c.publish(TOPIC, payload(k), qos=1)
    if last is not None:
        last.wait_for_publish(TIMEOUT_S)
    c.disconnect()
    c.loop_stop()


def _publisher_main(port: int, n: int, rate: float, ready: Any) -> None:
    ready.set()
    publish(port, n, rate)


def paho_reader(port: int, n: int) -> float:
    """A bare paho client drains ``n`` queued messages; returns messages/s."""
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=CLIENT_ID, clean_session=False,
                    protocol=mqtt.MQTTv311)
    times: list[float] = []

    def on_message(cl: Any, _u: Any, _m: Any) -> None:
        times.append(time.perf_counter())
        if len(times) >= n:
            cl.disconnect()

    c.on_message = on_message
    c.connect("127.0.0.1", port)
    timer = threading.Timer(TIMEOUT_S, c.disconnect)
    timer.start()
    c.loop_forever()
    timer.cancel()
    if len(times) < n:
        raise RuntimeError(f"paho reader got {len(times)} of {n} messages")
    return (n - 1) / (times[-1] - times[0])


class AgentReader:
    """The ``mqtt`` source under a supervisor, feeding the agent's queue and a consumer."""

    def __init__(self, port: int, profile: bool = False) -> None:
        config = MqttInConfig.model_validate({
            "port": port, "format": "json", "topics": [TOPIC], "client_id": CLIENT_ID,
            "fields": {c: c for c in SKAB_CHANNELS}, "timestamp_field": "ts",
            "reconnect_initial_s": 0.1}, strict=False)
        self.source = MqttInSource(config, "bench")
        self.metrics = Metrics(CollectorRegistry())
        self.stop = threading.Event()
        self.queue = ReadingQueue(QUEUE_SIZE, self.stop)
        self.first: float | None = None
        self.profiler = cProfile.Profile() if profile else None
        if self.profiler is not None:
            run = self.source.run

            def profiled(*a: Any) -> None:
                assert self.profiler is not None
                self.profiler.runcall(run, *a)

            self.source.run = profiled  # type: ignore[method-assign,assignment]
        self.sup = SourceSupervisor(self.source, self._timed(self.queue.put_until_stopped),
                                    self.metrics, self.stop, logging.getLogger("bench.mqtt_in"),
                                    offer=self._timed_offer)

    def _timed(self, emit: Callable[[Reading], None]) -> Callable[[Reading], None]:
        def timed(reading: Reading) -> None:
            if self.first is None:
                self.first = time.perf_counter()
            emit(reading)

        return timed

    def _timed_offer(self, reading: Reading, wait_s: float) -> bool:
        if self.first is None:
            self.first = time.perf_counter()
        return self.queue.offer(reading, wait_s)

    def drain(self, n: int) -> float:
        """Read ``n`` messages; returns messages/s (first to last into the queue)."""
        got = 0
        last = 0.0
        self.sup.start()
        deadline = time.monotonic() + TIMEOUT_S
        while got < n and time.monotonic() < deadline:
            try:
                self.queue.get(timeout=0.5)
            except queue.Empty:
                continue
            got += 1
            for _ in range(BATCH - 1):
                try:
                    self.queue.get_nowait()
                except queue.Empty:
                    break
                got += 1
            last = time.perf_counter()
        self.stop.set()
        self.sup.join(10)
        if got < n or self.first is None:
            raise RuntimeError(f"agent reader got {got} of {n} messages")
        return (n - 1) / (last - self.first)

    def top(self, lines: int = 25) -> str:
        """The profile's top functions by own time."""
        out = io.StringIO()
        if self.profiler is not None:
            pstats.Stats(self.profiler, stream=out).sort_stats("tottime").print_stats(lines)
        return out.getvalue()


def drain(args: argparse.Namespace, workdir: Path, kind: str) -> float:
    """One drain of ``args.messages`` by reader ``kind`` on a fresh broker."""
    broker = Broker(MOSQUITTO_BIN, workdir, args.port, extra=UNBOUNDED)
    try:
        make_session(broker.port)
        publish(broker.port, args.messages)
        if kind == "paho":
            return paho_reader(broker.port, args.messages)
        reader = AgentReader(broker.port, profile=args.profile is not None)
        rate = reader.drain(args.messages)
        if args.profile is not None and reader.profiler is not None:
            reader.profiler.dump_stats(args.profile)
            print(reader.top(), file=sys.stderr)
        return rate
    finally:
        broker.stop()


def flood(args: argparse.Namespace, workdir: Path) -> dict[str, int]:
    """The agent reader connected while a child process publishes at ``args.rate``."""
    broker = Broker(MOSQUITTO_BIN, workdir, args.port, extra=("log_type notice",))
    try:
        reader = AgentReader(broker.port)
        ctx = mp.get_context("spawn")
        ready = ctx.Event()
        thread = threading.Thread(target=reader.drain, args=(args.messages,), daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while reader.source.connects < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)  # the subscription is made in on_connect
        proc = ctx.Process(target=_publisher_main,
                           args=(broker.port, args.messages, args.rate, ready))
        proc.start()
        ready.wait(60)
        started = time.monotonic()
        proc.join(TIMEOUT_S)
        publish_s = time.monotonic() - started
        time.sleep(2.0)  # what the broker still holds arrives
        reader.stop.set()
        thread.join(15)
        received = int(reader.metrics.registry.get_sample_value(
            "edge_agent_readings_total", {"stream": "bench"}) or 0)
    finally:
        broker.stop()
    notices = sum("being dropped" in line
                  for line in broker.log_path.read_text(errors="replace").splitlines())
    return {"sent": args.messages, "sent_per_s": round(args.messages / publish_s),
            "received": received, "lost": args.messages - received,
            "broker_drop_notices": notices}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=30_000)
    ap.add_argument("--repeat", type=int, default=3, help="drains per reader (best is kept)")
    ap.add_argument("--readers", default="paho,agent", help="comma-separated: paho, agent")
    ap.add_argument("--profile", type=Path, default=None,
                    help="profile the agent reader; write the pstats file here")
    ap.add_argument("--flood", action="store_true", help="the flood run instead of the drain")
    ap.add_argument("--rate", type=float, default=1600.0, help="flood: messages/s published")
    add_arguments(ap, port_help="broker port (default: a free one)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with workspace(args.workdir, "mqtt-in-drain-") as workdir:
        if args.flood:
            figures: dict[str, Any] = flood(args, workdir)
        else:
            figures = {}
            for kind in args.readers.split(","):
                rates = [drain(args, workdir, kind) for _ in range(args.repeat)]
                print(f"{kind}: " + " ".join(f"{r:.0f}" for r in rates) + " msgs/s",
                      file=sys.stderr)
                figures[f"{kind}_msgs_s"] = round(max(rates))
            if "paho_msgs_s" in figures and "agent_msgs_s" in figures:
                figures["agent_vs_paho"] = round(figures["agent_msgs_s"]
                                                 / figures["paho_msgs_s"], 3)
    print(" ".join(f"{k}={v}" for k, v in figures.items()))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
