"""What the MQTT publisher checks before and after publishing: message size and progress.

Pure code (no I/O, no threads): :class:`SizeLimit` decides whether an alert fits the broker's
limits and builds its reduced form; :class:`ProgressGuard` decides when an open connection that
acknowledges nothing must be dropped and rebuilt.

Sizes follow MQTT 3.1.1 section 3.3 and MQTT 5.0 section 3.3: a QoS 1 PUBLISH packet is
1 byte of packet type, the Remaining Length (a variable byte integer of 1-4 bytes), the topic
(2-byte length + UTF-8), the 2-byte packet identifier, with MQTT 5 the property length (1 byte,
no properties) and the payload.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

#: Largest Remaining Length MQTT allows (variable byte integer of 4 bytes).
MQTT_MAX_REMAINING = 268_435_455

#: Keys a reduced alert keeps: every required key of schema 1 (``top_channels`` emptied) and
#: the lifecycle keys of schema 2.
_REQUIRED = ("schema", "event", "episode_id", "alert_id", "device_id", "stream", "seq", "model",
             "score", "threshold", "peak_score", "reason", "window_start", "window_end",
             "raised_at")


def varint_len(n: int) -> int:
    """Bytes of MQTT's variable byte integer for ``n`` (MQTT 5.0 section 1.5.5).

    >>> [varint_len(n) for n in (0, 127, 128, 16_383, 16_384, 2_097_152)]
    [1, 1, 2, 2, 3, 4]
    """
    size = 1
    while n > 127:
        n >>= 7
        size += 1
    return size


def publish_packet_bytes(topic: str, payload: bytes, *, v5: bool) -> int:
    """Size in bytes of a QoS 1 PUBLISH packet without properties (what a broker's
    Maximum Packet Size is compared with).

    >>> publish_packet_bytes("a/b", b"x" * 10, v5=False)
    19
    >>> publish_packet_bytes("a/b", b"x" * 10, v5=True)
    20
    """
    remaining = 2 + len(topic.encode("utf-8")) + 2 + (1 if v5 else 0) + len(payload)
    return 1 + varint_len(remaining) + remaining


@dataclass(frozen=True, slots=True)
class Verdict:
    """What to do with one alert: send ``payload`` (the original or its reduced form), or
    dead-letter it (``payload`` None) for ``reason``."""

    payload: bytes | None
    reduced: bool
    reason: str | None


class SizeLimit:
    """The limits an alert message must fit.

    Args:
        topic: The alerts topic.
        max_message_bytes: Largest payload in bytes the broker takes (configured; e.g.
            mosquitto's ``message_size_limit``), None for no such limit.
    """

    def __init__(self, topic: str, max_message_bytes: int | None) -> None:
        self.topic = topic
        self.max_message_bytes = max_message_bytes
        #: Maximum Packet Size from the broker's CONNACK (MQTT 5), None when not announced.
        self.broker_max_packet: int | None = None
        #: Largest packet the broker took without dropping the connection, as learned from an
        #: alert it dropped the connection for again and again (:class:`PoisonWatch`).
        self.learned_max_packet: int | None = None
        self.v5 = False

    def learn(self, packet_bytes: int) -> None:
        """The broker drops the connection for a packet of ``packet_bytes``: take one byte
        less as its limit from now on (until the agent restarts)."""
        limit = max(1, packet_bytes - 1)
        if self.learned_max_packet is None or limit < self.learned_max_packet:
            self.learned_max_packet = limit

    def problem(self, payload: bytes, properties_bytes: int = 0) -> str | None:
        """Why ``payload`` cannot be sent (None when it fits); ``properties_bytes``: the MQTT 5
        properties the PUBLISH carries besides (they count in its packet size).

        >>> SizeLimit("t", 20).problem(b"x" * 21)
        'payload of 21 bytes is over mqtt.max_message_bytes (20)'
        """
        if self.max_message_bytes is not None and len(payload) > self.max_message_bytes:
            return (f"payload of {len(payload)} bytes is over mqtt.max_message_bytes "
                    f"({self.max_message_bytes})")
        packet = publish_packet_bytes(self.topic, payload, v5=self.v5) + properties_bytes
        if self.broker_max_packet is not None and packet > self.broker_max_packet:
            return (f"packet of {packet} bytes is over the broker's Maximum Packet Size "
                    f"({self.broker_max_packet})")
        if self.learned_max_packet is not None and packet > self.learned_max_packet:
            return (f"packet of {packet} bytes is over what the broker takes without dropping "
                    f"the connection ({self.learned_max_packet}, learned)")
        if packet - 1 - varint_len(packet) > MQTT_MAX_REMAINING:
            return f"packet of {packet} bytes is over MQTT's largest packet"
        return None

    def check(self, payload: str) -> Verdict:
        """The payload as sent: unchanged when it fits, else its reduced form (see
        :func:`reduce_payload`) when that fits, else a dead letter with the reason."""
        raw = payload.encode("utf-8")
        why = self.problem(raw)
        if why is None:
            return Verdict(raw, False, None)
        small = reduce_payload(payload)
        if small is not None:
            small_raw = small.encode("utf-8")
            if self.problem(small_raw) is None:
                return Verdict(small_raw, True, why)
        return Verdict(None, False, why)


def reduce_payload(payload: str) -> str | None:
    """The reduced form of an alert payload: the required keys of schema 1 and the lifecycle
    keys of schema 2 with an empty ``top_channels`` and ``"reduced": true`` (additive, same
    schema); ``source``, ``explanation`` and any other optional key dropped. None when
    ``payload`` is not a JSON object.

    >>> reduce_payload('{"schema":1,"alert_id":"a","top_channels":[{"channel":"x"}],"source":{}}')
    '{"schema":1,"alert_id":"a","top_channels":[],"reduced":true}'
    """
    try:
        body = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    small = {k: body[k] for k in _REQUIRED if k in body}
    small["top_channels"] = []
    small["reduced"] = True
    return json.dumps(small, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


class ProgressGuard:
    """Decides when a connection that is up but acknowledges nothing must be rebuilt.

    A stall is: at least one alert in flight, the connection up, and no PUBACK (nor a new
    connection, nor the first publish after an idle spell) for ``timeout_s``. The clock is the
    caller's monotonic one (seconds).

    >>> g = ProgressGuard(90.0)
    >>> g.observe(10.0, in_flight=2, connected=True)
    False
    >>> g.observe(99.0, in_flight=2, connected=True)
    False
    >>> g.observe(100.5, in_flight=2, connected=True)
    True
    >>> g.progress(101.0); g.observe(150.0, in_flight=2, connected=True)
    False
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._since: float | None = None  # monotonic start of the current wait

    def progress(self, now: float) -> None:
        """A PUBACK arrived or a connection was made: the wait starts again."""
        self._since = now

    def observe(self, now: float, *, in_flight: int, connected: bool) -> bool:
        """True when the connection must be dropped (the wait starts again after that)."""
        if not connected or in_flight == 0:
            self._since = None
            return False
        if self._since is None:
            self._since = now
            return False
        if now - self._since > self.timeout_s:
            self._since = now
            return True
        return False

    def waited(self, now: float) -> float:
        """Seconds of the current wait (0 when none)."""
        return 0.0 if self._since is None else max(0.0, now - self._since)


class PoisonWatch:
    """Spots an alert the broker drops the connection for (a size limit it does not announce:
    MQTT 3.1.1 with mosquitto's ``max_packet_size``; a PUBACK paho cannot decode).

    The same message oldest in flight at ``strikes`` connection losses in a row, each
    connection shorter than ``short_s`` seconds, is taken for such an alert.

    >>> w = PoisonWatch(strikes=3, short_s=10.0)
    >>> [w.lost("a", 0.2), w.lost("a", 0.1), w.lost("a", 0.3)]
    [False, False, True]
    >>> [w.lost("a", 0.2), w.lost("b", 0.1), w.lost("b", 60.0), w.lost("b", 0.1)]
    [False, False, False, False]
    """

    def __init__(self, strikes: int = 3, short_s: float = 10.0) -> None:
        self.strikes = strikes
        self.short_s = short_s
        self._suspect: object | None = None
        self._count = 0

    def lost(self, oldest: object | None, lasted_s: float) -> bool:
        """A connection ended after ``lasted_s`` seconds with ``oldest`` the first message in
        flight (None: nothing in flight). True when ``oldest`` is taken for a poison."""
        if oldest is None or lasted_s >= self.short_s:
            self._suspect, self._count = None, 0
            return False
        if oldest == self._suspect:
            self._count += 1
        else:
            self._suspect, self._count = oldest, 1
        if self._count >= self.strikes:
            self._suspect, self._count = None, 0
            return True
        return False
