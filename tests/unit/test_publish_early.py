"""Publish while committing: reserved alert numbers, the store writer's group commits and the
publisher's book of alerts published before their commit."""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from pathlib import Path

from prometheus_client import CollectorRegistry

from agent.errors import StoreError
from agent.metrics import Metrics
from agent.publish.early import EarlyBook
from agent.publish.keeper import AlertKeeper
from agent.publish.mqtt import MqttConfig, MqttPublisher
from agent.publish.volatile import VolatileQueue, merge
from agent.store.episodes import EpisodeMark
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


def test_an_alert_stored_directly_goes_after_the_commits_still_queued(tmp_path: Path) -> None:
    """The id ledger cannot reserve a number (its rewrite fails on a full disk while SQLite
    still has free pages), so a ``cleared`` takes the direct path (stored first) while its
    ``raised`` still waits in the store writer: the outbox must hold them in raising order
    and the episode must end closed, else a restarted agent publishes the ``cleared`` before
    its ``raised`` and resumes an episode that was cleared."""
    m = Metrics(CollectorRegistry())
    store = Store(tmp_path / "agent.db", metrics=m)
    pub = MqttPublisher(MqttConfig(enabled=True), store, "gw1", m)  # never started
    gate, entered = threading.Event(), threading.Event()
    commit = store.add_numbered_alerts

    def slow(items):  # type: ignore[no-untyped-def]
        entered.set()
        gate.wait(10.0)
        return commit(items)

    store.add_numbered_alerts = slow  # type: ignore[method-assign]
    writer = AlertWriter(store, pub.committed)
    flush = writer.flush

    def flush_opens_the_gate(timeout_s: float) -> bool:
        gate.set()
        return flush(timeout_s)

    writer.flush = flush_opens_the_gate  # type: ignore[method-assign]
    writer.start()
    keeper = AlertKeeper(store, pub, m, writer=writer)
    raised, _ = keeper.add("pump1", make_alert, EpisodeMark(open=True, peak_score=2.5))
    assert raised is not None and entered.wait(5.0)  # its commit is held

    def no_room(stream, floor, block=1000):  # type: ignore[no-untyped-def]
        raise OSError(28, "No space left on device")

    store.ids.take = no_room  # type: ignore[method-assign]
    cleared, stored = keeper.add(
        "pump1", lambda seq: replace(make_alert(seq), event="cleared",
                                     episode_id=raised.alert_id, reason="recovered"),
        EpisodeMark(close=True))
    gate.set()
    assert cleared is not None and stored and writer.flush(5.0)
    assert [a["alert_id"] for a in store.alerts()] == [raised.alert_id, cleared.alert_id]
    assert store.open_episodes() == {}
    writer.stop()
    pub.stop()
    store.close()


def test_no_number_is_handed_out_from_a_block_whose_rewrite_is_still_running(
        tmp_path: Path) -> None:
    """The store writer tops the block up while the pipeline takes numbers: a number above the
    reserved mark in the file must wait for (or make) a rewrite of its own, else a rewrite that
    then fails (disk full) leaves a published id that a restarted agent issues again."""
    path = tmp_path / "agent.db.ids"
    ledger = IdLedger(str(path))
    assert [ledger.take("s", lambda: 0, block=10) for _ in range(6)] == [1, 2, 3, 4, 5, 6]
    gate, writing = threading.Event(), threading.Event()
    write = ledger._write
    calls = [0]

    def first_write_hangs_then_fails() -> None:
        calls[0] += 1
        if calls[0] == 1:  # the top-up's rewrite: slow, then the disk is full
            writing.set()
            gate.wait(2.0)
            raise OSError(28, "No space left on device")
        write()

    ledger._write = first_write_hangs_then_fails  # type: ignore[method-assign]
    top_up = threading.Thread(target=ledger.top_up, args=("s",), kwargs={"block": 10})
    top_up.start()
    assert writing.wait(5.0)
    taken = [ledger.take("s", lambda: 0, block=10) for _ in range(5)]  # 7..11, 11 past the file
    on_file = json.loads(path.read_text())["s/reserved"]
    gate.set()
    top_up.join(5.0)
    assert taken == [7, 8, 9, 10, 11]
    assert on_file >= 11, "number 11 was handed out while the file reserved only up to 10"
    assert IdLedger(str(path)).take("s", lambda: 0) > 11  # a restart issues none of them again


def test_an_alert_not_queued_for_mqtt_still_goes_out_before_the_next_one(
        tmp_path: Path) -> None:
    """The in-memory queue is full (broker away), so alert 2 is not queued: it drains from the
    outbox once committed. A PUBACK frees a place and alert 3 is queued while alert 2's commit
    still runs: alert 3 must still go out after alert 2 (a ``cleared`` after its ``raised``)."""
    m = Metrics(CollectorRegistry())
    store = Store(tmp_path / "agent.db", metrics=m)
    pub = MqttPublisher(MqttConfig(enabled=True), store, "gw1", m)  # never started
    pub.volatile = VolatileQueue(limit=1)
    writer = AlertWriter(store, pub.committed)
    writer.start()
    keeper = AlertKeeper(store, pub, m, writer=writer)
    first, _ = keeper.add("pump1", make_alert)
    assert first is not None and writer.flush(5.0)
    gate, entered = threading.Event(), threading.Event()
    commit = store.add_numbered_alerts

    def slow(items):  # type: ignore[no-untyped-def]
        entered.set()
        gate.wait(10.0)
        return commit(items)

    store.add_numbered_alerts = slow  # type: ignore[method-assign]
    flush = writer.flush

    def flush_opens_the_gate(timeout_s: float) -> bool:
        gate.set()
        return flush(timeout_s)

    writer.flush = flush_opens_the_gate  # type: ignore[method-assign]
    second, _ = keeper.add("pump1", make_alert)  # the queue is full: not queued
    assert second is not None and entered.wait(5.0)
    assert [v.alert_id for v in pub.volatile.after(0)] == [first.alert_id]
    assert pub.volatile.ack(pub.volatile.after(0)[0].n)  # the broker acknowledged alert 1
    third, _ = keeper.add("pump1", make_alert)
    gate.set()
    assert third is not None and writer.flush(5.0)
    rows = [r for r in store.pending_alerts(10) if not pub.early.shadows(r.alert_id)]
    order = [item.alert_id for item in merge(rows, pub.volatile.after(0), True, 10)]
    assert order == [second.alert_id, third.alert_id]
    writer.stop()
    pub.stop()
    store.close()
