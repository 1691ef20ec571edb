"""Unit tests of the SQLite store: migrations, idempotency, outbox order, counters, threads."""

from __future__ import annotations

import dataclasses
import json
import math
import sqlite3
import threading
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from agent.errors import StoreError
from agent.metrics import Metrics
from agent.records import Aggregate, Alert, ChannelStats, TopChannel
from agent.store.schema import MIGRATIONS, SCHEMA_VERSION, migrate
from agent.store.sqlite import Store


def make_alert(seq: int, stream: str = "pump1", device: str = "gw1") -> Alert:
    return Alert(
        alert_id=f"{device}:{stream}:{seq}",
        device_id=device,
        stream=stream,
        seq=seq,
        model_name="ae",
        model_version=3,
        score=2.5,
        threshold=1.0,
        window_start=1_700_000_000.0,
        window_end=1_700_000_001.0,
        raised_at=1_700_000_001.5,
        top_channels=(TopChannel("temp", 0.75),),
    )


def make_aggregate(start: float, stream: str = "pump1", max_score: float = 1.5) -> Aggregate:
    return Aggregate(
        device_id="gw1",
        stream=stream,
        interval_start=start,
        interval_s=60.0,
        count=600,
        channels=(
            ChannelStats("temp", 600, 20.0, 25.0, 22.5, 1.25),
            ChannelStats("vib", 0, math.nan, math.nan, math.nan, math.nan),
        ),
        max_score=max_score,
        windows=10,
        alert_count=1,
    )


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "agent.db"


