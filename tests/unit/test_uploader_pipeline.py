"""Uploader with several batches in flight (``max_in_flight``) against a fake fleet that stores
records by id: overlap, failures of one of two in-flight batches, live alerts first, Retry-After,
and row ids that must never be reused while a batch is in flight (store schema v4)."""

from __future__ import annotations

import random
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from agent.metrics import Metrics
from agent.services.uploader import FleetConfig, Uploader
from agent.store.schema import MIGRATIONS, migrate
from agent.store.sqlite import Store
from cloud_sync.errors import FleetUnavailable
from cloud_sync.protocol import IngestBatch, IngestResult, RecordResult
from tests.unit.test_store import make_aggregate, make_alert


class FakeFleet:
    """Stores records by id (``accepted`` once, ``duplicate`` after), like the real ingest.

    ``plan[n]`` (n = the n-th send, from 0) is either an exception to raise INSTEAD of storing
    (the fleet failed before committing), or ``("after", exc)`` to store the batch and then
    raise (the answer was lost). ``gate`` makes every send wait until that many sends are in
    progress at once (proves the overlap).
    """

    def __init__(self, gate: int = 0) -> None:
        self.lock = threading.Lock()
        self.bodies: list[IngestBatch] = []
        self.stored: dict[str, int] = {}  # record id -> the send that stored it
        self.sends: list[list[str]] = []
        self.plan: dict[int, object] = {}
        self.reject: set[str] = set()
        self.on_send: Callable[[int], None] | None = None
        self._barrier = threading.Barrier(gate) if gate > 1 else None
        self.max_concurrent = 0
        self._concurrent = 0

    def compress(self, document: bytes) -> bytes:
        batch = IngestBatch.model_validate_json(document)
        with self.lock:
            self.bodies.append(batch)
            return b"%d" % (len(self.bodies) - 1)

    def send(self, body: bytes, n_records: int) -> IngestResult:
        with self.lock:
            n = len(self.sends)
            batch = self.bodies[int(body)]
            self.sends.append([r.id for r in batch.all_records()])
            self._concurrent += 1
            self.max_concurrent = max(self.max_concurrent, self._concurrent)
            action = self.plan.get(n)
        try:
            if self._barrier is not None:
                self._barrier.wait(timeout=5)
                self._barrier = None  # only the first sends meet
            if self.on_send is not None:
                self.on_send(n)
            if isinstance(action, Exception):
                raise action
            results = []
            with self.lock:
                for i, r in enumerate(batch.all_records()):
                    if r.id in self.reject:
                        results.append(RecordResult(index=i, status="rejected", reason="bad"))
                        continue
                    seen = r.id in self.stored
                    if not seen:
                        self.stored[r.id] = n  # stored by the n-th send; once, like the DB
                    results.append(RecordResult(
                        index=i, status="duplicate" if seen else "accepted"))
            if isinstance(action, tuple):
                raise action[1]
            return IngestResult(results=results)
        finally:
            with self.lock:
                self._concurrent -= 1


def uploader(store: Store, fleet: FakeFleet, **kw: object) -> Uploader:
    return Uploader(store, fleet, "gw1", Metrics(CollectorRegistry()), rng=random.Random(1),
                    clock=lambda: 10_000.0, interval_s=5.0, backoff_initial_s=0.01,
                    backoff_max_s=0.02, **kw)  # type: ignore[arg-type]


def drain(up: Uploader, store: Store, steps: int = 200) -> list[float]:
    delays = []
    for _ in range(steps):
        delays.append(up.run_once())
        if delays[-1] == up.interval_s and store.upload_backlog() == (0, 0):
            return delays
    raise AssertionError(f"not drained in {steps} steps: {store.upload_backlog()}")


def all_ids(store: Store) -> set[str]:
    return ({a["aggregate_id"] for a in store.aggregates()}
            | {a["alert_id"] for a in store.alerts(limit=10_000)})


