"""Store: upload queue, dead letters, disk budget and eviction, WAL bound, integrity, full disk."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import sqlite3
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from agent.errors import StoreError
from agent.metrics import Metrics
from agent.records import Aggregate
from agent.store import maintenance as mt
from agent.store.schema import MIGRATIONS, SCHEMA_VERSION, migrate
from agent.store.sqlite import Store
from cloud_sync.protocol import AggregateBody, AlertBody
from tests.unit.test_store import make_aggregate, make_alert


def metrics() -> Metrics:
    return Metrics(CollectorRegistry())


def dropped(m: Metrics, kind: str) -> float:
    v = m.registry.get_sample_value(
        "edge_agent_dropped_total", {"kind": kind, "reason": "budget"}
    )
    return v or 0.0


def fill(store: Store, n_aggs: int, n_alerts: int, start: int = 0) -> None:
    for i in range(start, start + n_aggs):
        store.add_aggregate(make_aggregate(60.0 * i))
    for i in range(start, start + n_alerts):
        store.add_alert(make_alert(i + 1))


def test_pending_uploads_alerts_first_then_aggregates_oldest_first(tmp_path: Path) -> None:
    with Store(tmp_path / "a.db") as store:
        store.add_aggregate(make_aggregate(120.0, max_score=math.nan))
        store.add_aggregate(make_aggregate(60.0))
        store.add_alert(make_alert(1))
        store.add_alert(make_alert(2))
        rows = store.pending_uploads(10)
        assert [(r.kind, r.record_id) for r in rows] == [
            ("alert", "gw1:pump1:1"), ("alert", "gw1:pump1:2"),
            ("aggregate", "gw1:pump1:120000"), ("aggregate", "gw1:pump1:60000"),
        ]
        assert [r.record_id for r in store.pending_uploads(3)][-1] == "gw1:pump1:120000"
        assert len(store.pending_uploads(1)) == 1
        # bodies are valid wire bodies; NaN max_score -> null; epoch seconds
        AlertBody.model_validate(rows[0].body)
        agg = AggregateBody.model_validate(rows[2].body)
        assert agg.max_score is None and agg.interval_start == 120.0
        assert agg.channels[1].mean is None
        assert store.upload_backlog() == (2, 2)


def test_mark_uploaded_clears_the_queue_once(tmp_path: Path) -> None:
    with Store(tmp_path / "a.db", clock=lambda: 5000.0) as store:
        fill(store, 3, 2)
        rows = store.pending_uploads(10)
        assert store.oldest_pending_upload() == 60.0  # first aggregate's interval end
        assert store.mark_uploaded("alert", [r.row_id for r in rows if r.kind == "alert"], 9.0) == 2
        assert store.mark_uploaded("alert", [rows[0].row_id], 10.0) == 0  # already marked
        assert store.upload_backlog() == (0, 3)
        assert [r.kind for r in store.pending_uploads(10)] == ["aggregate"] * 3
        store.mark_uploaded("aggregate", [r.row_id for r in rows if r.kind == "aggregate"], 9.0)
        assert store.pending_uploads(10) == []
        assert store.upload_backlog() == (0, 0)
        assert store.oldest_pending_upload() is None
        assert store.alerts()[0]["uploaded_at"] == 9.0
        with pytest.raises(ValueError):
            store.mark_uploaded("bogus", [1], 1.0)  # type: ignore[arg-type]


def test_dead_letter_moves_rows_out_but_keeps_the_mqtt_outbox(tmp_path: Path) -> None:
    with Store(tmp_path / "a.db", clock=lambda: 7.0) as store:
        fill(store, 2, 2)
        rows = store.pending_uploads(10)
        alerts = [r for r in rows if r.kind == "alert"]
        aggs = [r for r in rows if r.kind == "aggregate"]
        store.mark_published([alerts[0].row_id], at=1.0)
        assert store.dead_letter("alert", [r.row_id for r in alerts], "bad model ref") == 2
        assert store.dead_letter("aggregate", [aggs[0].row_id], "too old") == 1
        assert store.pending_uploads(10) == [aggs[1]]
        # the unpublished alert still waits for MQTT, marked so it is never resent
        outbox = store.pending_alerts(10)
        assert [r.alert_id for r in outbox] == [alerts[1].record_id]
        assert len(store.alerts()) == 1
        assert len(store.aggregates()) == 1
        dl = store.dead_letters()
        assert [(d["kind"], d["record_id"], d["reason"]) for d in dl] == [
            ("alert", alerts[0].record_id, "bad model ref"),
            ("alert", alerts[1].record_id, "bad model ref"),
            ("aggregate", aggs[0].record_id, "too old"),
        ]
        assert dl[2]["payload"]["channels"][0]["channel"] == "temp"
        assert dl[0]["failed_at"] == 7.0


def test_migration_from_version_1_keeps_rows(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    migrate(conn, MIGRATIONS[:1])
    conn.execute(
        "INSERT INTO aggregates (aggregate_id, device_id, stream, interval_start, interval_s,"
        " count, channels, max_score, windows, alert_count) VALUES"
        " ('gw1:s:0', 'gw1', 's', 0, 60, 1, '[]', NULL, 0, 0)"
    )
    assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 0
    conn.close()
    with Store(path) as store:
        assert [r.record_id for r in store.pending_uploads(5)] == ["gw1:s:0"]
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # converted by VACUUM
    conn.close()


def test_new_file_uses_incremental_auto_vacuum(tmp_path: Path) -> None:
    Store(tmp_path / "n.db").close()
    conn = sqlite3.connect(tmp_path / "n.db")
    assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2
    assert conn.execute("PRAGMA journal_size_limit").fetchone()[0] in (-1, mt.JOURNAL_SIZE_LIMIT)
    conn.close()


# --- disk budget ---------------------------------------------------------------------------


def test_budget_evicts_uploaded_aggregates_first(tmp_path: Path) -> None:
    m = metrics()
    with Store(tmp_path / "b.db", metrics=m, maintenance_interval_s=3600) as store:
        fill(store, 400, 0)
        ids = [r.row_id for r in store.pending_uploads(200)]  # the 200 oldest
        store.mark_uploaded("aggregate", ids, 1.0)
        fill(store, 0, 30)
        store.checkpoint()
        used = store.size_bytes()
        # 0.9: shedding the 200 uploaded rows reaches the low-water mark with pages to spare
        # (every table's first pages are fixed: 0.85 missed it once the snapshots and episodes
        # tables came with schema v6 and v7, 0.8 once sqlite_sequence came with v4)
        store.budget_bytes = int(used * 0.9)
        evicted = store.enforce_budget()
        assert 0 < evicted <= 200
        assert store.size_bytes() <= store.budget_bytes
        # only uploaded aggregates went; every pending record is still there
        assert store.upload_backlog() == (30, 200)
        assert len(store.aggregates()) == 400 - evicted
        assert dropped(m, "aggregate") == evicted and dropped(m, "alert") == 0


def test_budget_eviction_order_and_counts(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    m = metrics()
    path = tmp_path / "b.db"
    with Store(path, metrics=m, maintenance_interval_s=3600) as store:
        fill(store, 0, 400)
        alerts = store.pending_uploads(400)
        done = [r.row_id for r in alerts[200:300]]  # seq 201..300: published and uploaded
        store.mark_published(done, 1.0)
        store.mark_uploaded("alert", done, 1.0)
        store.mark_published([alerts[0].row_id], 1.0)  # published, not uploaded: last class
        store.checkpoint()
        alerts_only = store.size_bytes()
        fill(store, 300, 0)
        store.mark_uploaded("aggregate", [r.row_id for r in store.pending_uploads(500)[400:]], 1.0)
        store.checkpoint()
        size_before = os.path.getsize(path) + mt.wal_bytes(str(path))
        store.budget_bytes = int(alerts_only * 0.8)
        with caplog.at_level(logging.WARNING, logger="agent.store"):
            store.enforce_budget()
            store.enforce_budget()
        assert store.size_bytes() <= store.budget_bytes
        assert store.aggregates() == []  # every aggregate went before any alert
        assert dropped(m, "aggregate") == 300
        left = {a["seq"] for a in store.alerts(limit=1000)}
        k = 400 - len(left) - 100
        assert k > 0, "the budget should have needed some unacknowledged alerts too"
        assert dropped(m, "alert") == 100 + k
        # published+uploaded alerts went first, then the oldest others
        assert left == set(range(1, 401)) - set(range(201, 301)) - set(range(1, k + 1))
        over = [r for r in caplog.records if "over its budget" in r.getMessage()]
        assert len(over) == 1  # once per episode
    assert os.path.getsize(path) < size_before  # pages went back to the file system


def test_budget_is_checked_after_writes(tmp_path: Path) -> None:
    m = metrics()
    with Store(tmp_path / "w.db", metrics=m, budget_bytes=128 * 1024,
               maintenance_interval_s=0.0) as store:
        fill(store, 2000, 0)
        assert store.size_bytes() <= 128 * 1024 + 8 * 4096
        assert dropped(m, "aggregate") > 1000
        assert m.registry.get_sample_value("edge_agent_store_bytes") is not None


def test_wal_stays_bounded_after_many_writes(tmp_path: Path) -> None:
    path = tmp_path / "wal.db"
    with Store(path, maintenance_interval_s=0.0) as store:
        for i in range(6000):
            store.add_aggregate(dataclasses.replace(make_aggregate(60.0 * i)))
            if i % 500 == 0:
                assert mt.wal_bytes(str(path)) <= mt.JOURNAL_SIZE_LIMIT + 2 * 1024 * 1024
        assert mt.wal_bytes(str(path)) <= mt.JOURNAL_SIZE_LIMIT + 2 * 1024 * 1024
        store.enforce_budget()
        assert mt.wal_bytes(str(path)) <= mt.JOURNAL_SIZE_LIMIT


# --- integrity -----------------------------------------------------------------------------


def test_garbage_file_is_quarantined_and_a_fresh_store_started(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "agent.db"
    path.write_bytes(b"this is not a database at all" * 1000)
    (tmp_path / "agent.db-wal").write_bytes(b"junk wal")
    m = metrics()
    with caplog.at_level(logging.ERROR, logger="agent.store"), Store(path, metrics=m) as store:
        assert store.quarantined is not None
        assert store.pending_uploads(10) == []
        store.add_alert(make_alert(1))
    moved = sorted(p.name for p in tmp_path.iterdir() if ".corrupt-" in p.name)
    assert moved and moved[0].startswith("agent.db.corrupt-")
    assert Path(store.quarantined).read_bytes().startswith(b"this is not")
    assert m.registry.get_sample_value("edge_agent_store_quarantined_total") == 1.0
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "fresh store" in errors[0].getMessage()


def test_corrupt_pages_are_quarantined(tmp_path: Path) -> None:
    path = tmp_path / "agent.db"
    with Store(path) as store:
        fill(store, 500, 0)
        store.enforce_budget()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    data = bytearray(path.read_bytes())
    for off in range(3 * 4096, min(len(data), 12 * 4096), 7):  # trash b-tree pages
        data[off] = 0xFF
    path.write_bytes(bytes(data))
    with Store(path) as store:
        assert store.quarantined is not None
        assert store.aggregates() == []


def test_alert_ids_are_not_reissued_after_a_quarantine(tmp_path: Path) -> None:
    """The corrupt file held the sequence counters: the fresh store must not count from 1 again
    (the fleet and MQTT consumers already saw gw1:pump1:1..3), also across later restarts."""
    path = tmp_path / "agent.db"
    with Store(path) as store:
        issued = [store.add_new_alert("pump1", make_alert).seq for _ in range(3)]
    assert issued == [1, 2, 3]
    path.write_bytes(b"this is not a database at all" * 1000)
    now = 1_800_000_000.0
    with Store(path, clock=lambda: now) as store:
        assert store.quarantined is not None
        assert store.last_alert_seq("pump1") == 1_800_000_000_000
        first = store.add_new_alert("pump1", make_alert).seq
        other = store.next_alert_seq("fan2")
    assert first == other == 1_800_000_000_001
    with Store(path, clock=lambda: now + 5) as store:  # a plain restart: the base stays
        assert store.quarantined is None
        assert store.add_new_alert("pump1", make_alert).seq == first + 1
        assert store.add_new_alert("new3", lambda q: make_alert(q, "new3")).seq == first


def test_healthy_file_is_not_quarantined(tmp_path: Path) -> None:
    path = tmp_path / "agent.db"
    Store(path).close()
    with Store(path) as store:
        assert store.quarantined is None


# --- full disk -----------------------------------------------------------------------------


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / f"tiny-{uuid.uuid4().hex[:6]}"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                       check=False, capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a 1 MiB tmpfs (needs root): {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_disk_raises_counted_store_errors_and_alerts_still_get_in(tiny_fs: Path) -> None:
    m = metrics()
    store = Store(tiny_fs / "agent.db", metrics=m, maintenance_interval_s=3600)
    failures = 0
    i = 0
    big = [make_aggregate(0.0)]
    while failures < 3 and i < 100_000:
        agg = big[0]
        channels = tuple(dataclasses.replace(c, channel=f"{c.channel}-{'x' * 100}-{j}")
                         for j, c in enumerate(agg.channels * 20))
        try:
            store.add_aggregate(Aggregate(**{**_fields(agg), "interval_start": 60.0 * i,
                                             "channels": channels}))
        except StoreError as exc:
            assert "disk full" in str(exc)
            failures += 1
        i += 1
    assert failures == 3, "the 1 MiB file system never filled up"
    while failures < 6 and i < 200_000:  # fill the last gaps with small rows
        try:
            store.add_aggregate(make_aggregate(60.0 * i))
        except StoreError:
            failures += 1
        i += 1
    assert m.registry.get_sample_value(
        "edge_agent_store_errors_total", {"op": "add_aggregate"}) == 6.0
    # an alert still gets in: the store evicts aggregates to make room
    assert store.add_alert(make_alert(1)) is True
    assert dropped(m, "aggregate") > 0
    assert [a["alert_id"] for a in store.alerts()] == ["gw1:pump1:1"]
    store.close()


def _fields(agg: Aggregate) -> dict[str, object]:
    return {f.name: getattr(agg, f.name) for f in dataclasses.fields(agg)}
