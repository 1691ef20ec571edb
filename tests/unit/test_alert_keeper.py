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
    keeper = AlertKeeper(store, pub, m, clock=lambda: 1000.0)
    assert keeper.add("pump1", make)[0].seq == 1  # type: ignore[union-attr]
    store.refuse = True
    volatile = [keeper.add("pump1", make) for _ in range(3)]
    # the first refused alert jumps to the wall clock in ms, the next ones continue it
    assert [(a.seq, stored) for a, stored in volatile] == [  # type: ignore[union-attr]
        (1_000_000, False), (1_000_001, False), (1_000_002, False)]
    assert [v.after_row for v in pub.volatile.after(0)] == [1, 1, 1]
    store.refuse = False
    alert, stored = keeper.add("pump1", make)
    assert (alert.seq, stored) == (1_000_003, True)  # type: ignore[union-attr]
    assert store.last_alert_seq("pump1") == 1_000_003
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
    keeper = AlertKeeper(store, None, m, clock=lambda: 0.0)  # a clock at the epoch: no jump
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


def test_a_crash_while_the_store_refuses_writes_does_not_reissue_delivered_ids(
    tmp_path: Path,
) -> None:
    """Volatile alerts delivered, then the agent dies before the store takes a write: the
    restarted agent's alerts must not take the delivered ids (a tester saw 68 reused)."""
    m = Metrics(CollectorRegistry())
    store = RefusingStore(tmp_path / "agent.db", metrics=m)
    pub = MqttPublisher(MqttConfig(enabled=True), store, "gw1", m)  # never started
    keeper = AlertKeeper(store, pub, m, clock=lambda: 1_700_000_000.0)
    assert keeper.add("pump1", make)[0].seq == 1  # type: ignore[union-attr]
    store.refuse = True
    delivered = {a.alert_id for a, _ in (keeper.add("pump1", make) for _ in range(5))}  # type: ignore[union-attr]
    pub.stop()
    store.close()  # killed: persist_seq never ran
    with Store(tmp_path / "agent.db") as again:
        after = AlertKeeper(again, None, Metrics(CollectorRegistry()),
                            clock=lambda: 1_700_000_001.0)
        new = [after.add("pump1", make)[0] for _ in range(5)]
        assert [a.seq for a in new] == [2, 3, 4, 5, 6]  # type: ignore[union-attr]
        assert not delivered & {a.alert_id for a in new}  # type: ignore[union-attr]