def test_config_default_is_two_in_flight_and_bounded() -> None:
    assert FleetConfig().max_in_flight == 2 and FleetConfig().gzip_level == 6
    with pytest.raises(ValueError):
        FleetConfig(max_in_flight=0)
    with pytest.raises(ValueError):
        FleetConfig(gzip_level=0)
    with pytest.raises(ValueError, match="max_in_flight"):
        Uploader(Store(":memory:"), FakeFleet(), "gw1", Metrics(CollectorRegistry()),
                 max_in_flight=9)


def test_two_batches_are_in_flight_at_once_and_each_record_is_stored_once(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "a.db")
    for i in range(40):
        store.add_aggregate(make_aggregate(60.0 * i))
    fleet = FakeFleet(gate=2)  # the first two sends wait for each other: both in flight
    up = uploader(store, fleet, batch_records=10, max_in_flight=2)
    drain(up, store)
    assert fleet.max_concurrent == 2
    assert set(fleet.stored) == all_ids(store)
    sent = [i for batch in fleet.sends for i in batch]
    assert len(sent) == len(set(sent)) == 40  # disjoint batches, in queue order
    assert sent == sorted(sent, key=lambda i: int(i.rsplit(":", 1)[1]))
    store.close()


@pytest.mark.parametrize("failing", [0, 1])
@pytest.mark.parametrize("stored_first", [False, True])
def test_one_of_two_in_flight_fails_nothing_lost_nothing_duplicated(
    tmp_path: Path, failing: int, stored_first: bool
) -> None:
    store = Store(tmp_path / "a.db")
    for i in range(30):
        store.add_aggregate(make_aggregate(60.0 * i))
    fleet = FakeFleet(gate=2)
    exc = FleetUnavailable("HTTP 503", retry_after_s=None, status=503)
    fleet.plan[failing] = ("after", exc) if stored_first else exc
    up = uploader(store, fleet, batch_records=10, max_in_flight=2)
    delays = drain(up, store)
    assert any(0 < d < up.interval_s for d in delays)  # one backoff
    # every record is in the fleet (a resend of stored rows is answered duplicate; the fake
    # stores an id once, as the unique index does) and acknowledged here
    assert set(fleet.stored) == all_ids(store)
    assert store.upload_backlog() == (0, 0) and store.dead_letters() == []
    sent = [i for batch in fleet.sends for i in batch]
    resent = {i for i in sent if sent.count(i) > 1}
    assert resent == set(fleet.sends[failing])  # only the failed batch went twice
    store.close()


def test_first_in_flight_fails_with_retry_after_the_second_is_still_applied(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "a.db")
    for i in range(20):
        store.add_aggregate(make_aggregate(60.0 * i))
    fleet = FakeFleet(gate=2)
    fleet.plan[0] = FleetUnavailable("429", retry_after_s=30.0, status=429)
    up = uploader(store, fleet, batch_records=10, max_in_flight=2)
    assert up.run_once() == 30.0  # Retry-After wins over the (tiny) backoff
    assert len(fleet.sends) == 2
    # the second batch was answered 200 and applied; the first stays pending
    assert store.upload_backlog() == (0, 10)
    assert [r.record_id for r in store.pending_uploads(20)] == fleet.sends[0]
    drain(up, store)
    assert len(fleet.stored) == 20
    store.close()


def test_rejected_rows_in_a_pipelined_drain_go_to_dead_letter(tmp_path: Path) -> None:
    store = Store(tmp_path / "a.db")
    for i in range(25):
        store.add_aggregate(make_aggregate(60.0 * i))
    fleet = FakeFleet()
    fleet.reject = {"gw1:pump1:60000", "gw1:pump1:1200000"}  # rows 1 and 20
    up = uploader(store, fleet, batch_records=10, max_in_flight=3)
    drain(up, store)
    assert sorted(d["record_id"] for d in store.dead_letters()) == sorted(fleet.reject)
    assert len(fleet.stored) == 23
    store.close()


