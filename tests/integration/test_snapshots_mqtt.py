"""Retained snapshot topics with a real mosquitto (agent.publish.snapshots): a late subscriber
gets the latest JPEG and heatmap and they open as images; an oversized snapshot is kept and
counted while its alert goes out; a broker refusing retained messages does not stop alerts."""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent.metrics import Metrics
from agent.publish.mqtt import MqttConfig, MqttPublisher
from agent.publish.snapshots import SnapshotPublisher
from agent.services import snapshot_render as render
from agent.store.sqlite import Store
from tests.conftest import MosquittoBroker, _require_mosquitto
from tests.integration.mqtt_subscriber import Subscriber, subscriber_factory
from tests.unit.test_store import make_alert

Image = pytest.importorskip("PIL.Image")

DEADLINE_S = 30.0


@pytest.fixture
def subscribers() -> Iterator[Callable[..., Subscriber]]:
    yield from subscriber_factory(Subscriber)


def wait_for(cond: Callable[[], Any], what: str, timeout_s: float = DEADLINE_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class Agent:
    """The alert publisher and the snapshot publisher over one store."""

    def __init__(self, tmp: Path, broker: MosquittoBroker, **mqtt: Any) -> None:
        self.metrics = Metrics()
        self.store = Store(tmp / "agent.db", metrics=self.metrics)
        cfg = MqttConfig(enabled=True, host=broker.host, port=broker.port, keepalive_s=5,
                         reconnect_min_s=1, reconnect_max_s=1, **mqtt)
        self.pub = MqttPublisher(cfg, self.store, "gw1", self.metrics)
        self.snaps = SnapshotPublisher(self.pub, self.store, "gw1", self.metrics, poll_s=0.2)
        self.pub.start()
        self.snaps.start()

    def raise_alert(self, seq: int, image: np.ndarray, max_edge: int = 320) -> tuple[str, bytes]:
        alert = make_alert(seq, stream="cam")
        self.store.add_alert(alert)
        self.pub.notify()
        pm = np.zeros((16, 16), np.float32)
        pm[12, 4] = 3.0
        jpeg = render.frame_jpeg(image, max_edge, 80)
        png = render.heatmap_png(image, pm, alert.threshold, max_edge)
        self.store.add_snapshot(alert.alert_id, "cam", {}, jpeg, png)
        self.snaps.notify()
        return alert.alert_id, jpeg

    def state(self, alert_id: str) -> Any:
        return self.store.snapshot_states([alert_id]).get(alert_id, (None, None))[0]

    def count(self, name: str, labels: dict[str, str]) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0

    def close(self) -> None:
        self.snaps.stop()
        self.pub.stop()
        self.store.close()


@pytest.fixture
def agents() -> Iterator[Callable[..., Agent]]:
    made: list[Agent] = []

    def make(tmp: Path, broker: MosquittoBroker, **mqtt: Any) -> Agent:
        made.append(Agent(tmp, broker, **mqtt))
        return made[-1]

    yield make
    for a in made:
        a.close()


def frame(h: int = 480, w: int = 640) -> np.ndarray:
    img = np.zeros((h, w, 3), np.uint8)
    img[:, : w // 2] = (0, 0, 255)  # red left half (BGR)
    return img


def test_late_subscriber_gets_the_retained_snapshot_and_heatmap_as_images(
    tmp_path: Path, mosquitto: MosquittoBroker, subscribers: Callable[..., Subscriber],
    agents: Callable[..., Agent],
) -> None:
    agent = agents(tmp_path, mosquitto)
    # "published" means handed to paho (QoS 0): the broker has it once a subscriber got it
    live = subscribers(mosquitto, ["edge/gw1/cam/snapshot", "edge/gw1/cam/heatmap"])
    first, _ = agent.raise_alert(1, frame())
    wait_for(lambda: agent.state(first) == "published", "the first snapshot published")
    second, jpeg = agent.raise_alert(2, frame(240, 640))
    wait_for(lambda: agent.state(second) == "published", "the second snapshot published")
    wait_for(lambda: len(live.messages("edge/gw1/cam/heatmap")) == 2, "the broker to have both")
    late = subscribers(mosquitto, ["edge/gw1/cam/snapshot", "edge/gw1/cam/heatmap",
                                   "edge/gw1/alerts"])
    snap = wait_for(lambda: late.messages("edge/gw1/cam/snapshot"), "the retained snapshot")
    heat = wait_for(lambda: late.messages("edge/gw1/cam/heatmap"), "the retained heatmap")
    assert len(snap) == 1 and snap[0].retain and snap[0].payload == jpeg  # only the latest
    with Image.open(io.BytesIO(snap[0].payload)) as img:
        assert img.format == "JPEG" and img.size == (320, 120)
    with Image.open(io.BytesIO(heat[0].payload)) as img:
        assert img.format == "PNG" and img.size == (320, 120 + render.LEGEND_PX)
    assert late.alerts() == []  # alerts are not retained
    assert agent.count("edge_agent_snapshots_published_total", {"retained": "true"}) == 2


def test_oversized_snapshot_is_kept_and_counted_while_its_alert_goes_out(
    tmp_path: Path, mosquitto: MosquittoBroker, subscribers: Callable[..., Subscriber],
    agents: Callable[..., Agent],
) -> None:
    sub = subscribers(mosquitto, ["edge/gw1/#"])
    agent = agents(tmp_path, mosquitto, max_message_bytes=4096)
    noise = np.random.default_rng(0).integers(0, 256, (480, 640, 3)).astype(np.uint8)
    alert_id, jpeg = agent.raise_alert(1, noise, max_edge=640)
    assert len(jpeg) > 4096
    wait_for(lambda: alert_id in sub.alert_ids(), "the alert")
    wait_for(lambda: agent.state(alert_id) == "oversize", "the snapshot marked oversize")
    assert agent.count("edge_agent_snapshots_unpublished_total", {"reason": "oversize"}) == 1
    stored = agent.store.snapshot(alert_id)
    assert stored is not None and stored.jpeg == jpeg  # kept in the store
    assert sub.messages("edge/gw1/cam/snapshot") == []
    second, _ = agent.raise_alert(2, np.zeros((64, 64), np.uint8))  # small: published
    wait_for(lambda: agent.state(second) == "published", "a small snapshot published")
    wait_for(lambda: second in sub.alert_ids(), "the second alert")


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_snapshot_over_the_brokers_own_limit_is_kept_counted_and_not_retried_forever(
    tmp_path: Path, subscribers: Callable[..., Subscriber], agents: Callable[..., Agent],
    protocol: str,
) -> None:
    """mosquitto's max_packet_size below the snapshot, mqtt.max_message_bytes unset. Over 5 the
    CONNACK announces the limit; over 3.1.1 the broker drops the connection at the snapshot, which
    was taken for a broker refusing retained messages (retained publishing turned off for good)
    and re-sent until marked failed. Now: kept, counted as oversize, the alert goes out, and the
    next snapshot that fits is published retained."""
    broker = MosquittoBroker(_require_mosquitto(), tmp_path / "broker",
                             extra=("max_packet_size 65536",))
    broker.start()
    try:
        sub = subscribers(broker, ["edge/gw1/#"])
        agent = agents(tmp_path, broker, protocol=protocol)
        wait_for(lambda: agent.pub.connected, "the connection")
        noise = np.random.default_rng(0).integers(0, 256, (480, 640, 3)).astype(np.uint8)
        alert_id, jpeg = agent.raise_alert(1, noise, max_edge=640)
        assert len(jpeg) > 65536 and agent.pub.config.max_message_bytes is None
        wait_for(lambda: alert_id in sub.alert_ids(), "the alert")
        wait_for(lambda: agent.state(alert_id) == "oversize", "the snapshot marked oversize")
        assert agent.count("edge_agent_snapshots_unpublished_total", {"reason": "oversize"}) == 1
        stored = agent.store.snapshot(alert_id)
        assert stored is not None and stored.jpeg == jpeg  # kept in the store
        wait_for(lambda: agent.pub.connected, "the connection back")
        lost = agent.count("edge_agent_mqtt_disconnects_total", {})
        # 3.1.1: the probe costs 2 connections (retained, then not retained). A CI run at load
        # 10+ once counted a third; what matters is that none follows (below: never sent again).
        assert lost <= (0 if protocol == "5" else 3)
        second, small = agent.raise_alert(2, frame(120, 160))  # fits: published, retained
        wait_for(lambda: second in sub.alert_ids(), "the second alert")
        wait_for(lambda: sub.messages("edge/gw1/cam/snapshot"), "the small snapshot")
        time.sleep(1.0)  # a connection the small snapshot dropped would show by now
        assert agent.count("edge_agent_mqtt_disconnects_total", {}) == lost  # not sent again
        assert [m.payload for m in sub.messages("edge/gw1/cam/snapshot")] == [small]
        assert not agent.snaps.no_retain
        late = subscribers(broker, ["edge/gw1/cam/snapshot"])
        got = wait_for(lambda: late.messages("edge/gw1/cam/snapshot"), "the retained snapshot")
        assert got[0].retain and got[0].payload == small
        assert agent.count("edge_agent_snapshots_unpublished_total", {"reason": "failed"}) == 0
        assert agent.state(alert_id) == "oversize"
    finally:
        broker.kill()


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_broker_refusing_retained_messages_does_not_stop_alerts(
    tmp_path: Path, subscribers: Callable[..., Subscriber], agents: Callable[..., Agent],
    protocol: str,
) -> None:
    broker = MosquittoBroker(_require_mosquitto(), tmp_path / "broker",
                             extra=("retain_available false",))
    broker.start()
    try:
        sub = subscribers(broker, ["edge/gw1/alerts", "edge/gw1/cam/snapshot"])
        agent = agents(tmp_path, broker, protocol=protocol)
        wait_for(lambda: agent.pub.connected, "the connection")
        ids = []
        for seq in (1, 2, 3):
            alert_id, _ = agent.raise_alert(seq, frame(120, 160))
            ids.append(alert_id)
            wait_for(lambda a=alert_id: a in sub.alert_ids(), f"alert {alert_id}")
            wait_for(lambda a=alert_id: agent.state(a) in ("published", "superseded", "failed"),
                     f"snapshot of {alert_id} settled")
        got = wait_for(lambda: sub.messages("edge/gw1/cam/snapshot"), "a snapshot, not retained")
        assert all(not m.retain for m in got)
        assert agent.count("edge_agent_snapshots_published_total", {"retained": "false"}) >= 1
        assert sorted(set(sub.alert_ids())) == sorted(ids)
    finally:
        broker.kill()
