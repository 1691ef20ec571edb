"""The 3.1.1 snapshot probe when the broker drops the connection between a snapshot's two parts.

The real-broker test is ``tests/integration/test_snapshots_mqtt.py``; this stand-in publisher
makes the interleaving it hit now and then (the JPEG written, the connection dropped before the
heatmap's PUBLISH) happen every time.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np

from agent.metrics import Metrics
from agent.publish.snapshots import SnapshotPublisher
from agent.store.sqlite import Store
from tests.unit.test_store import make_alert


class DropsAtTheSecondPart:
    """Takes a PUBLISH of up to ``limit`` bytes; a larger one drops the connection, which is
    noticed before the next PUBLISH of the same snapshot (a 3.1.1 broker's ``max_packet_size``)."""

    def __init__(self, limit: int) -> None:
        self.config = SimpleNamespace(topic_prefix="edge", max_message_bytes=None)
        self.limit = SimpleNamespace(broker_max_packet=None, learned_max_packet=None)
        self.v5 = False
        self.retain_available = True
        self.connected = True
        self.generation = 1
        self.max_packet = limit
        self.sent: list[tuple[str, int, bool]] = []
        self._dropping = False

    def publish_best_effort(self, topic: str, payload: bytes, *, retain: bool,
                            properties: object = None) -> object | None:
        if self._dropping:  # the broker's drop reached paho before this part
            self.connected = False
            self._dropping = False
            return None
        if not self.connected:
            return None
        self.sent.append((topic, len(payload), retain))
        if len(payload) > self.max_packet:
            self._dropping = True
        return object()

    def reconnect(self) -> None:
        self.connected = True
        self.generation += 1


def test_a_connection_lost_between_the_parts_counts_against_the_snapshot(tmp_path: Path) -> None:
    metrics = Metrics()
    store = Store(tmp_path / "agent.db", metrics=metrics)
    pub = DropsAtTheSecondPart(limit=1000)
    snaps = SnapshotPublisher(pub, store, "gw1", metrics)  # type: ignore[arg-type]
    alert = make_alert(1, stream="cam")
    store.add_alert(alert)
    jpeg = np.random.default_rng(0).integers(0, 256, 5000).astype(np.uint8).tobytes()
    store.add_snapshot(alert.alert_id, "cam", {}, jpeg, b"png" * 10)
    try:
        for _ in range(4):  # retained, lost; not retained, lost: too large
            assert snaps.run_once() == 0
            pub.reconnect()
        snaps.run_once()
        state = store.snapshot_states([alert.alert_id])[alert.alert_id][0]
        assert state == "oversize"
        assert [retain for _, _, retain in pub.sent] == [True, False]
        assert snaps.learned_max_packet is not None and snaps.learned_max_packet < 5100
        assert metrics.registry.get_sample_value(
            "edge_agent_snapshots_unpublished_total", {"reason": "oversize"}) == 1
        assert metrics.registry.get_sample_value(
            "edge_agent_snapshots_unpublished_total", {"reason": "failed"}) in (None, 0.0)
    finally:
        store.close()
