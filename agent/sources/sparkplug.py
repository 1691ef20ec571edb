"""The edge-node state an MQTT-in stream keeps for Sparkplug B input.

The wire format (payload schema, topics, value decoding) is :mod:`agent.sparkplug_b`, shared with
the Sparkplug B output of :mod:`agent.publish.sparkplug_edge`; its names are re-exported here.

:class:`NodeState` follows one edge node: births map metric names to aliases (§6.4.5: a data
message may carry only the alias), ``seq`` runs 0..255 per node and wraps (§6.4.21; a jump is a
gap: messages were lost), ``bdSeq`` (the birth/death sequence number, §6.4.15) changes with
every new session of the node.

Only the alias table of the stream's own device (or of the node, for a stream of the node's
own metrics) is kept: a stream maps no other device's metrics, and births of device ids it
does not map, however many a publisher makes up, cost no memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from agent.sparkplug_b import (
    BDSEQ_METRIC,
    NAMESPACE,
    NUMERIC_TYPES,
    REBIRTH_METRIC,
    Payload,
    SparkplugError,
    Topic,
    decode,
    metric_value,
    parse_topic,
    rebirth_payload,
)

__all__ = [
    "BDSEQ_METRIC", "NAMESPACE", "NUMERIC_TYPES", "REBIRTH_METRIC", "NodeState", "Payload",
    "SparkplugError", "Topic", "decode", "metric_value", "parse_topic", "rebirth_payload",
]


@dataclass
class NodeState:
    """What the agent knows of one edge node's session (see the module docstring).

    Attributes:
        device: The device whose aliases are kept (``None`` = the node itself).
        aliases: alias -> metric name of ``device``, from its last birth; None before one.
        last_seq: seq of the last message, None before the first (or after a death).
        bd_seq: bdSeq of the node's current birth.
    """

    device: str | None = None
    aliases: dict[int, str] | None = None
    last_seq: int | None = None
    bd_seq: int | None = None

    def observe_seq(self, seq: int) -> int:
        """Record a message's seq; returns how many messages were skipped (0 = in order)."""
        previous, self.last_seq = self.last_seq, seq % 256
        if previous is None:
            return 0
        return (seq - previous - 1) % 256

    def birth(self, device: str | None, payload: Any) -> int | None:
        """Learn a birth (NBIRTH: ``device`` None; DBIRTH: its device id): the aliases when it
        is :attr:`device`'s, the bdSeq when it is the node's. Returns the previous bdSeq when an
        NBIRTH changed it."""
        if device == self.device:
            self.aliases = {int(m.alias): m.name for m in payload.metrics
                            if m.HasField("alias") and m.name}
        if device is not None:
            return None
        changed = None
        for m in payload.metrics:
            if m.name == BDSEQ_METRIC:
                value = metric_value(m)
                new = None if value is None or not math.isfinite(value) else int(value)
                if self.bd_seq is not None and new != self.bd_seq:
                    changed = self.bd_seq
                self.bd_seq = new
        return changed

    @property
    def born(self) -> bool:
        """True once :attr:`device` has had a birth."""
        return self.aliases is not None

    def name_of(self, metric: Any) -> str | None:
        """A metric of :attr:`device`: its own name, or the one its alias was born with
        (None = unknown)."""
        if metric.name:
            return str(metric.name)
        if metric.HasField("alias") and self.aliases is not None:
            return self.aliases.get(int(metric.alias))
        return None
