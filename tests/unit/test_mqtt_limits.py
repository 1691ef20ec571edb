"""The publisher's pure checks (agent.publish.limits): sizes, reduced form, progress, poison."""

from __future__ import annotations

import doctest
import json
from types import ModuleType

import pytest

from agent.publish import limits
from agent.publish.limits import (
    PoisonWatch,
    ProgressGuard,
    SizeLimit,
    publish_packet_bytes,
    reduce_payload,
    varint_len,
)
from agent.records import Alert, TopChannel
from agent.store import deferred


@pytest.mark.parametrize("module", [limits, deferred], ids=lambda m: m.__name__)
def test_doctests(module: ModuleType) -> None:
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


def alert(channels: int) -> str:
    a = Alert(alert_id="gw1:pump1:7", device_id="gw1", stream="pump1", seq=7,
              model_name="ae", model_version=2, score=3.0, threshold=1.5,
              window_start=1_700_000_000.0, window_end=1_700_000_001.0,
              raised_at=1_700_000_001.2,
              top_channels=tuple(TopChannel(f"ch{i:04d}", 0.01) for i in range(channels)))
    return json.dumps(a.to_payload(), separators=(",", ":"))


def test_packet_size_matches_the_mqtt_encoding() -> None:
    # 127 bytes of Remaining Length fit one length byte, 128 need two (MQTT 5.0 1.5.5)
    topic = "t"
    payload = b"x" * (127 - 2 - 1 - 2)
    assert publish_packet_bytes(topic, payload, v5=False) == 1 + 1 + 127
    assert publish_packet_bytes(topic, payload + b"x", v5=False) == 1 + 2 + 128
    assert varint_len(268_435_455) == 4


def test_reduced_form_keeps_every_required_key() -> None:
    big = alert(200)
    small = reduce_payload(big)
    assert small is not None
    body = json.loads(small)
    full = json.loads(big)
    assert body["reduced"] is True and body["top_channels"] == []
    for key in ("schema", "alert_id", "device_id", "stream", "seq", "model", "score",
                "threshold", "window_start", "window_end", "raised_at"):
        assert body[key] == full[key]
    assert reduce_payload("not json") is None and reduce_payload("[1]") is None


def test_size_limit_verdicts() -> None:
    limit = SizeLimit("edge/gw1/alerts", max_message_bytes=1024)
    fits = limit.check(alert(2))
    assert fits.payload is not None and not fits.reduced and fits.reason is None
    reduced = limit.check(alert(200))
    assert reduced.payload is not None and reduced.reduced
    assert "max_message_bytes (1024)" in (reduced.reason or "")
    limit.broker_max_packet = 100  # even the reduced form is larger
    dead = limit.check(alert(200))
    assert dead.payload is None and "max_message_bytes (1024)" in (dead.reason or "")
    limit.max_message_bytes = None
    dead = limit.check(alert(200))
    assert dead.payload is None and "Maximum Packet Size (100)" in (dead.reason or "")


def test_learned_limit_only_shrinks() -> None:
    limit = SizeLimit("t", None)
    limit.learn(2000)
    limit.learn(5000)
    assert limit.learned_max_packet == 1999
    assert "learned" in (limit.problem(b"x" * 2000) or "")


def test_progress_guard_waits_only_while_alerts_are_in_flight() -> None:
    g = ProgressGuard(10.0)
    assert not g.observe(0.0, in_flight=0, connected=True)
    assert not g.observe(100.0, in_flight=0, connected=True)  # idle: no wait
    assert not g.observe(100.0, in_flight=1, connected=True)
    assert not g.observe(105.0, in_flight=1, connected=False)  # disconnected: starts again
    assert not g.observe(106.0, in_flight=1, connected=True)
    assert not g.observe(116.0, in_flight=1, connected=True)
    assert g.observe(116.5, in_flight=1, connected=True)
    assert g.waited(117.0) == pytest.approx(0.5)


def test_poison_watch_needs_consecutive_short_connections() -> None:
    w = PoisonWatch(strikes=3, short_s=10.0)
    assert not w.lost(("r", 5), 0.5)
    assert not w.lost(None, 0.5)  # nothing in flight: starts again
    assert [w.lost(("r", 5), 0.5) for _ in range(3)] == [False, False, True]
    assert not w.lost(("r", 5), 0.5)  # counted afresh after a verdict
