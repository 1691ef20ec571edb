"""The retraining job queue (fleet.jobs.queue) on SQLite and PostgreSQL: coalescing, claims,
leases, attempts, retries, release; and concurrent claimers never share a job."""

from __future__ import annotations

import datetime as dt
import threading

import pytest
from sqlalchemy import Engine
from sqlalchemy.exc import IntegrityError

from fleet.db.devices import DeviceRegistry
from fleet.errors import LeaseLost
from fleet.jobs.queue import JobQueue

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def queue(engine: Engine, clock: Clock) -> JobQueue:
    devices = DeviceRegistry(engine)
    for d in ("gw1", "gw2", "gw3"):
        devices.enroll(d, [])
    return JobQueue(engine, clock)


def test_a_device_stream_has_one_pending_job(queue: JobQueue) -> None:
    a = queue.enqueue("gw1", "pump", "auto")
    assert (a.state, a.attempts, a.max_attempts) == ("queued", 0, 3)
    assert queue.enqueue("gw1", "pump", "operator").id == a.id  # coalesced
    other = queue.enqueue("gw1", "fan")
    assert other.id != a.id
    job = queue.claim("w1", 30)
    assert job is not None and job.id == a.id and job.state == "running"
    assert queue.enqueue("gw1", "pump").id == a.id  # running: still coalesced
    assert queue.finish(a.id, "w1", "gated", "too many false alarms")
    again = queue.enqueue("gw1", "pump")
    assert again.id not in (a.id, other.id) and again.state == "queued"
    assert queue.counts() == {"queued": 2, "running": 0, "done": 0, "gated": 1, "failed": 0}


def test_unknown_device_is_refused(queue: JobQueue) -> None:
    with pytest.raises(IntegrityError):
        queue.enqueue("nope", "pump")
    with pytest.raises(ValueError):
        queue.enqueue("gw1", "pump", max_attempts=0)


def test_claims_are_exclusive_and_oldest_first(queue: JobQueue) -> None:
    ids = [queue.enqueue(d, "pump").id for d in ("gw1", "gw2")]
    a, b = queue.claim("w1", 30), queue.claim("w2", 30)
    assert a is not None and b is not None
    assert [a.id, b.id] == ids and (a.lease_owner, b.lease_owner) == ("w1", "w2")
    assert a.attempts == 1 and a.lease_until == T0 + dt.timedelta(seconds=30)
    assert queue.claim("w3", 30) is None


def test_heartbeat_renews_and_reports_progress(queue: JobQueue, clock: Clock) -> None:
    job_id = queue.enqueue("gw1", "pump").id
    assert queue.claim("w1", 10) is not None
    clock.advance(8)
    assert queue.heartbeat(job_id, "w1", 10, "int8 quantization", 0.4)
    assert not queue.heartbeat(job_id, "w2", 10)
    clock.advance(8)  # 16 s after the claim, 8 s after the heartbeat: still held
    assert queue.claim("w2", 10) is None
    job = queue.get(job_id)
    assert job is not None and job.progress == "int8 quantization"
    assert job.progress_fraction == pytest.approx(0.4)


def test_an_expired_lease_moves_the_job_and_fences_the_old_owner(
    queue: JobQueue, clock: Clock, engine: Engine
) -> None:
    job_id = queue.enqueue("gw1", "pump").id
    assert queue.claim("w1", 10) is not None
    clock.advance(11)  # w1 was killed: no heartbeat
    taken = queue.claim("w2", 10)
    assert taken is not None and taken.id == job_id and taken.attempts == 2
    # the old owner can neither renew, nor finish, nor publish
    assert not queue.heartbeat(job_id, "w1", 10)
    assert not queue.finish(job_id, "w1", "gated")
    assert queue.fail(job_id, "w1", "boom", retry_after_s=0) == ""
    with pytest.raises(LeaseLost), engine.begin() as conn:
        queue.complete_in(conn, job_id, "w1", "m", 2, None)
    with engine.begin() as conn:
        queue.complete_in(conn, job_id, "w2", "m", 2, 7)
    job = queue.get(job_id)
    assert job is not None and (job.state, job.result_version, job.rollout_id) == ("done", 2, 7)
    assert job.lease_owner is None and job.finished_at == clock.now


def test_attempts_are_bounded(queue: JobQueue, clock: Clock) -> None:
    job_id = queue.enqueue("gw1", "pump", max_attempts=2).id
    for owner in ("w1", "w2"):
        assert queue.claim(owner, 5) is not None
        clock.advance(6)
    assert queue.claim("w3", 5) is None
    job = queue.get(job_id)
    assert job is not None and job.state == "failed" and job.attempts == 2
    assert job.reason is not None and "worker lost" in job.reason and "w2" in job.reason


def test_failed_attempts_retry_after_a_delay_then_fail(queue: JobQueue, clock: Clock) -> None:
    job_id = queue.enqueue("gw1", "pump", max_attempts=2).id
    assert queue.claim("w1", 30) is not None
    assert queue.fail(job_id, "w1", "database hiccup", retry_after_s=60) == "queued"
    assert queue.claim("w1", 30) is None  # not before run_after
    clock.advance(61)
    assert queue.claim("w2", 30) is not None
    assert queue.fail(job_id, "w2", "again", retry_after_s=60) == "failed"
    job = queue.get(job_id)
    assert job is not None and (job.state, job.reason) == ("failed", "again")
    # a permanent failure ends at once
    other = queue.enqueue("gw2", "pump").id
    assert queue.claim("w1", 30) is not None
    assert queue.fail(other, "w1", "NoSamples", retry_after_s=None) == "failed"


def test_release_requeues_without_counting_the_attempt(queue: JobQueue) -> None:
    job_id = queue.enqueue("gw1", "pump", max_attempts=1).id
    assert queue.claim("w1", 30) is not None
    assert queue.release(job_id, "w1", "worker stopping")
    job = queue.get(job_id)
    assert job is not None and (job.state, job.attempts) == ("queued", 0)
    again = queue.claim("w2", 30)
    assert again is not None and again.attempts == 1
    assert [j.id for j in queue.list("running")] == [job_id]


def test_concurrent_claimers_take_each_job_once(queue: JobQueue, engine: Engine) -> None:
    real = JobQueue(engine)  # the real clock: every job due
    for d in ("gw1", "gw2", "gw3"):
        for s in ("a", "b", "c", "d"):
            real.enqueue(d, s)
    got: dict[str, list[int]] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def claimer(owner: str) -> None:
        try:
            start.wait()
            mine = got.setdefault(owner, [])
            while (job := real.claim(owner, 60)) is not None:
                mine.append(job.id)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    claimed = [j for ids in got.values() for j in ids]
    assert len(claimed) == 12 and len(set(claimed)) == 12
    assert {j.lease_owner for j in real.list("running")} <= set(got)