def test_fresh_file_is_migrated_in_wal_mode(db_path: Path) -> None:
    with Store(db_path):
        pass
    conn = sqlite3.connect(db_path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert {"alerts", "aggregates", "counters"} <= tables
    finally:
        conn.close()


def test_reopen_keeps_data_and_does_not_remigrate(db_path: Path) -> None:
    with Store(db_path) as store:
        store.add_alert(make_alert(1))
    with Store(db_path) as store:
        assert [a["alert_id"] for a in store.alerts()] == ["gw1:pump1:1"]


def test_migration_step_is_atomic(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "m.db", isolation_level=None)
    broken = (*MIGRATIONS, ("CREATE TABLE extra (x INTEGER)", "THIS IS NOT SQL"))
    with pytest.raises(sqlite3.Error):
        migrate(conn, broken)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    assert "extra" not in names
    conn.close()


class _FullDiskAtCommit(sqlite3.Connection):
    """COMMIT fails as on a full disk: SQLite rolls the transaction back itself, then errs."""

    def execute(self, sql: str, *args: object) -> sqlite3.Cursor:  # type: ignore[override]
        if sql == "COMMIT":
            super().execute("ROLLBACK")
            raise sqlite3.OperationalError("database or disk is full")
        return super().execute(sql, *args)  # type: ignore[arg-type]


def test_migration_failing_at_commit_raises_the_real_error(tmp_path: Path) -> None:
    """A step whose COMMIT failed (and was rolled back by SQLite) raises that error, not
    "cannot rollback - no transaction is active" from the ROLLBACK after it (a 4 -> 5
    migration on a full disk said that instead of disk full)."""
    conn = sqlite3.connect(tmp_path / "m.db", isolation_level=None)
    migrate(conn, MIGRATIONS[:-1])
    conn.close()
    full = sqlite3.connect(tmp_path / "m.db", isolation_level=None, factory=_FullDiskAtCommit)
    with pytest.raises(sqlite3.OperationalError, match="disk is full"):
        migrate(full)
    assert not full.in_transaction
    full.close()
    conn = sqlite3.connect(tmp_path / "m.db", isolation_level=None)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION - 1
    conn.close()


def test_newer_schema_is_refused(db_path: Path) -> None:
    Store(db_path).close()
    conn = sqlite3.connect(db_path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(StoreError, match="newer"):
        Store(db_path)


def test_add_alert_is_idempotent_and_stores_the_payload(db_path: Path) -> None:
    with Store(db_path, clock=FakeClock(1234.5)) as store:
        assert store.add_alert(make_alert(1)) is True
        assert store.add_alert(make_alert(1)) is False
        rows = store.pending_alerts(10)
        assert len(rows) == 1
        row = rows[0]
        assert row.alert_id == "gw1:pump1:1"
        assert row.stream == "pump1"
        assert row.created_at == 1234.5
        assert json.loads(row.payload) == make_alert(1).to_payload()


def test_add_alert_rejects_non_finite_payload(db_path: Path) -> None:
    alert = make_alert(1)
    bad = dataclasses.replace(alert, score=math.nan)
    with Store(db_path) as store, pytest.raises(ValueError):
        store.add_alert(bad)


def test_outbox_order_paging_and_mark_published(db_path: Path) -> None:
    clock = FakeClock(100.0)
    with Store(db_path, clock=clock) as store:
        for seq in (3, 1, 2):  # insertion order, not seq order, is the outbox order
            clock.t += 1
            store.add_alert(make_alert(seq))
        assert store.outbox_stats() == (3, 101.0)
        first = store.pending_alerts(2)
        assert [r.alert_id for r in first] == ["gw1:pump1:3", "gw1:pump1:1"]
        rest = store.pending_alerts(10, after_id=first[-1].id)
        assert [r.alert_id for r in rest] == ["gw1:pump1:2"]

        assert store.mark_published([first[0].id], at=200.0) == 1
        assert store.mark_published([first[0].id], at=300.0) == 0  # already published
        assert store.mark_published([], at=300.0) == 0
        assert store.outbox_stats() == (2, 102.0)
        assert [r.alert_id for r in store.pending_alerts(10)] == ["gw1:pump1:1", "gw1:pump1:2"]
        published = store.alerts()[0]
        assert published["published_at"] == 200.0
        assert published["uploaded_at"] is None

        store.mark_published([r.id for r in store.pending_alerts(10)], at=201.0)
        assert store.outbox_stats() == (0, None)
        assert len(store.alerts()) == 3  # published rows are kept for the uploader
        assert store.alerts(pending_only=True) == []


def test_prune_published_keeps_rows_not_uploaded(db_path: Path) -> None:
    clock = FakeClock(1000.0)
    with Store(db_path, clock=clock) as store:
        store.add_alert(make_alert(1))
        store.add_alert(make_alert(2))
        store.mark_published([r.id for r in store.pending_alerts(10)], at=1000.0)
        clock.t = 5000.0
        assert store.prune_published(60.0) == 0
        assert store.prune_published(60.0, require_uploaded=False) == 2
        assert store.alerts() == []


def test_next_alert_seq_survives_reopen(db_path: Path) -> None:
    with Store(db_path) as store:
        assert [store.next_alert_seq("a") for _ in range(3)] == [1, 2, 3]
        assert store.next_alert_seq("b") == 1
    with Store(db_path) as store:
        assert store.next_alert_seq("a") == 4
        assert store.next_alert_seq("b") == 2


def test_add_aggregate_is_idempotent_and_queryable(db_path: Path) -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    with Store(db_path, metrics=metrics) as store:
        assert store.add_aggregate(make_aggregate(120.0)) is True
        assert store.add_aggregate(make_aggregate(120.0)) is False
        assert store.add_aggregate(make_aggregate(60.0, max_score=math.nan)) is True
        assert store.add_aggregate(make_aggregate(60.0, stream="fan")) is True

        rows = store.aggregates(stream="pump1")
        assert [r["interval_start"] for r in rows] == [60.0, 120.0]
        assert rows[0]["max_score"] is None
        assert rows[1]["aggregate_id"] == "gw1:pump1:120000"
        assert rows[1]["channels"][0] == {
            "channel": "temp", "count": 600, "min": 20.0, "max": 25.0, "mean": 22.5, "std": 1.25,
        }
        assert rows[1]["channels"][1]["mean"] is None
        assert [r["stream"] for r in store.aggregates(since=100.0)] == ["pump1"]
        assert len(store.aggregates()) == 3
    value = registry.get_sample_value("edge_agent_aggregates_total", {"stream": "pump1"})
    assert value == 2.0


def test_disk_full_is_a_clear_store_error(db_path: Path) -> None:
    registry = CollectorRegistry()
    with Store(db_path, metrics=Metrics(registry)) as store:
        store.add_alert(make_alert(0))
        conn = store._conn
        assert conn is not None
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {pages}")  # simulate a full disk
        with pytest.raises(StoreError, match="disk full") as info:
            for seq in range(1, 5000):
                store.add_alert(make_alert(seq))
        assert info.value.retryable
        assert info.value.context["op"] == "add_alert"
        assert registry.get_sample_value(
            "edge_agent_store_errors_total", {"op": "add_alert"}
        ) == 1.0
        # The store is still usable for reads after the failure.
        assert store.outbox_stats()[0] >= 1


def test_closed_store_raises(db_path: Path) -> None:
    store = Store(db_path)
    store.close()
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.outbox_stats()


def test_unopenable_path_raises_store_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StoreError):
        Store(blocker / "agent.db")


def test_concurrent_writer_and_reader(db_path: Path) -> None:
    """A pipeline thread writes while a publisher thread drains; nothing lost, order kept."""
    total = 400
    store = Store(db_path)
    errors: list[BaseException] = []
    published: list[str] = []
    done = threading.Event()

    def writer() -> None:
        try:
            for _ in range(total):
                seq = store.next_alert_seq("pump1")
                store.add_alert(make_alert(seq))
                if seq % 50 == 0:
                    store.add_aggregate(make_aggregate(float(seq)))
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    def reader() -> None:
        try:
            while True:
                finished = done.is_set()
                rows = store.pending_alerts(25)
                if rows:
                    store.mark_published([r.id for r in rows], at=1.0)
                    published.extend(r.alert_id for r in rows)
                    store.outbox_stats()
                elif finished:
                    return
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    store_depth = store.outbox_stats()
    store.close()
    assert not errors
    assert published == [f"gw1:pump1:{i}" for i in range(1, total + 1)]
    assert store_depth == (0, None)