def test_live_alert_goes_before_the_rest_of_the_backlog(tmp_path: Path) -> None:
    store = Store(tmp_path / "a.db")
    for i in range(50):
        store.add_aggregate(make_aggregate(60.0 * i))
    fleet = FakeFleet()

    def alert_arrives(n: int) -> None:
        if n == 0:
            store.add_alert(make_alert(1))

    fleet.on_send = alert_arrives
    up = uploader(store, fleet, batch_records=10, max_in_flight=2)
    drain(up, store)
    where = next(n for n, batch in enumerate(fleet.sends) if "gw1:pump1:1" in batch)
    # in flight when it arrived: batches 0 and 1; prepared meanwhile: at most batch 2
    assert where <= 3 and fleet.sends[where][0] == "gw1:pump1:1"
    assert len(fleet.stored) == 51
    store.close()


def test_row_evicted_in_flight_does_not_clear_a_new_row_with_its_id(tmp_path: Path) -> None:
    """The newest row is evicted while its batch is in flight and a new row is stored: the
    acknowledgement must not clear the new row (it was never sent)."""
    store = Store(tmp_path / "a.db")
    for i in range(5):
        store.add_aggregate(make_aggregate(60.0 * i))
    fleet = FakeFleet()

    def evict_newest_and_store_one(n: int) -> None:
        if n == 0:
            conn = sqlite3.connect(tmp_path / "a.db", timeout=5)
            conn.execute("DELETE FROM aggregates WHERE id = (SELECT MAX(id) FROM aggregates)")
            conn.commit()
            conn.close()
            store.add_aggregate(make_aggregate(60.0 * 99))

    fleet.on_send = evict_newest_and_store_one
    up = uploader(store, fleet, batch_records=5, max_in_flight=1)
    up.run_once()
    # the new row is still pending (with reused ids the ack would have cleared it: lost)
    assert [r.record_id for r in store.pending_uploads(10)] == ["gw1:pump1:5940000"]
    drain(up, store)
    assert "gw1:pump1:5940000" in fleet.stored
    store.close()


def test_schema_v4_never_reuses_ids_and_keeps_rows_of_a_v3_store(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    migrate(conn, MIGRATIONS[:3])
    for i, start in enumerate((0, 60, 120)):
        conn.execute(
            "INSERT INTO aggregates (aggregate_id, device_id, stream, interval_start,"
            " interval_s, count, channels, max_score, windows, alert_count, uploaded_at)"
            f" VALUES ('gw1:s:{start * 1000}', 'gw1', 's', {start}, 60, 1, '[]', NULL, 0, 0,"
            f" {'1.0' if i == 0 else 'NULL'})"
        )
    conn.execute("INSERT INTO alerts (alert_id, stream, seq, payload, created_at)"
                 " VALUES ('gw1:s:1', 's', 1, '{}', 1.0)")
    conn.close()
    with Store(path) as store:
        assert store.upload_backlog() == (1, 2)
        rows = store.pending_uploads(10)
        assert [(r.kind, r.row_id, r.record_id) for r in rows] == [
            ("alert", 1, "gw1:s:1"), ("aggregate", 2, "gw1:s:60000"),
            ("aggregate", 3, "gw1:s:120000")]
        store.dead_letter("aggregate", [3], "bad")  # deletes the newest row
        store.add_aggregate(make_aggregate(600.0))
        assert [r.row_id for r in store.pending_uploads(10)] == [1, 2, 4]  # 3 not reused
    conn = sqlite3.connect(path)
    sql = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'aggregates'").fetchone()[0]
    assert "AUTOINCREMENT" in sql
    indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    assert {"alerts_pending", "alerts_stream", "alerts_unuploaded", "aggregates_stream_start",
            "aggregates_unuploaded"} <= indexes
    conn.close()
