"""AlertKeeper: alerts the store refuses keep unique ids and go to MQTT from memory."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry

from agent.errors import StoreError
from agent.metrics import Metrics
from agent.publish.keeper import AlertKeeper
from agent.publish.mqtt import MqttConfig, MqttPublisher
from agent.records import Alert
from agent.store.sqlite import Store
from tests.unit.test_store import make_alert


class RefusingStore(Store):
    """A real store whose alert writes fail while ``refuse`` is set."""

    refuse = False

    def add_new_alert(self, stream: str, make: Callable[[int], Alert], seq_floor: int = 0) -> Alert:
        if self.refuse:
            raise StoreError("disk full: test", op="add_alert")
        return super().add_new_alert(stream, make, seq_floor)


def make(seq: int) -> Alert:
    return make_alert(seq)


def test_refused_alerts_continue_the_sequence_and_the_next_stored_one_persists_it(
    tmp_path: Path,
) -> None:
    m = Metrics(CollectorRegistry())
    store = RefusingStore(tmp_path / "agent.db", metrics=m)
    pub = MqttPublisher(MqttConfig(enabled=True), store, "gw1", m)  # never started
    keeper = AlertKeeper(store, pub, m)
    assert keeper.add("pump1", make)[0].seq == 1  # type: ignore[union-attr]
    store.refuse = True
    volatile = [keeper.add("pump1", make) for _ in range(3)]
    assert [(a.seq, stored) for a, stored in volatile] == [(2, False), (3, False), (4, False)]  # type: ignore[union-attr]
    assert [v.after_row for v in pub.volatile.after(0)] == [1, 1, 1]
    store.refuse = False
    alert, stored = keeper.add("pump1", make)
    assert (alert.seq, stored) == (5, True)  # type: ignore[union-attr]
    assert store.last_alert_seq("pump1") == 5
    assert keeper.not_stored == 3 and keeper.lost_total == 0
    assert not m.registry.get_sample_value(
        "edge_agent_dropped_total", {"kind": "alert", "reason": "store_error"})
    pub.stop()
    store.close()


def test_refused_alert_without_mqtt_is_counted_lost_and_the_floor_survives_a_restart(
    tmp_path: Path,
) -> None:
    m = Metrics(CollectorRegistry())
    store = RefusingStore(tmp_path / "agent.db", metrics=m)
    keeper = AlertKeeper(store, None, m)
    store.refuse = True
    alert, stored = keeper.add("pump1", make)
    assert (alert.seq, stored) == (1, False)  # type: ignore[union-attr]
    assert keeper.lost_total == 1
    assert m.registry.get_sample_value(
        "edge_agent_dropped_total", {"kind": "alert", "reason": "store_error"}) == 1
    keeper.persist_seq()  # the store takes writes again (an aggregate went in)
    store.close()
    with Store(tmp_path / "agent.db") as again:
        assert again.add_new_alert("pump1", make).seq == 2
