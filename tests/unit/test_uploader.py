"""Uploader with a fake client and a real (tmp) store: verdicts, backoff, auth, bisect, bucket."""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from agent.errors import ConfigError
from agent.metrics import Metrics
from agent.services.uploader import FleetConfig, TokenBucket, Uploader, read_token
from agent.store.sqlite import Store
from cloud_sync.errors import (
    FleetAuthError,
    FleetDeadlineExceeded,
    FleetProtocolError,
    FleetRejected,
    FleetUnavailable,
)
from cloud_sync.protocol import IngestBatch, IngestResult, RecordResult
from tests.unit.test_store import make_aggregate, make_alert


class FakeClient:
    def __init__(self) -> None:
        self.batches: list[IngestBatch] = []
        self.prepared: list[IngestBatch] = []
        self.lock = threading.Lock()
        self.fail: list[Exception] = []
        self.statuses: dict[str, str] = {}

    def compress(self, document: bytes) -> bytes:
        # Every batch the uploader builds (fast JSON splicing) must be a valid IngestBatch.
        # Called from the prefetch thread too: the body names its batch.
        batch = IngestBatch.model_validate_json(document)
        with self.lock:
            self.prepared.append(batch)
            return b"%099d" % (len(self.prepared) - 1)

    def send(self, body: bytes, n_records: int) -> IngestResult:
        with self.lock:  # sender threads: up to max_in_flight at once
            batch = self.prepared[int(body)]
            self.batches.append(batch)  # what was sent, in order
            if self.fail:
                raise self.fail.pop(0)
        return IngestResult(results=[
            RecordResult(index=i, status=self.statuses.get(r.id, "accepted"),  # type: ignore[arg-type]
                         reason="nope" if self.statuses.get(r.id) == "rejected" else None)
            for i, r in enumerate(batch.all_records())
        ])


def setup(tmp_path: Path, **kw: object) -> tuple[Store, FakeClient, Uploader, Metrics]:
    m = Metrics(CollectorRegistry())
    store = Store(tmp_path / "a.db", clock=lambda: 10_000.0)
    client = FakeClient()
    up = Uploader(store, client, "gw1", m, rng=random.Random(1), clock=lambda: 10_000.0,
                  **kw)  # type: ignore[arg-type]
    return store, client, up, m


def test_uploads_alerts_first_marks_and_dead_letters(tmp_path: Path) -> None:
    store, client, up, m = setup(tmp_path, batch_records=3)
    for i in range(4):
        store.add_aggregate(make_aggregate(60.0 * i))
    store.add_alert(make_alert(1))
    client.statuses = {"gw1:pump1:60000": "rejected", "gw1:pump1:1": "duplicate"}
    assert up.run_once() == 0.0  # a full batch: go on
    first = client.batches[0]
    assert [r.kind for r in first.all_records()] == ["alert", "aggregate", "aggregate"]
    assert first.backlog.aggregates == 2 and first.backlog.alerts == 0
    assert up.run_once() == up.interval_s  # partial batch: idle
    assert store.upload_backlog() == (0, 0)
    assert [d["record_id"] for d in store.dead_letters()] == ["gw1:pump1:60000"]
    get = m.registry.get_sample_value
    assert get("edge_agent_upload_records_total", {"kind": "aggregate", "status": "rejected"}) == 1
    assert get("edge_agent_upload_records_total", {"kind": "alert", "status": "duplicate"}) == 1
    assert up.run_once() == up.interval_s and len(client.batches) == 2  # nothing to send
    assert get("edge_agent_sync_lag_seconds") == 0.0


