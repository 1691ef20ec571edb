"""MQTT in: the per-message cost of the source's callback, from the payload to the agent's queue
(decode, sample and hold, supervisor checks and counters, the queue put), measured against a
bare ``json.loads`` of the same payload so that the machine's speed cancels out.

With every dotted field path split per message, an ABC ``isinstance`` check per field, a
numpy NaN scan per message and numpy calls for the valid range, this took about 7 times
``json.loads`` of a pump's 8-field row, and the reader drained a broker at about a quarter of
paho's own rate (benchmarks/mqtt_in_drain.py).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from types import SimpleNamespace

from prometheus_client import CollectorRegistry

from agent.metrics import Metrics
from agent.reading_queue import ReadingQueue
from agent.services.supervisor import SourceSupervisor
from agent.sources.mqtt_in import MqttInSource
from agent.sources.mqtt_in_config import MqttInConfig

CHANNELS = ["Accelerometer1RMS", "Accelerometer2RMS", "Current", "Pressure", "Temperature",
            "Thermocouple", "Voltage", "Volume Flow RateRMS"]
#: Most a message may cost, in bare json.loads of its payload (about 3 measured; 7 before).
MAX_RATIO = 5.0


def _payload(k: int) -> bytes:
    row: dict[str, float] = {"ts": 1_700_000_000.0 + k * 0.01}
    row.update({c: 1.0 + (k % 97) * 0.01 + j for j, c in enumerate(CHANNELS)})
    return json.dumps(row).encode()


def test_a_message_costs_a_few_json_decodes_at_most() -> None:
    config = MqttInConfig.model_validate({"format": "json", "topics": ["t"],
                                          "fields": {c: c for c in CHANNELS},
                                          "timestamp_field": "ts"})
    source = MqttInSource(config, "s")
    stop = threading.Event()
    queue = ReadingQueue(10**7, stop)
    sup = SourceSupervisor(source, queue.put_until_stopped, Metrics(CollectorRegistry()), stop,
                           logging.getLogger("test.cost"))
    msgs = [SimpleNamespace(topic="t", payload=_payload(k), qos=0, mid=0) for k in range(3000)]
    best_cb = best_json = float("inf")
    for _ in range(7):
        t = time.perf_counter()
        for msg in msgs:
            source._on_message(None, msg, sup._emit, sup._reject)
        best_cb = min(best_cb, time.perf_counter() - t)
        t = time.perf_counter()
        for msg in msgs:
            json.loads(msg.payload)
        best_json = min(best_json, time.perf_counter() - t)
    assert queue.qsize() == 7 * len(msgs)  # every message became a queued reading
    ratio = best_cb / best_json
    assert ratio < MAX_RATIO, (f"{best_cb / len(msgs) * 1e6:.1f} us per message, "
                               f"{ratio:.1f} x json.loads")
