"""Latency and throughput of the whole agent against a real local Mosquitto.

    python benchmarks/latency.py [--windows 10000] [--readings 200000] [--channels 8]
        [--port N] [--workdir DIR | --state-dir DIR [--keep]]

A benchmark, not a test: it prints figures and never asserts them. It starts a private mosquitto
(``/usr/sbin/mosquitto``, or ``$MOSQUITTO_BIN``) on ``--port`` or a free port with its config in
a temp dir (removed at the end, also after an error; ``--workdir`` or ``--keep`` keep it),
and a subscriber in a separate process (paho, QoS 1), then runs the real
:class:`agent.app.Agent` (store, outbox, MQTT publisher, shipped model ``skab-wstat``) twice:

1. **Latency** (read → alert delivered, read → score). One stream fed by :class:`PacedSource`,
   injected with ``Agent(sources=...)``: after the 400-reading calibration it emits ONE reading
   at a time and waits until the agent has scored it. Rules are k=1, n=1, clear_windows=1,
   cooldown 0, so an alert ends as soon as one window scores below the clear level. The window is
   10 readings (hop 1), so a strongly anomalous reading stays in the next 10 windows: every cycle
   is one spike reading (its window raises an alert; the source waits until the subscriber has
   it) followed by normal readings until the rule has cleared (>= 10). ``--windows`` alerting
   windows are measured, about ``11 x --windows`` windows in all. On a loaded machine the
   package's latency budget may degrade the stream to scoring every other window
   (:mod:`agent.inference.deadline`): a spike whose window was not scored is not waited for but
   sent again after the rule has cleared (counted as "spike windows not scored").

   * read = ``Reading.received_mono`` of the window's newest reading (``time.monotonic()``, set
     just before the source hands the reading to the agent);
   * scored = ``time.monotonic()`` right after ``StreamPipeline.process_block`` returns;
   * handed over = when ``MqttPublisher.notify`` is called: the alert was handed to the MQTT
     publisher and to the store writer at the same time (publish while committing,
     :mod:`agent.publish.early`), or committed first when the alert took the stored-first path;
   * committed = when ``Store.add_numbered_alerts`` (the store writer's group commit) returned
     for the group holding the alert - a breakdown of the alert latency, not on its path. The
     script wraps these three bound methods on the agent's instances for timing; nothing else
     is patched;
   * delivered = ``time.monotonic()`` in the subscriber process's ``on_message`` (CLOCK_MONOTONIC
     is system-wide on Linux, so the two processes' readings are comparable). Alerts are matched
     to readings by their ``window_end``.

2. **Floor**, in the same run on the same broker: a bare paho client publishes QoS 1 to a topic
   the same subscriber process listens on, one message at a time (the next after the previous
   arrived), half of ``--floor`` messages before the latency run and half after it; publish →
   subscriber receives, same clocks as above. The agent's alert latency is to be read against it
   (target: p99 within 4x the floor's, quiet or loaded).

3. **Throughput**, in a child process pinned to CPU 0 (``os.sched_setaffinity``), so the source
   thread, the pipeline, SQLite and the MQTT drain share one core (mosquitto and the subscriber
   are not pinned). The built-in simulator at speed 0 (as fast as possible) with ``--channels``
   channels, a few injected faults (alerts on, default rules) and 60 s aggregates; hop 1,
   ``--readings`` readings, end to end (start of ``Agent.run`` until it returned: source thread
   → queue → pipeline → store/outbox → MQTT, including start-up, calibration and shutdown). The
   SQLite file is read back afterwards.

The last line is ``p50_ms=<x> p99_ms=<y> p99_9_ms=<z> floor_p99_ms=<f> floor_p99_9_ms=<g>
channel_readings_per_s=<n> load1=<l>`` (read → alert delivered; the floor; the 1-minute load
average at the end).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import multiprocessing as mp
import os
import queue
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workspace import add_arguments, pick_port, workspace  # noqa: E402

from agent.app import Agent  # noqa: E402
from agent.config.schema import (  # noqa: E402
    AgentConfig,
    AgentSection,
    RulesConfig,
    StoreSection,
    StreamConfig,
)
from agent.errors import RecordError, SourceExhausted  # noqa: E402
from agent.metrics import Metrics  # noqa: E402
from agent.pipeline.stream import StreamOutput, StreamPipeline  # noqa: E402
from agent.publish.mqtt import MqttConfig, MqttPublisher  # noqa: E402
from agent.records import FloatArray, Reading  # noqa: E402
from agent.sources.simulator import (  # noqa: E402
    DEFAULT_CHANNEL,
    PUMP_CHANNELS,
    FaultConfig,
    SimulatorConfig,
)
from agent.store.sqlite import Store  # noqa: E402

MOSQUITTO_BIN = os.environ.get("MOSQUITTO_BIN", "/usr/sbin/mosquitto")
MODEL = "builtin:skab-wstat"
SKAB_CHANNELS = list(PUMP_CHANNELS)  # the model's 8 channels, in its order
CALIBRATION = 400
BASE_TS = 1_700_000_000.0  # stream time of the latency run's reading 0; reading k is BASE_TS + k
SPIKE_STD = 30.0  # spike size on every channel, in units of the channel's noise std
WAIT_S = 5.0  # longest wait for one reading to be scored or one alert to arrive
TOPIC_PREFIX = "bench"

log = logging.getLogger("bench")


# --- the broker -----------------------------------------------------------------------------------


class Broker:
    """A private mosquitto on 127.0.0.1:<free port>; config and log in ``workdir``; ``extra``:
    more lines of mosquitto.conf (e.g. ``max_queued_messages 0``)."""

    def __init__(self, binary: str, workdir: Path, port: int | None = None,
                 extra: tuple[str, ...] = ()) -> None:
        self.host = "127.0.0.1"
        self.port = pick_port(port)
        self.log_path = workdir / "mosquitto.log"
        config = workdir / "mosquitto.conf"
        lines = [f"listener {self.port} {self.host}", "allow_anonymous true",
                 "persistence false", "log_dest stdout", "log_type error", "log_type warning",
                 *extra]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            lines.append("user root")  # otherwise it drops to 'mosquitto' and cannot write here
        config.write_text("\n".join(lines) + "\n")
        with self.log_path.open("ab") as out:
            self._proc = subprocess.Popen([binary, "-c", str(config)], stdout=out,
                                          stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"mosquitto exited early; see {self.log_path}")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"mosquitto did not listen on port {self.port}")

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(5.0)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()


# --- the subscriber (separate process) ------------------------------------------------------------


def _subscriber_main(host: str, port: int, topics: str | list[str], out: Connection,
                     stop: Any) -> None:
    """Subscribe to ``topics`` (QoS 1); send ``(alert_id, window_end, t_mono)`` per message.

    Sends ``"ready"`` once subscribed and ``("done", n_messages)`` when ``stop`` is set.
    """
    import paho.mqtt.client as paho  # noqa: PLC0415
    from paho.mqtt.enums import CallbackAPIVersion  # noqa: PLC0415

    lock = threading.Lock()
    count = 0

    def on_message(_c: paho.Client, _u: object, msg: paho.MQTTMessage) -> None:
        nonlocal count
        t = time.monotonic()  # first thing: the delivery time
        payload = json.loads(msg.payload)
        with lock:
            count += 1
            out.send((payload["alert_id"], payload["window_end"], t))

    def on_connect(c: paho.Client, _u: object, _f: object, rc: Any, _p: object) -> None:
        c.subscribe([(t, 1) for t in ([topics] if isinstance(topics, str) else topics)])

    def on_subscribe(_c: paho.Client, _u: object, _m: int, _rc: object, _p: object) -> None:
        with lock:
            out.send("ready")

    client = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2,
                         client_id=f"bench-sub-{os.getpid()}", clean_session=True)
    client.on_connect = on_connect
    client.on_subscribe = on_subscribe
    client.on_message = on_message
    client.connect(host, port, 30)
    client.loop_start()
    stop.wait()
    time.sleep(0.2)
    client.disconnect()
    client.loop_stop()
    with lock:
        out.send(("done", count))


class Subscriber:
    """Runs :func:`_subscriber_main` in a spawned process; :meth:`get` returns its messages."""

    def __init__(self, host: str, port: int, topic: str | list[str]) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe(duplex=False)
        self._stop = ctx.Event()
        self._proc = ctx.Process(target=_subscriber_main, name="bench-subscriber",
                                 args=(host, port, topic, child, self._stop), daemon=True)
        self._proc.start()
        child.close()
        if not self._conn.poll(15.0) or self._conn.recv() != "ready":
            raise RuntimeError("the subscriber did not subscribe in 15 s")

    def get(self, timeout: float) -> tuple[str, str, float] | None:
        """One delivered message, or None when none arrived within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while self._conn.poll(max(0.0, deadline - time.monotonic())):
            msg = self._conn.recv()
            if isinstance(msg, tuple):  # not a repeated "ready" after a reconnect
                return msg
        return None

    def close(self) -> list[tuple[str, str, float]]:
        """Stop the process; return the messages not yet taken with :meth:`get`."""
        self._stop.set()
        rest: list[tuple[str, str, float]] = []
        deadline = time.monotonic() + 10.0
        while (left := deadline - time.monotonic()) > 0 and self._conn.poll(left):
            msg = self._conn.recv()
            if not isinstance(msg, tuple):
                continue
            if msg[0] == "done":
                break
            rest.append(msg)
        self._proc.join(5.0)
        if self._proc.is_alive():
            self._proc.kill()
        return rest