def test_unavailable_backs_off_with_full_jitter_and_retry_after(tmp_path: Path) -> None:
    store, client, up, m = setup(tmp_path, backoff_initial_s=1.0, backoff_max_s=8.0)
    store.add_aggregate(make_aggregate(0.0))
    client.fail = [FleetUnavailable("down")] * 6 + [FleetUnavailable("429", retry_after_s=30.0)]
    delays = [up.run_once() for _ in range(7)]
    assert all(0 < d <= min(8.0, 2.0**i) for i, d in enumerate(delays[:6]))
    assert delays[6] == 30.0
    assert store.upload_backlog() == (0, 1)  # nothing cleared
    client.fail = [FleetProtocolError("garbled")]
    assert up.run_once() > 0 and store.upload_backlog() == (0, 1)
    assert up.run_once() == up.interval_s and store.upload_backlog() == (0, 0)
    assert m.registry.get_sample_value(
        "edge_agent_upload_failures_total", {"reason": "unavailable"}) == 7


def test_auth_error_retries_slowly_and_logs_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store, client, up, _m = setup(tmp_path, backoff_max_s=120.0)
    store.add_aggregate(make_aggregate(0.0))
    client.fail = [FleetAuthError(401, "unknown token")] * 3
    assert [up.run_once() for _ in range(3)] == [120.0] * 3
    assert sum("re-enroll" in r.getMessage() for r in caplog.records) == 1
    assert store.upload_backlog() == (0, 1)


