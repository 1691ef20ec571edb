"""Retained stream state: ``<prefix>/<device_id>/<stream>/state``, the present of every stream.

A :class:`StatePublisher` listens on the agent's :class:`~agent.publish.stream_state.StateBoard`
and publishes each stream's :meth:`StreamState.to_payload` as compact JSON, QoS 1, **retained**,
so a client that subscribes late receives the present at once (the convention of Frigate's and
Home Assistant's state topics)::

    {"stream": "pump1", "kind": "sensor", "status": "anomalous", "score": 7.31,
     "threshold": 5.63, "model_name": "skab-wstat", "model_version": 1,
     "episode_id": "gw1:pump1:42", "updated_at": 1764600000.25}

When it goes out:

* at once when anything but ``score``/``updated_at`` changed (status, threshold, model, episode);
* a change of the score alone at most once per ``mqtt.state_interval_s`` seconds (default 10):
  the latest score then, never a backlog;
* everything again after each (re)connect (a broker restarted without persistence lost its
  retained copies);
* a stream that left the config on a reload: an empty retained payload, which deletes the
  broker's retained copy (MQTT 5.0 section 3.3.1.3).

State messages are "latest value", not records: they bypass the outbox; while the broker is
unreachable nothing is kept but the latest state of each stream. A broker that takes no retained
messages (mosquitto ``retain_available false``; MQTT 5 tells the agent, ``mqtt.retain = false``
for 3.1.1) gets them without retain, and alerts are not affected
(``edge_agent_mqtt_state_total{result}`` counts each message).

Thread: one daemon thread (``mqtt-state``); the board's listener only stores the state and wakes
it when the state is due (a score alone within its interval is sent by the thread's pass at least
every second), so the pipeline never waits for the network.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Protocol

from agent.metrics import Metrics
from agent.publish.stream_state import StateBoard, StreamState


class LatestSink(Protocol):
    """What the state publisher needs of :class:`agent.publish.mqtt.MqttPublisher`."""

    @property
    def generation(self) -> int: ...

    def state_topic(self, stream: str) -> str: ...

    def publish_latest(self, topic: str, payload: bytes) -> str: ...


class StatePublisher:
    """Publishes the board's states, retained (see the module docstring).

    Args:
        board: The agent's state board (the publisher subscribes to it).
        sink: The MQTT publisher.
        metrics: Receives ``mqtt_state_total{result}``.
        interval_s: ``mqtt.state_interval_s``.
        monotonic: Monotonic clock, seconds.
    """

    def __init__(self, board: StateBoard, sink: LatestSink, metrics: Metrics, interval_s: float,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._board = board
        self._sink = sink
        self._metrics = metrics
        self._interval_s = interval_s
        self._monotonic = monotonic
        self._lock = threading.Lock()
        #: Per stream: the state not yet published (None: removed).
        self._pending: dict[str, StreamState | None] = {}
        #: Per stream: the state last published and when (monotonic).
        self._sent: dict[str, tuple[StreamState, float]] = {}
        self._generation = -1
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        board.subscribe(self._on_state)

    def start(self) -> None:
        """Start the ``mqtt-state`` thread."""
        self._thread = threading.Thread(target=self._run, name="mqtt-state", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        """Publish what is pending (removals included, without the interval) and stop."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self.publish_due(force=True)

    def _on_state(self, stream: str, state: StreamState | None) -> None:
        # Wake the thread only when the state is due now (or the connection is new): a score
        # that changes every window waits for its interval without a wake-up per window (the
        # thread would take the GIL from the pipeline for nothing); the thread's pass at least
        # every second sends what became due meanwhile.
        now = self._monotonic()
        with self._lock:
            self._pending[stream] = state
            due = self._is_due(stream, state, now)
        if due or self._sink.generation != self._generation:
            self._wake.set()

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait(1.0)
            self._wake.clear()
            if self._stopping.is_set():
                return
            self.publish_due()

    def publish_due(self, *, force: bool = False) -> None:
        """Publish every pending state that is due (all of them after a reconnect or with
        ``force``). Called by the thread; tests may call it directly."""
        generation = self._sink.generation
        if generation != self._generation:
            with self._lock:  # a new connection: everything again
                for present in self._board.all():
                    self._pending.setdefault(present.stream, present)
        now = self._monotonic()
        with self._lock:
            due = {s: st for s, st in self._pending.items()
                   if force or generation != self._generation or self._is_due(s, st, now)}
        if not due:
            self._generation = generation
            return
        all_sent = True
        for stream, state in due.items():
            body = b"" if state is None else json.dumps(
                state.to_payload(), separators=(",", ":"), allow_nan=False).encode()
            result = self._sink.publish_latest(self._sink.state_topic(stream), body)
            self._metrics.mqtt_state_total.labels(result=result).inc()
            if result == "skipped":  # not connected: the next connection sends it
                all_sent = False
                continue
            with self._lock:
                if self._pending.get(stream, state) is state:
                    self._pending.pop(stream, None)
            with self._lock:
                if state is None:
                    self._sent.pop(stream, None)
                else:
                    self._sent[stream] = (state, now)
        if all_sent:
            self._generation = generation

    def _is_due(self, stream: str, state: StreamState | None, now: float) -> bool:
        sent = self._sent.get(stream)
        if state is None or sent is None or not state.same_as(sent[0]):
            return True
        return now - sent[1] >= self._interval_s