# --- the floor: bare paho -> mosquitto -> subscriber, QoS 1 -------------------------------------


FLOOR_TOPIC = f"{TOPIC_PREFIX}/floor"


class Floor:
    """A bare paho client publishing QoS 1 to :data:`FLOOR_TOPIC`, one message at a time."""

    def __init__(self, broker: Broker, subscriber: Subscriber) -> None:
        import paho.mqtt.client as paho  # noqa: PLC0415
        from paho.mqtt.enums import CallbackAPIVersion  # noqa: PLC0415

        self._sub = subscriber
        self._client = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2,
                                   client_id=f"bench-floor-{os.getpid()}",
                                   protocol=paho.MQTTv5)
        self._client.connect(broker.host, broker.port, 30)
        self._client.loop_start()
        self._k = 0
        self.latencies: list[float] = []  # publish -> received, seconds
        self.lost = 0  # not received within WAIT_S

    def run(self, n: int) -> None:
        """Publish ``n`` messages, each after the previous one arrived."""
        for _ in range(n):
            k, self._k = self._k, self._k + 1
            end = dt.datetime.fromtimestamp(BASE_TS + k, dt.timezone.utc)
            payload = json.dumps({"alert_id": f"floor:{k}", "window_end":
                                  end.isoformat(timespec="milliseconds").replace("+00:00", "Z")})
            t0 = time.monotonic()
            self._client.publish(FLOOR_TOPIC, payload, qos=1)
            deadline = t0 + WAIT_S
            while (left := deadline - time.monotonic()) > 0:
                msg = self._sub.get(left)
                if msg is not None and msg[0] == f"floor:{k}":
                    self.latencies.append(msg[2] - t0)
                    break
            else:
                self.lost += 1

    def close(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()


# --- latency run ----------------------------------------------------------------------------------


def _k_of(window_end: str) -> int:
    """Reading index of a latency-run alert from its ``window_end`` (ISO 8601, ms, ``Z``)."""
    ts = dt.datetime.fromisoformat(window_end.replace("Z", "+00:00")).timestamp()
    return round(ts - BASE_TS)


class PacedSource:
    """A Source (``agent.sources.base``) for the latency run; see the module docstring.

    Readings are pump-like noise (the simulator's channel levels and noise std); a spike adds
    ``SPIKE_STD`` noise std to every channel (the model's INT8 features saturate, so a spike
    on one channel alone scores below the threshold; one on all channels scores about 2x it).
    :meth:`attach` must be called with the agent's pipeline and the subscriber before the agent
    runs.
    """

    def __init__(self, stream: str, channels: list[str], alerts: int, seed: int = 1) -> None:
        self.stream = stream
        self.channels = tuple(channels)
        self.alerts = alerts
        models = [PUMP_CHANNELS.get(c, DEFAULT_CHANNEL) for c in channels]
        self._level = np.array([m.level + 2 / 3 * m.load_gain for m in models])
        self._std = np.array([m.noise_std for m in models])
        self._spike = SPIKE_STD * self._std
        self._rng = np.random.default_rng(seed)
        n_max = CALIBRATION + 40 * alerts + 1000
        self.received = np.zeros(n_max)  # received_mono of reading k
        self.spikes: list[int] = []  # reading index of every spike
        self.delivered: dict[str, tuple[int, float]] = {}  # alert_id -> (reading k, t delivered)
        self.lost = 0  # spikes whose alert did not arrive within WAIT_S
        self.scored: list[tuple[float, float]] = []  # (received_mono, t after scoring)
        self.stored: dict[str, float] = {}  # alert_id -> t when handed over (notify)
        self.committed: dict[str, float] = {}  # alert_id -> t when its group commit returned
        self._processed = threading.Event()
        self._last_scored = False  # the latest processed block gave a score
        #: Spike windows the latency-budget guard did not score (level ``skip_windows`` on a
        #: loaded machine): not waited for, the spike is sent again.
        self.skipped = 0
        self._pipeline: StreamPipeline | None = None
        self._subscriber: Subscriber | None = None
        self.error: Exception | None = None

    def attach(self, pipeline: StreamPipeline, subscriber: Subscriber,
               publisher: MqttPublisher, store: Store) -> None:
        """Instrument ``pipeline.process_block``, ``publisher.notify`` and
        ``store.add_numbered_alerts`` (timing only)."""
        self._pipeline = pipeline
        self._subscriber = subscriber
        notify = publisher.notify
        commit = store.add_numbered_alerts

        def committed(items: Any) -> list[int]:
            rows = commit(items)
            t = time.monotonic()
            for alert, _, _ in items:
                self.committed[alert.alert_id] = t
            return rows

        store.add_numbered_alerts = committed  # type: ignore[method-assign]

        def stored(alert_id: str | None = None, received_mono: float | None = None) -> None:
            self.stored[alert_id or ""] = time.monotonic()  # handed to MQTT and the writer
            notify(alert_id, received_mono)

        publisher.notify = stored  # type: ignore[method-assign]
        inner = pipeline.process_block

        def timed(values: FloatArray, ts: FloatArray, received_mono: float = 0.0,
                  mono: FloatArray | None = None) -> StreamOutput:
            out = inner(values, ts, received_mono, mono)
            t = time.monotonic()
            self._last_scored = bool(out.scores.size and not np.isnan(out.scores).all())
            if self._last_scored:
                self.scored.append((received_mono, t))
            self._processed.set()
            return out

        pipeline.process_block = timed  # type: ignore[method-assign]

    def _normal(self) -> FloatArray:
        return self._level + self._std * self._rng.standard_normal(len(self.channels))

    def run(self, emit: Callable[[Reading], None], reject: Callable[[RecordError], None],
            stop: threading.Event) -> None:
        """Calibrate, then cycle spike / normal readings until ``alerts`` alerts are measured.

        Raises:
            SourceExhausted: Always, at the end (a failure is kept in ``error``), so the
                supervisor does not restart the run and the agent shuts down.
        """
        try:
            self._cycle(emit, stop)
        except Exception as exc:  # reported by the script; the agent must still shut down
            self.error = exc
        raise SourceExhausted("latency run finished", stream=self.stream)

    def _cycle(self, emit: Callable[[Reading], None], stop: threading.Event) -> None:
        assert self._pipeline is not None and self._subscriber is not None, "attach() first"
        pipeline, subscriber = self._pipeline, self._subscriber
        k = 0

        def put(values: FloatArray, paced: bool) -> None:
            nonlocal k
            self._processed.clear()
            now = time.monotonic()
            self.received[k] = now
            emit(Reading(self.stream, BASE_TS + k, values, received_mono=now))
            k += 1
            if paced and not self._processed.wait(WAIT_S):
                raise RuntimeError(f"reading {k - 1} was not scored within {WAIT_S} s")

        for _ in range(CALIBRATION - 1):
            put(self._normal(), paced=False)
        put(self._normal(), paced=True)  # the calibration happens while this one is processed
        for _ in range(20):  # a few normal windows so that the rule starts clear
            put(self._normal(), paced=True)
        while len(self.spikes) < self.alerts and not stop.is_set() and k + 100 < self.received.size:
            spike_k = k
            put(self._normal() + self._spike, paced=True)
            if not self._last_scored:
                # the latency budget's degrade level skipped this window: no alert can come
                self.skipped += 1
                n = 0  # let the spike leave the window and the rule clear, then again
                while (n < 10 or pipeline.rules.active) and not stop.is_set():
                    put(self._normal(), paced=True)
                    n += 1
                continue
            self.spikes.append(spike_k)
            deadline = time.monotonic() + WAIT_S
            found = False
            while not found and (left := deadline - time.monotonic()) > 0:
                msg = subscriber.get(left)
                if msg is None:
                    break
                alert_id, window_end, t = msg
                self.delivered[alert_id] = (_k_of(window_end), t)
                found = _k_of(window_end) == spike_k
            self.lost += not found
            # normal readings until the spike has left the window and the rule has cleared
            n = 0
            while (n < 10 or pipeline.rules.active) and not stop.is_set():
                put(self._normal(), paced=True)
                n += 1

    def collect(self, rest: list[tuple[str, str, float]]) -> None:
        """Add the messages the subscriber still held when it was closed."""
        for alert_id, window_end, t in rest:
            self.delivered.setdefault(alert_id, (_k_of(window_end), t))


def run_latency(args: argparse.Namespace, broker: Broker, workdir: Path) -> dict[str, Any]:
    device, stream = "bench-lat", "lat"
    config = AgentConfig(
        agent=AgentSection(device_id=device, state_dir=str(workdir / "latency"),
                           console_alerts=False, log_level="WARNING"),
        streams=[StreamConfig(
            name=stream,
            source=SimulatorConfig(channels=SKAB_CHANNELS),  # unused: PacedSource is injected
            model=MODEL, hop=1, calibration_samples=CALIBRATION,
            rules=RulesConfig(k=1, n=1, clear_windows=1, cooldown_s=0.0, top_channels=3),
        )],
        store=StoreSection(path="latency.db"),
        mqtt=MqttConfig(enabled=True, host=broker.host, port=broker.port,
                        topic_prefix=TOPIC_PREFIX, client_id="bench-lat-agent"),
    ).resolved(workdir)
    subscriber = Subscriber(broker.host, broker.port,
                            [f"{TOPIC_PREFIX}/{device}/alerts", FLOOR_TOPIC])
    source = PacedSource(stream, SKAB_CHANNELS, args.windows)
    agent = Agent(config, Metrics(), console=None, sources={stream: source})
    assert agent.publisher is not None
    source.attach(agent.streams[stream].pipeline, subscriber, agent.publisher, agent.store)
    floor = Floor(broker, subscriber)
    floor.run(args.floor // 2)
    t0 = time.monotonic()
    agent.run()
    elapsed = time.monotonic() - t0
    floor.run(args.floor - args.floor // 2)
    floor.close()
    source.collect(subscriber.close())

    spikes = set(source.spikes)
    alert_lat = np.array([t - source.received[k] for k, t in source.delivered.values()
                          if k in spikes])
    read_stored = np.array([source.stored[a] - source.received[k]
                            for a, (k, _) in source.delivered.items()
                            if k in spikes and a in source.stored])
    stored_delivered = np.array([t - source.stored[a] for a, (k, t) in source.delivered.items()
                                 if k in spikes and a in source.stored])
    read_committed = np.array([source.committed[a] - source.received[k]
                               for a, (k, _) in source.delivered.items()
                               if k in spikes and a in source.committed])
    other = sum(1 for k, _ in source.delivered.values() if k not in spikes)
    mono, done = np.array(source.scored).T if source.scored else (np.zeros(0), np.zeros(0))
    return {
        "elapsed_s": elapsed,
        "windows_scored": len(source.scored),
        "spikes": len(source.spikes),
        "alerts_raised": agent.alerts_raised,
        "delivered_spike_alerts": alert_lat.size,
        "other_alerts": other,
        "lost": source.lost,
        "skipped": source.skipped,
        "error": source.error,
        "read_to_alert_s": alert_lat,
        "read_to_score_s": done - mono,
        "read_to_stored_s": read_stored,
        "stored_to_delivered_s": stored_delivered,
        "read_to_committed_s": read_committed,
        "floor_s": np.array(floor.latencies),
        "floor_lost": floor.lost,
    }


# --- throughput run (child process pinned to one core) --------------------------------------------


def _channels(n: int) -> list[str]:
    if n < len(SKAB_CHANNELS):
        raise SystemExit(f"--channels must be >= {len(SKAB_CHANNELS)} (the model's channels)")
    return SKAB_CHANNELS + [f"extra{i}" for i in range(n - len(SKAB_CHANNELS))]


def _throughput_main(readings: int, channels: int, host: str, port: int, workdir: str,
                     profile: str | None, out: Any) -> None:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})  # before any thread exists: all of them inherit it
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    device, stream = "bench-tput", "tput"
    # one fault episode every 20,000 simulated s (about one alert each); few faults, because the
    # simulator checks every fault for every reading
    kinds = [FaultConfig(kind="noise", channel="Accelerometer1RMS", start_s=0.0,
                         duration_s=120.0, magnitude=6.0),
             FaultConfig(kind="offset", channel="Thermocouple", start_s=0.0, duration_s=120.0,
                         magnitude=20.0)]
    faults = [kinds[i % 2].model_copy(update={"start_s": float(s)})
              for i, s in enumerate(range(10_000, readings, 20_000))]
    config = AgentConfig(
        agent=AgentSection(device_id=device, state_dir=str(Path(workdir) / "throughput"),
                           console_alerts=False, log_level="WARNING"),
        streams=[StreamConfig(
            name=stream,
            source=SimulatorConfig(channels=_channels(channels), speed=0.0, seed=7,
                                   duration_s=float(readings), faults=faults),
            model=MODEL, hop=1, calibration_samples=CALIBRATION,
        )],
        store=StoreSection(path="throughput.db", aggregate_interval_s=60.0),
        mqtt=MqttConfig(enabled=True, host=host, port=port, topic_prefix=TOPIC_PREFIX,
                        client_id="bench-tput-agent"),
    ).resolved(Path(workdir))
    metrics = Metrics()
    agent = Agent(config, metrics, console=None)
    prof = None
    if profile is not None:
        import cProfile  # noqa: PLC0415

        prof = cProfile.Profile()
        prof.enable()
    t0 = time.perf_counter()
    agent.run()
    elapsed = time.perf_counter() - t0
    if prof is not None and profile is not None:
        prof.disable()
        prof.dump_stats(profile)
    windows = metrics.windows_total.labels(stream=stream)._value.get()
    db = Path(config.store.path)
    with sqlite3.connect(db) as conn:
        n_alerts, n_published = conn.execute(
            "SELECT COUNT(*), COUNT(published_at) FROM alerts").fetchone()
        (n_aggs,) = conn.execute("SELECT COUNT(*) FROM aggregates").fetchone()
    out.put({
        "elapsed_s": elapsed,
        "readings": readings,
        "windows": int(windows),
        "alerts_raised": agent.alerts_raised,
        "aggregates_written": agent.aggregates_written,
        "db_alerts": int(n_alerts),
        "db_published": int(n_published),
        "db_aggregates": int(n_aggs),
        "db_path": str(db),
        "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [],
    })


def run_throughput(args: argparse.Namespace, broker: Broker, workdir: Path) -> dict[str, Any]:
    subscriber = Subscriber(broker.host, broker.port, f"{TOPIC_PREFIX}/bench-tput/alerts")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    proc = ctx.Process(target=_throughput_main, name="bench-throughput",
                       args=(args.readings, args.channels, broker.host, broker.port,
                             str(workdir), args.profile, results))
    proc.start()
    res: dict[str, Any] | None = None
    try:
        while res is None:
            try:
                res = results.get(timeout=1.0)
            except queue.Empty:
                if not proc.is_alive():
                    msg = f"the throughput run died (exit code {proc.exitcode})"
                    raise RuntimeError(msg) from None
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
        if res is None:
            subscriber.close()
    delivered = {m[0] for m in subscriber.close()}
    res["delivered"] = len(delivered)
    return res


# --- report ---------------------------------------------------------------------------------------


def _ms(a: np.ndarray, q: float) -> float:
    return float(np.percentile(a, q) * 1e3) if a.size else float("nan")


def _row(name: str, a: np.ndarray) -> str:
    if not a.size:
        return f"  {name:<28} (no samples)"
    return (f"  {name:<28} {a.size:>7d} {_ms(a, 50):>8.3f} {_ms(a, 90):>8.3f} {_ms(a, 99):>8.3f} "
            f"{_ms(a, 99.9):>8.3f} {a.max() * 1e3:>8.3f}")


def _fs_type(path: Path) -> str:
    """File system type of ``path`` from /proc/mounts (longest mount point prefix), or '?'."""
    best, kind = "", "?"
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            mount = parts[1]
            if str(path).startswith(mount) and len(mount) > len(best):
                best, kind = mount, parts[2]
    except (OSError, IndexError):
        pass
    return kind


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--windows", type=int, default=10_000,
                   help="alerting windows measured for read -> alert delivered (default 10000)")
    p.add_argument("--readings", type=int, default=200_000,
                   help="readings of the throughput run (default 200000)")
    p.add_argument("--channels", type=int, default=8,
                   help="channels of the throughput run's simulator, >= 8 (default 8)")
    p.add_argument("--floor", type=int, default=None,
                   help="bare paho QoS 1 round trips measured as the floor (default: --windows)")
    p.add_argument("--skip", choices=["latency", "throughput"], help="skip one of the two runs")
    p.add_argument("--profile", metavar="FILE",
                   help="write a cProfile of the throughput run's pipeline thread to FILE")
    p.add_argument("--state-dir", metavar="DIR",
                   help="make the temp dir (SQLite stores, broker config) inside DIR, e.g. "
                   "/dev/shm to take the disk's fsync out of the alert latency")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (stores, broker log)")
    add_arguments(p, port_help="port of the private mosquitto (default: a free one)")
    args = p.parse_args(argv)
    if args.floor is None:
        args.floor = args.windows
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    _channels(args.channels)
    binary = MOSQUITTO_BIN if os.path.exists(MOSQUITTO_BIN) else shutil.which("mosquitto")
    if binary is None:
        print(f"mosquitto not found at {MOSQUITTO_BIN} nor on PATH", file=sys.stderr)
        return 1
    kept = args.workdir
    if kept is None and args.keep:
        kept = Path(tempfile.mkdtemp(prefix="edge-bench-", dir=args.state_dir))
    lat: dict[str, Any] | None = None
    tput: dict[str, Any] | None = None
    parent = Path(args.state_dir) if args.state_dir else None
    with workspace(kept, "edge-bench-", parent) as workdir:
        broker = Broker(binary, workdir, args.port)
        try:
            if args.skip != "latency":
                lat = run_latency(args, broker, workdir)
            if args.skip != "throughput":
                tput = run_throughput(args, broker, workdir)
        finally:
            broker.stop()
            if kept is not None:
                print(f"kept {workdir}")
        fs_type = _fs_type(workdir)

    print()
    print(f"edge agent benchmark: model {MODEL} (window 10, hop 1), mosquitto {binary} on "
          f"127.0.0.1:{broker.port}, {os.cpu_count()} CPU(s), Python {sys.version.split()[0]}")
    print(f"stores in {workdir} ({fs_type}); load average at the end "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    p50 = p99 = p999 = f99 = f999 = float("nan")
    if lat is not None:
        a, s = lat["read_to_alert_s"], lat["read_to_score_s"]
        p50, p99 = _ms(a, 50), _ms(a, 99)
        print()
        print(f"latency (paced, one reading at a time; {lat['elapsed_s']:.1f} s)")
        print(f"  {'':<28} {'n':>7} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'p99.9 ms':>8} "
              f"{'max ms':>8}")
        print(_row("read -> alert delivered", a))
        print(_row("read -> scored (all windows)", s))
        print(_row("  read -> handed over", lat["read_to_stored_s"]))
        print(_row("  handed over -> delivered", lat["stored_to_delivered_s"]))
        print(_row("  read -> committed (aside)", lat["read_to_committed_s"]))
        print(_row("floor: paho QoS 1 round trip", lat["floor_s"]))
        print(f"  spikes {lat['spikes']}, alerts raised {lat['alerts_raised']}, spike alerts "
              f"delivered {lat['delivered_spike_alerts']}, not delivered within {WAIT_S:g} s "
              f"{lat['lost']}, other alerts {lat['other_alerts']}, spike windows not scored "
              f"(latency-budget degrade level) {lat['skipped']}")
        if lat["error"] is not None:
            print(f"  the run stopped early: {lat['error']!r}")
        if lat["floor_lost"]:
            print(f"  floor messages not received within {WAIT_S:g} s: {lat['floor_lost']}")
        p999, f99, f999 = _ms(a, 99.9), _ms(lat["floor_s"], 99), _ms(lat["floor_s"], 99.9)
        print(f"  target p99 <= 2 ms: {'met' if p99 <= 2.0 else 'NOT met'}; "
              f"p99 within 4x the floor ({4 * f99:.3f} ms): "
              f"{'met' if p99 <= 4 * f99 else 'NOT met'}; "
              f"requirement p99 < 50 ms: {'met' if p99 < 50.0 else 'NOT met'}")
    rate = float("nan")
    if tput is not None:
        rate = tput["readings"] / tput["elapsed_s"]
        crate = rate * args.channels
        print()
        print(f"throughput (simulator speed 0, {args.channels} channels, hop 1, "
              f"CPU affinity {tput['affinity']}, end to end)")
        print(f"  readings                     {tput['readings']:>12,d}")
        print(f"  windows scored               {tput['windows']:>12,d}")
        print(f"  wall time                    {tput['elapsed_s']:>12.2f} s")
        print(f"  readings/s                   {rate:>12,.0f}")
        print(f"  channel-readings/s           {crate:>12,.0f}   (target >= 100,000: "
              f"{'met' if crate >= 100_000 else 'NOT met'})")
        print(f"  alerts raised / in SQLite    {tput['alerts_raised']:>6d} / {tput['db_alerts']:d} "
              f"(published {tput['db_published']}, delivered to the subscriber "
              f"{tput['delivered']})")
        print(f"  aggregates written / in SQLite {tput['aggregates_written']:>4d} / "
              f"{tput['db_aggregates']:d}")
        rate = crate
    print()
    print(f"p50_ms={p50:.3f} p99_ms={p99:.3f} p99_9_ms={p999:.3f} floor_p99_ms={f99:.3f} "
          f"floor_p99_9_ms={f999:.3f} channel_readings_per_s={rate:.0f} "
          f"load1={os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