def test_a_new_token_on_disk_is_used_after_a_401_without_a_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A tester re-enrolled a device and wrote the new token: the agent kept sending the old
    one (read once at start) for as long as it ran."""
    tokens = ["old", "old", "new"]
    reads: list[str] = []

    def refresh() -> bool:
        reads.append(tokens.pop(0))
        return reads[-1] != "old"

    store, client, up, _m = setup(tmp_path, backoff_max_s=120.0, backoff_initial_s=1.0,
                                  refresh_token=refresh)
    store.add_aggregate(make_aggregate(0.0))
    client.fail = [FleetAuthError(401, "unknown token")] * 3
    assert [up.run_once() for _ in range(2)] == [120.0, 120.0]  # the file still holds "old"
    assert up.run_once() == 1.0  # re-read: a new token, tried at once
    assert sum("new token was found" in r.getMessage() for r in caplog.records) == 1
    assert up.run_once() == 0.0 or store.upload_backlog() == (0, 0)
    assert store.upload_backlog() == (0, 0)


def test_an_unreadable_token_file_keeps_the_old_token(tmp_path: Path) -> None:
    def refresh() -> bool:
        raise ConfigError("fleet.token_file: empty")

    store, client, up, _m = setup(tmp_path, backoff_max_s=120.0, refresh_token=refresh)
    store.add_aggregate(make_aggregate(0.0))
    client.fail = [FleetAuthError(401, "unknown token")]
    assert up.run_once() == 120.0
    assert store.upload_backlog() == (0, 1)


def test_batch_rejected_with_422_is_bisected_to_the_bad_record(tmp_path: Path) -> None:
    # one batch at a time: the sequence of batch sizes is exact
    store, client, up, _m = setup(tmp_path, batch_records=4, max_in_flight=1)
    for i in range(4):
        store.add_aggregate(make_aggregate(60.0 * i))
    client.fail = [FleetRejected(422, "bad"), FleetRejected(422, "bad"),
                   FleetRejected(422, "bad")]
    for _ in range(3):
        assert up.run_once() == 0.0
    # 4 -> 2 -> 1 records; the single record refused is dead-lettered
    assert [len(b.all_records()) for b in client.batches] == [4, 2, 1]
    assert [d["reason"] for d in store.dead_letters()] == ["HTTP 422: bad"]
    while store.upload_backlog() != (0, 0):
        up.run_once()
    assert len(store.aggregates()) == 3


def test_other_4xx_keeps_rows(tmp_path: Path) -> None:
    store, client, up, _m = setup(tmp_path)
    store.add_aggregate(make_aggregate(0.0))
    client.fail = [FleetRejected(404, "no such endpoint")]
    assert up.run_once() > 0
    assert store.upload_backlog() == (0, 1) and store.dead_letters() == []


def test_token_bucket_delays_sends() -> None:
    t = [0.0]
    b = TokenBucket(1000.0, monotonic=lambda: t[0])
    assert b.reserve(1000) == 0.0
    assert b.reserve(500) == pytest.approx(0.5)
    t[0] = 10.0
    assert b.reserve(3000) == pytest.approx(2.0)  # a big body goes into debt


def test_thread_start_notify_stop(tmp_path: Path) -> None:
    store, _client, up, _m = setup(tmp_path, interval_s=60.0)
    up.start()
    store.add_alert(make_alert(1))
    up.notify()
    import time  # noqa: PLC0415

    deadline = time.monotonic() + 5
    while store.upload_backlog() != (0, 0) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert store.upload_backlog() == (0, 0)
    store.add_aggregate(make_aggregate(0.0))  # arrives during the idle wait
    assert up.stop(5.0)
    assert store.upload_backlog() == (0, 0)  # the final attempt took it


def test_fleet_config_rules(tmp_path: Path) -> None:
    assert FleetConfig().enabled is False
    with pytest.raises(ValueError, match="url is required"):
        FleetConfig(enabled=True, token_env="T")
    with pytest.raises(ValueError, match="exactly one"):
        FleetConfig(enabled=True, url="http://f", token_env="T", token_file="/x")
    with pytest.raises(ValueError, match="exactly one"):
        FleetConfig(enabled=True, url="http://f")
    with pytest.raises(ValueError):
        FleetConfig(batch_records=5001)
    with pytest.raises(ValueError, match="http"):
        FleetConfig(url="ftp://f")
    tok = tmp_path / "t"
    tok.write_text("abc\n")
    assert read_token(FleetConfig(enabled=True, url="http://f", token_file=str(tok))) == "abc"
    cfg = FleetConfig(enabled=True, url="http://f", token_env="TOK")
    assert read_token(cfg, {"TOK": "xyz"}) == "xyz"

    with pytest.raises(ConfigError):
        read_token(cfg, {})


def test_a_schema_1_fleet_gets_schema_1_batches_and_nothing_is_dead_lettered(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # what a fleet that only knows schema 1 answers to a schema-2 (and a schema-3) batch
    store, client, up, _m = setup(tmp_path, batch_records=4, max_in_flight=1)
    for i in range(6):
        store.add_aggregate(make_aggregate(60.0 * i))
    store.add_alert(make_alert(1))
    refusal = FleetRejected(
        422, "[{'loc': ['schema'], 'msg': 'Input should be 1'}, {'loc': ['aggregates'], "
             "'msg': 'Extra inputs are not permitted'}]")
    client.fail = [refusal, refusal]
    assert up.run_once() == 0.0
    while store.upload_backlog() != (0, 0):
        assert up.run_once() in (0.0, up.interval_s)
    assert [b.schema_ for b in client.batches] == [3, 2, 1, 1]
    assert client.batches[0].aggregates is not None
    assert all(b.aggregates is None for b in client.batches[2:])
    assert [len(b.all_records()) for b in client.batches] == [4, 4, 4, 3]
    assert client.batches[2].records[0].body.schema_ == 1  # the alert, as schema 1
    assert store.dead_letters() == []
    assert sum("schema-1 batches" in r.getMessage() for r in caplog.records) == 1


def test_schema_2_batches_carry_alerts_as_records_and_aggregates_as_columns(
    tmp_path: Path,
) -> None:
    store, client, up, _m = setup(tmp_path, batch_records=10)
    for i in range(3):
        store.add_aggregate(make_aggregate(60.0 * i))
    store.add_alert(make_alert(1))
    client.statuses = {"gw1:pump1:120000": "rejected"}
    assert up.run_once() == up.interval_s
    sent = client.batches[0]
    assert sent.schema_ == 3 and [r.kind for r in sent.records] == ["alert"]
    assert sent.aggregates is not None and len(sent.aggregates.ids) == 3
    assert store.upload_backlog() == (0, 0)
    assert [d["record_id"] for d in store.dead_letters()] == ["gw1:pump1:120000"]


def test_a_batch_cut_off_at_its_deadline_is_retried_in_halves_and_reported(
    tmp_path: Path,
) -> None:
    store, client, up, _m = setup(tmp_path, batch_records=8, max_in_flight=1,
                                  slow_request_s=10.0)
    for i in range(8):
        store.add_aggregate(make_aggregate(60.0 * i))
    assert up.trouble() is None
    client.fail = [FleetDeadlineExceeded("upload: cut off at 25 s", deadline_s=25.0)]
    assert up.run_once() > 0  # backoff
    trouble = up.trouble()
    assert trouble is not None and "cut off" in trouble
    up.run_once()
    # the retry goes in halves: the first half, and (read ahead while it was in flight) the
    # second half at the same size
    sizes = [len(b.all_records()) for b in client.batches]
    assert sizes[0] == 8 and sizes[1] == 4 and all(n == 4 for n in sizes[1:]), sizes
    assert up.trouble() is None  # an upload succeeded
    while up.run_once() == 0.0:
        pass
    assert store.upload_backlog() == (0, 0)


def test_an_unexpected_error_does_not_end_the_upload_thread(tmp_path: Path) -> None:
    """A bug or a hostile answer that raises something unforeseen is logged and retried with
    backoff; the thread goes on and the records are uploaded once the cause is gone."""
    store, client, up, m = setup(tmp_path, backoff_initial_s=0.05, backoff_max_s=0.1)
    store.add_aggregate(make_aggregate(0.0))
    client.fail = [RuntimeError("something nobody foresaw")]
    up.start()
    try:
        deadline = time.monotonic() + 10
        while store.upload_backlog() != (0, 0):
            assert time.monotonic() < deadline, "the records were never uploaded"
            time.sleep(0.02)
        assert up._thread is not None and up._thread.is_alive()
        assert m.registry.get_sample_value("edge_agent_upload_failures_total",
                                           {"reason": "internal"}) == 1
    finally:
        up.stop()


def test_a_fleet_older_than_lifecycles_gets_raised_as_schema_1_and_keeps_the_rest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # what a schema-2 fleet answers to a schema-3 batch; its AlertBody takes schema 1 only
    store, client, up, m = setup(tmp_path, batch_records=10, max_in_flight=1)
    raised = make_alert(1)
    store.add_alert(raised)
    store.add_alert(dataclasses.replace(raised, alert_id="gw1:pump1:2", seq=2, event="updated",
                                        episode_id=raised.alert_id, peak_score=9.0))
    store.add_alert(dataclasses.replace(raised, alert_id="gw1:pump1:3", seq=3, event="cleared",
                                        episode_id=raised.alert_id, peak_score=9.0))
    client.fail = [FleetRejected(422, "[{'loc': ['schema'], 'msg': 'Input should be 1 or 2'}]")]
    assert up.run_once() == 0.0
    while store.upload_backlog() != (0, 0):
        assert up.run_once() in (0.0, up.interval_s)
    assert [b.schema_ for b in client.batches] == [3, 2]
    assert [r.id for r in client.batches[0].records] == [
        "gw1:pump1:1", "gw1:pump1:2", "gw1:pump1:3"]
    old = client.batches[1].records
    assert [r.id for r in old] == ["gw1:pump1:1"]
    body = old[0].body.model_dump(by_alias=True, exclude_unset=True)
    assert body["schema"] == 1 and "event" not in body and "episode_id" not in body
    assert store.dead_letters() == []
    dropped = m.registry.get_sample_value(
        "edge_agent_dropped_total", {"kind": "alert_event", "reason": "fleet_schema"})
    assert dropped == 2
    assert sum("lifecycle events" in r.getMessage() for r in caplog.records) >= 1
