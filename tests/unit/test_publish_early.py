"""Publish while committing: reserved alert numbers, the store writer's group commits and the
publisher's book of alerts published before their commit."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from prometheus_client import CollectorRegistry

from agent.errors import StoreError
from agent.metrics import Metrics
from agent.publish.early import EarlyBook
from agent.publish.keeper import AlertKeeper
from agent.publish.mqtt import MqttConfig, MqttPublisher
from agent.store.ids import IdLedger
from agent.store.sqlite import Store
from agent.store.writer import AlertWriter, Committed
from tests.unit.test_store import make_alert


def test_numbers_are_reserved_durably_before_use_and_never_reissued(tmp_path: Path) -> None:
    path = str(tmp_path / "agent.db.ids")
    ledger = IdLedger(path)
    assert [ledger.take("s", lambda: 4, block=10) for _ in range(3)] == [5, 6, 7]
    assert json.loads(Path(path).read_text()) == {"s/reserved": 14}
    assert ledger.mark("s") == 14 and ledger.marks == {}  # reserved, not issued
    again = IdLedger(path)  # a restart: the next number lies above the whole block
    assert again.mark("s") == 14
    assert again.take("s", lambda: 0, block=10) == 15


def test_a_ledger_that_cannot_be_written_takes_no_number(tmp_path: Path) -> None:
    ledger = IdLedger(str(tmp_path / "missing" / "agent.db.ids"))  # its folder does not exist
    try:
        ledger.take("s", lambda: 0)
    except OSError:
        pass
    else:
        raise AssertionError("a number was handed out without a durable reservation")
    assert ledger.mark("s") == 0


def test_ack_before_commit_is_kept_until_the_commit_reports() -> None:
    book = EarlyBook()
    book.begin("a")
    book.on_ack("a", 10.0)  # the PUBACK came first
    assert book.take_ready() == [] and book.shadows("a")
    book.on_commit("a", 7)
    assert book.take_ready() == [("a", 7, 10.0)]
    book.saved(["a"])
    assert not book.shadows("a") and len(book) == 0
    book.begin("b")
    book.on_commit("b", 8)  # committed first: shadowed until acknowledged
    assert book.committed("b") and book.take_ready() == []
    book.on_ack("b", 11.0)
    assert book.take_ready() == [("b", 8, 11.0)]
    book.begin("c")
    book.on_commit("c", -1)  # refused by the store
    book.on_ack("c", 12.0)
    assert book.delivered_unstored == 1 and not book.shadows("c")


def test_writer_groups_alerts_queued_during_a_commit(tmp_path: Path) -> None:
    store = Store(tmp_path / "agent.db")
    results: list[Committed] = []
    gate, entered = threading.Event(), threading.Event()
    commit = store.add_numbered_alerts

    def slow(items):  # type: ignore[no-untyped-def]
        entered.set()
        gate.wait(5.0)
        return commit(items)

    store.add_numbered_alerts = slow  # type: ignore[method-assign]
    writer = AlertWriter(store, results.append)
    writer.start()
    for seq in range(1, 6):
        alert = make_alert(seq)
        writer.put(alert, json.dumps(alert.to_payload()), None)
        assert entered.wait(5.0)  # the first commit runs while the others queue
    gate.set()
    assert writer.flush(5.0)
    assert writer.stop() == 0
    assert writer.commits == 2 and writer.stored == 5  # the first alone, then the other four
    assert [r for group in results for _, r in group] == [1, 2, 3, 4, 5]
    assert store.last_alert_seq(make_alert(1).stream) == 5
    store.close()


def test_keeper_publishes_and_commits_and_a_refused_commit_stays_deliverable(
    tmp_path: Path,
) -> None:
    m = Metrics(CollectorRegistry())
    store = Store(tmp_path / "agent.db", metrics=m)
    pub = MqttPublisher(MqttConfig(enabled=True), store, "gw1", m)  # never started
    writer = AlertWriter(store, pub.committed)
    writer.start()
    keeper = AlertKeeper(store, pub, m, writer=writer)
    alert, stored = keeper.add("pump1", make_alert)
    assert alert is not None and stored and alert.seq == 1
    assert [v.alert_id for v in pub.volatile.after(0)] == [alert.alert_id]
    assert writer.flush(5.0)
    assert pub.early.committed(alert.alert_id)
    assert [a["alert_id"] for a in store.alerts(pending_only=True)] == [alert.alert_id]

    def refuse(items):  # type: ignore[no-untyped-def]
        raise StoreError("disk full: test", op="add_alert")

    store.add_numbered_alerts = refuse  # type: ignore[method-assign]
    second, _ = keeper.add("pump1", make_alert)
    assert second is not None and second.seq == 2
    assert writer.flush(5.0)
    assert keeper.not_stored == 1 and not pub.early.committed(second.alert_id)
    assert len(pub.volatile) == 2  # still delivered from memory
    writer.stop()
    pub.stop()
    store.close()
