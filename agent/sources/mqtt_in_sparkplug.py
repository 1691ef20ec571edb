"""Sparkplug B messages of one ``mqtt`` stream -> channel updates (protobuf: extra ``sparkplug``).

NBIRTH/DBIRTH map aliases to names (:class:`agent.sources.sparkplug.NodeState`); NDATA/DDATA
update the mapped metrics; a ``seq`` gap, a changed ``bdSeq``, an alias or a device nobody
announced, and data before any birth are events (``edge_agent_sparkplug_events_total{event}``);
the last three also reject the metric (``unknown_alias``). With ``request_rebirth`` an NCMD
rebirth request follows, at most once per :data:`REBIRTH_EVERY_S`. The NDEATH, or the DDEATH of
the stream's own device, clears the held values. ``seq`` runs over every message of the node
(§6.4.21), other devices' included.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent.errors import RecordError
from agent.sources import mqtt_in_payloads as payloads
from agent.sources import sparkplug as sp
from agent.sources.base import Reject
from agent.sources.mqtt_in_config import MqttInConfig

#: Fewest seconds between two rebirth requests to one node.
REBIRTH_EVERY_S = 5.0


class SparkplugInput:
    """Turns one stream's Sparkplug B messages into channel updates.

    Args:
        config: The stream's ``mqtt`` config (``format = "sparkplug_b"``).
        event: ``event(name, count)``: counts a Sparkplug B event.
        clock, monotonic: Wall clock (rebirth request timestamps), monotonic clock (their
            spacing), seconds.
    """

    def __init__(self, config: MqttInConfig, event: Callable[[str, int], None],
                 clock: Callable[[], float], monotonic: Callable[[], float]) -> None:
        self.config = config
        self.node = sp.NodeState(config.device_id)
        self._event = event
        self._clock = clock
        self._monotonic = monotonic
        self._last_rebirth = -float("inf")
        # metric name -> channel index (the first channel naming it, as configured)
        self._channel: dict[str, int] = {}
        for i, name in enumerate(config.metrics.values()):
            self._channel.setdefault(name, i)

    def read(self, client: Any, msg: Any, reject: Reject
             ) -> tuple[dict[int, float], float | None, bool]:
        """``(updates, newest timestamp or None, clear)`` of one message; ``clear`` = a death:
        drop the held values.

        Raises:
            RecordError: The topic or payload is no Sparkplug B, or a timestamp is no time.
        """
        try:
            topic = sp.parse_topic(msg.topic)
            payload = sp.decode(msg.payload)
        except sp.SparkplugError as exc:
            raise RecordError(str(exc), reason=exc.reason) from None
        node, kind, device = self.node, topic.kind, topic.device or None
        if kind == "NDEATH":
            node.last_seq = None
            return {}, None, True
        if payload.HasField("seq") and kind != "NBIRTH":
            gap = node.observe_seq(int(payload.seq))
            if gap:
                self._event("seq_gap", gap)
                self._rebirth(client)
        if kind == "DDEATH":  # carries a seq; clears only this stream's device
            return {}, None, device == self.config.device_id
        if kind == "NBIRTH":
            node.last_seq = int(payload.seq) % 256 if payload.HasField("seq") else None
            if node.birth(None, payload) is not None:
                self._event("bdseq_change", 1)
        elif kind == "DBIRTH":
            node.birth(device, payload)
        if device != self.config.device_id:
            return {}, None, False
        if kind in ("NDATA", "DDATA") and not node.born:
            self._event("data_before_birth", 1)
            self._rebirth(client)
        return (*self._metrics(client, msg.topic, payload, reject), False)

    def _metrics(self, client: Any, topic: str, payload: Any, reject: Reject
                 ) -> tuple[dict[int, float], float | None]:
        updates: dict[int, float] = {}
        newest: float | None = None
        for m in payload.metrics:
            name = self.node.name_of(m)
            if name is None:
                self._event("unknown_alias", 1)
                reject(RecordError(f"metric alias {int(m.alias)} of {topic[:200]!r} was "
                                   "never born", reason="unknown_alias"))
                self._rebirth(client)
                continue
            i = self._channel.get(name)
            if i is None:
                continue
            value = sp.metric_value(m)
            if value is None:
                if not m.is_null:  # a null metric is "no value now", not a wrong one
                    reject(RecordError(f"metric {name!r} of {topic[:200]!r} is not a number",
                                       reason="wrong_type"))
                continue
            updates[i] = payloads.number(value, f"metric {name!r}")
            if m.HasField("timestamp"):
                t = payloads.check_epoch(int(m.timestamp) / 1000.0, int(m.timestamp))
                newest = t if newest is None else max(newest, t)
        if newest is None and payload.HasField("timestamp"):
            newest = payloads.check_epoch(int(payload.timestamp) / 1000.0,
                                          int(payload.timestamp))
        return updates, newest

    def _rebirth(self, client: Any) -> None:
        now = self._monotonic()
        if not self.config.request_rebirth or now - self._last_rebirth < REBIRTH_EVERY_S:
            return
        self._last_rebirth = now
        cfg = self.config
        client.publish(f"spBv1.0/{cfg.group_id}/NCMD/{cfg.edge_node_id}",
                       sp.rebirth_payload(int(self._clock() * 1000)), qos=0)
        self._event("rebirth_requested", 1)
