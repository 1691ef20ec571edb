"""Retraining as jobs in one process (fleet.jobs.worker, real training): the samples endpoint
enqueues under ``--auto-retrain``, a worker publishes exactly one version per job, a worker that
lost its lease publishes nothing, the time limit and a stop give the job back. On SQLite and
PostgreSQL. Two real ``edge-fleet worker`` processes and kill -9: test_jobs_processes.py."""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, func, select

from cloud_sync.protocol import SampleBatch
from fleet.app import create_app
from fleet.db.model_tables import rollouts
from fleet.db.samples import SampleStore
from fleet.jobs.queue import JobQueue
from fleet.jobs.worker import Worker
from fleet.registry.wiring import build_model_loop
from fleet.settings import Settings
from fleet.training.retrain import Retrainer
from tests.fleet.test_training import BASE, NEXT, _auth, _batch, _keys


@pytest.fixture
def keyed(settings: Settings, tmp_path: Path) -> Settings:
    key, keydir = _keys(tmp_path)
    return dataclasses.replace(settings, trusted_keys_dir=keydir, signing_key_file=key)


def _retrainer(keyed: Settings, engine: Engine) -> Retrainer:
    assert keyed.signing_key_file is not None
    return Retrainer(SampleStore(engine), build_model_loop(keyed, engine),
                     keyed.signing_key_file, BASE)


def _rollouts(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(rollouts)).scalar_one())


def test_auto_retrain_enqueues_and_a_worker_publishes_one_candidate(
    keyed: Settings, engine: Engine, enrolled: dict[str, str]
) -> None:
    queue = JobQueue(engine)
    retrainer = _retrainer(keyed, engine)
    worker = Worker(queue, retrainer, "w1", poll_s=0.1)
    hook = lambda d, s: queue.enqueue(d, s, "auto")  # noqa: E731 - what serve wires
    with TestClient(create_app(keyed, engine, hook)) as tc:
        h = _auth(enrolled["gw1"])
        assert tc.post("/v1/samples", json=_batch(), headers=h).status_code == 200
        assert tc.post("/v1/samples", json=_batch(), headers=h).status_code == 200
        [job] = queue.list()  # the second calibration was coalesced
        assert (job.state, job.requested_by) == ("queued", "auto")
        assert worker.run(once=True) == 1
        done = queue.get(job.id)
        assert done is not None and done.state == "done", done
        assert (done.result_name, done.result_version, done.attempts) == ("skab-wstat", NEXT, 1)
        assert done.rollout_id is not None and done.progress_fraction == 1.0
        resp = tc.get("/v1/models/assignment", params={"stream": "pump"}, headers=h)
        assert resp.status_code == 200, resp.text
        assert (resp.json()["name"], resp.json()["version"]) == ("skab-wstat", NEXT)
        assert tc.get("/v1/models/assignment", params={"stream": "pump"},
                      headers=_auth(enrolled["gw2"])).status_code == 204
        # a later calibration (restart) enqueues again, but the device model exists: no training
        assert tc.post("/v1/samples", json=_batch(), headers=h).status_code == 200
        assert worker.run(once=True) == 1
        latest = queue.list()[0]
        assert latest.state == "done" and latest.result_version is None
        assert latest.reason is not None and "device model exists" in latest.reason
    assert [r.version for r in retrainer.loop.registry.list()] == [NEXT]
    assert _rollouts(engine) == 1


def test_a_worker_that_lost_its_lease_publishes_nothing(
    keyed: Settings, engine: Engine, enrolled: dict[str, str], tmp_path: Path
) -> None:
    """Worker A claims, stalls past its lease, B takes the job over; A's training finishes
    first but its publication is refused with the job (one transaction): one version, B's."""
    store = SampleStore(engine)
    store.add(SampleBatch.model_validate(_batch()), dt.datetime.now(dt.timezone.utc))
    now = [dt.datetime.now(dt.timezone.utc)]
    queue = JobQueue(engine, lambda: now[0])
    job_id = queue.enqueue("gw1", "pump").id
    as_a = queue.claim("A", 10)
    now[0] += dt.timedelta(seconds=11)
    as_b = queue.claim("B", 10)
    assert as_a is not None and as_b is not None and as_b.attempts == 2
    retrainer = _retrainer(keyed, engine)
    assert Worker(queue, retrainer, "A", lease_s=60).run_job(as_a) == ""
    assert retrainer.loop.registry.list() == [] and _rollouts(engine) == 0
    assert Worker(queue, retrainer, "B", lease_s=60).run_job(as_b) == "done"
    job = queue.get(job_id)
    assert job is not None and job.state == "done" and job.result_version == NEXT
    assert [r.version for r in retrainer.loop.registry.list()] == [NEXT]
    assert _rollouts(engine) == 1


def test_time_limit_and_stop_give_the_job_back(
    keyed: Settings, engine: Engine, enrolled: dict[str, str]
) -> None:
    SampleStore(engine).add(SampleBatch.model_validate(_batch()),
                            dt.datetime.now(dt.timezone.utc))
    queue = JobQueue(engine)
    retrainer = _retrainer(keyed, engine)
    job_id = queue.enqueue("gw1", "pump", max_attempts=1, time_limit_s=5).id
    ticks = itertools.count(0, 10.0)  # every clock read is 10 s later: past the limit at once
    worker = Worker(queue, retrainer, "w1", retry_after_s=0, clock=lambda: next(ticks))
    claimed = queue.claim("w1", 30)
    assert claimed is not None
    assert worker.run_job(claimed) == "failed"  # one attempt only
    job = queue.get(job_id)
    assert job is not None and job.reason is not None and "time limit" in job.reason
    # stop(): the job in progress is released, not failed, and the attempt is not counted
    other = queue.enqueue("gw1", "pump", max_attempts=1).id
    worker = Worker(queue, retrainer, "w2")
    worker.stop()
    claimed = queue.claim("w2", 30)
    assert claimed is not None
    assert worker.run_job(claimed) == "queued"
    job = queue.get(other)
    assert job is not None and (job.state, job.attempts) == ("queued", 0)
    assert retrainer.loop.registry.list() == []


def test_no_samples_fails_at_once(keyed: Settings, engine: Engine,
                                  enrolled: dict[str, str]) -> None:
    queue = JobQueue(engine)
    job_id = queue.enqueue("gw2", "pump").id
    assert Worker(queue, _retrainer(keyed, engine), "w1").run(once=True) == 1
    job = queue.get(job_id)
    assert job is not None and (job.state, job.attempts) == ("failed", 1)
    assert job.reason is not None and job.reason.startswith("NoSamples")
