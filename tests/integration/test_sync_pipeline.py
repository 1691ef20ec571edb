"""Pipelined upload (several batches in flight) into a REAL fleet with two worker processes on
one SQLite file (``edge-fleet serve --workers 2``): both workers write concurrently (WAL, busy
timeout); every record is stored exactly once, and a full resend is answered ``duplicate``."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from agent.metrics import Metrics
from agent.services.uploader import Uploader
from agent.store.sqlite import Store
from cloud_sync.client import FleetClient
from tests.integration.fleet_peer import FleetProcess
from tests.integration.test_sync_faults import assert_exactly_once
from tests.unit.test_store import make_aggregate, make_alert

pytestmark = pytest.mark.integration


@pytest.fixture
def fleet2(tmp_path: Path) -> Iterator[FleetProcess]:
    proc = FleetProcess(tmp_path / "fleet", workers=2)
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def drain(up: Uploader, store: Store) -> None:
    for _ in range(10_000):
        delay = up.run_once()
        if delay == up.interval_s and store.upload_backlog() == (0, 0):
            return
    raise AssertionError(f"not drained: {store.upload_backlog()}")


def test_four_in_flight_into_two_fleet_workers_exactly_once(
    tmp_path: Path, fleet2: FleetProcess
) -> None:
    store = Store(tmp_path / "agent.db")
    for i in range(6000):
        store.add_aggregate(make_aggregate(60.0 * i, stream=f"s{i % 3}"))
    for seq in range(1, 21):
        store.add_alert(make_alert(seq))
    metrics = Metrics(CollectorRegistry())
    client = FleetClient(fleet2.url, fleet2.token, read_timeout_s=60, gzip_level=1)
    up = Uploader(store, client, "gw1", metrics, batch_records=250, interval_s=0.01,
                  backoff_initial_s=0.05, backoff_max_s=0.5, max_in_flight=4)
    try:
        drain(up, store)
        assert_exactly_once(fleet2, store)
        get = metrics.registry.get_sample_value
        assert get("edge_agent_upload_records_total",
                   {"kind": "aggregate", "status": "accepted"}) == 6000
        # Resend everything (as after a lost acknowledgement): all duplicates, nothing new.
        conn = sqlite3.connect(tmp_path / "agent.db")
        conn.execute("UPDATE aggregates SET uploaded_at = NULL")
        conn.execute("UPDATE alerts SET uploaded_at = NULL")
        conn.commit()
        conn.close()
        drain(up, store)
        assert_exactly_once(fleet2, store)
        assert get("edge_agent_upload_records_total",
                   {"kind": "aggregate", "status": "duplicate"}) == 6000
        assert get("edge_agent_upload_records_total",
                   {"kind": "aggregate", "status": "rejected"}) is None
    finally:
        client.close()
        store.close()


def test_columns_with_damaged_rows_dead_letter_those_rows_only(
    tmp_path: Path, fleet2: FleetProcess
) -> None:
    # schema 2 into the real fleet: damaged stored values cost their row (dead-lettered with the
    # fleet's reason), every other row is stored once and cleared
    store = Store(tmp_path / "agent.db")
    for i in range(1200):
        store.add_aggregate(make_aggregate(60.0 * i, stream=f"s{i % 3}"))
    store.add_alert(make_alert(1))
    conn = sqlite3.connect(tmp_path / "agent.db")
    conn.execute("UPDATE aggregates SET channels = '[{oops' WHERE id = 10")
    conn.execute("UPDATE aggregates SET channels = replace(channels, '\"count\"', '\"n\"') "
                 "WHERE id = 700")
    conn.execute("UPDATE aggregates SET count = -3 WHERE id = 1100")
    conn.commit()
    conn.close()
    metrics = Metrics(CollectorRegistry())
    client = FleetClient(fleet2.url, fleet2.token, read_timeout_s=60)
    up = Uploader(store, client, "gw1", metrics, batch_records=500, interval_s=0.01,
                  backoff_initial_s=0.05, backoff_max_s=0.5, max_in_flight=2)
    try:
        drain(up, store)
        dead = {d["record_id"]: d["reason"] for d in store.dead_letters()}
        assert len(dead) == 3
        assert all("channels" in r for r in list(dead.values())[:2]), dead
        assert "count" in list(dead.values())[2], dead
        n, distinct = fleet2.counts("aggregates")
        assert n == distinct == 1197
        assert fleet2.counts("alerts") == (1, 1)
    finally:
        client.close()
        store.close()
