"""Sparkplug B payloads of the agent as an edge node, and its persisted bdSeq.

Pure functions over :mod:`agent.sparkplug_b` (the protobuf schema shared with the Sparkplug B
input); :mod:`agent.publish.sparkplug_edge` publishes them. Rules followed (Eclipse Sparkplug
3.0.0, chapter 4 "Topics and messages" and §6.4 "Payloads"):

* NBIRTH: ``seq`` 0, a timestamp, the ``bdSeq`` metric (Int64, no alias: the NDEATH carries it
  by name) and ``Node Control/Rebirth`` (Boolean, false, alias :data:`REBIRTH_ALIAS`);
* NDEATH (the MQTT will): only the ``bdSeq`` metric, no ``seq``;
* DBIRTH per stream: every metric with name, alias, datatype, timestamp and current value
  (``is_null`` while there is none, e.g. no score before the first window);
* DDATA: only the metrics that changed, by alias only (no name, no datatype);
* DDEATH: ``seq`` and a timestamp;
* aliases are unique across the node: stream ``k`` (0-based, config order) has
  ``100 * (k + 1) + i`` for its metric ``i`` in :data:`DEVICE_METRICS`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agent.publish.stream_state import StreamState
from agent.sparkplug_b import (
    BDSEQ_METRIC,
    BOOLEAN,
    DOUBLE,
    INT64,
    REBIRTH_METRIC,
    STRING,
    Payload,
    SparkplugError,
    decode,
)

#: Alias of ``Node Control/Rebirth`` in the NBIRTH (an NCMD may name it by alias only).
REBIRTH_ALIAS = 1
#: Largest NCMD payload parsed, bytes (a rebirth request is a few dozen).
MAX_COMMAND_BYTES = 65_536

#: Per-stream metrics: (name, Sparkplug datatype), in alias order.
DEVICE_METRICS: tuple[tuple[str, int], ...] = (
    ("Anomaly/Score", DOUBLE),
    ("Anomaly/Threshold", DOUBLE),
    ("Anomaly/Active", BOOLEAN),
    ("Status", STRING),
    ("Model/Version", INT64),
)

Value = float | bool | str | int | None


def device_values(state: StreamState | None) -> dict[str, Value]:
    """The metric values of a stream's state (all None before any state)."""
    if state is None:
        return {name: None for name, _ in DEVICE_METRICS}
    return {
        "Anomaly/Score": state.score,
        "Anomaly/Threshold": state.threshold,
        "Anomaly/Active": state.status == "anomalous",
        "Status": state.status,
        "Model/Version": state.model_version,
    }


def alias_of(device_index: int, metric_index: int) -> int:
    """The alias of metric ``metric_index`` of the stream at ``device_index``."""
    return 100 * (device_index + 1) + metric_index


def _set_value(metric: Any, datatype: int, value: Value) -> None:
    if value is None:
        metric.is_null = True
    elif datatype == DOUBLE:
        metric.double_value = float(value)
    elif datatype == BOOLEAN:
        metric.boolean_value = bool(value)
    elif datatype == STRING:
        metric.string_value = str(value)
    else:  # Int64 travels as the uint64 of its two's complement (§6.4.16)
        metric.long_value = int(value) & 0xFFFF_FFFF_FFFF_FFFF


def node_birth(bd_seq: int, timestamp_ms: int) -> bytes:
    """The NBIRTH payload (``seq`` 0) of the session whose will carries ``bd_seq``."""
    msg = Payload(timestamp=timestamp_ms, seq=0)
    bd = msg.metrics.add(name=BDSEQ_METRIC, datatype=INT64, timestamp=timestamp_ms)
    bd.long_value = bd_seq
    rebirth = msg.metrics.add(name=REBIRTH_METRIC, alias=REBIRTH_ALIAS, datatype=BOOLEAN,
                              timestamp=timestamp_ms)
    rebirth.boolean_value = False
    return bytes(msg.SerializeToString())


def node_death(bd_seq: int, timestamp_ms: int) -> bytes:
    """The NDEATH payload: only the ``bdSeq`` metric, no ``seq``."""
    msg = Payload(timestamp=timestamp_ms)
    bd = msg.metrics.add(name=BDSEQ_METRIC, datatype=INT64, timestamp=timestamp_ms)
    bd.long_value = bd_seq
    return bytes(msg.SerializeToString())


def device_birth(device_index: int, values: Mapping[str, Value], seq: int,
                 timestamp_ms: int) -> bytes:
    """A DBIRTH payload: every metric with name, alias, datatype and value."""
    msg = Payload(timestamp=timestamp_ms, seq=seq)
    for i, (name, datatype) in enumerate(DEVICE_METRICS):
        m = msg.metrics.add(name=name, alias=alias_of(device_index, i), datatype=datatype,
                            timestamp=timestamp_ms)
        _set_value(m, datatype, values.get(name))
    return bytes(msg.SerializeToString())


def device_data(device_index: int, changed: Mapping[str, Value], seq: int,
                timestamp_ms: int) -> bytes:
    """A DDATA payload: the ``changed`` metrics by alias only."""
    msg = Payload(timestamp=timestamp_ms, seq=seq)
    for i, (name, datatype) in enumerate(DEVICE_METRICS):
        if name in changed:
            m = msg.metrics.add(alias=alias_of(device_index, i), timestamp=timestamp_ms)
            _set_value(m, datatype, changed[name])
    return bytes(msg.SerializeToString())


def device_death(seq: int, timestamp_ms: int) -> bytes:
    """A DDEATH payload."""
    return bytes(Payload(timestamp=timestamp_ms, seq=seq).SerializeToString())


def rebirth_requested(data: bytes) -> bool:
    """True when an NCMD payload sets ``Node Control/Rebirth`` (by name or alias) to true.

    Raises:
        SparkplugError: Larger than :data:`MAX_COMMAND_BYTES` (``too_large``) or not a
            Sparkplug B payload (``bad_payload``).
    """
    if len(data) > MAX_COMMAND_BYTES:
        raise SparkplugError(f"NCMD of {len(data)} bytes (at most {MAX_COMMAND_BYTES})",
                             "too_large")
    for m in decode(data).metrics:
        named = m.name == REBIRTH_METRIC or (not m.name and m.HasField("alias")
                                              and int(m.alias) == REBIRTH_ALIAS)
        if named and m.WhichOneof("value") == "boolean_value" and m.boolean_value:
            return True
    return False


class BdSeqFile:
    """The last bdSeq used, in a small JSON file, so a restart never repeats it (§4: bdSeq
    starts at 0 and goes up by one with every MQTT CONNECT; 0-255, wrapping).

    A file that cannot be read starts again at 0; one that cannot be written is logged once and
    the count goes on in memory.
    """

    def __init__(self, path: Path, logger: logging.Logger | None = None) -> None:
        self.path = path
        self._log = logger or logging.getLogger(__name__)
        self._failing = False
        self.last: int | None = None
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            raw = json.loads(path.read_text(encoding="utf-8"))["bdSeq"]
            if isinstance(raw, int) and 0 <= raw <= 255:
                self.last = raw

    def next(self) -> int:
        """The bdSeq of the next CONNECT, saved before it is used."""
        self.last = 0 if self.last is None else (self.last + 1) % 256
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, json.dumps({"bdSeq": self.last}).encode("ascii"))
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            self._failing = False
        except OSError as exc:
            if not self._failing:
                self._failing = True
                self._log.error("Sparkplug B: cannot save bdSeq to %s (%s); a restart may "
                                "repeat it", self.path, exc)
        return self.last
