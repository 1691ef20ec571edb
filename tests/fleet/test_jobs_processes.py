"""Two real ``edge-fleet worker`` processes on PostgreSQL: the one running a job is killed with
kill -9 mid-job; the other takes the job over when the lease expires and publishes it: exactly
one version and one rollout for the job. Then SIGTERM during a job: the survivor releases it
(queued again, the attempt not counted) and exits 0."""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest
from sqlalchemy import Engine, func, select

from cloud_sync.protocol import SampleBatch
from fleet.db.devices import DeviceRegistry
from fleet.db.engine import make_engine
from fleet.db.model_tables import models, rollouts
from fleet.db.samples import SampleStore
from fleet.jobs.queue import Job, JobQueue
from fleet.settings import Settings
from tests.fleet.conftest import ADMIN_TOKEN, fresh_pg_database
from tests.fleet.live import wait_for
from tests.fleet.test_training import NEXT, _batch, _keys

LEASE_S = 3
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def pg_engine() -> Iterator[Engine]:
    """A fresh migrated PostgreSQL database of its own (worker processes connect to it too)."""
    with fresh_pg_database("fleet_jobs") as url:
        engine = make_engine(Settings(db_url=url, admin_token=ADMIN_TOKEN))
        try:
            yield engine
        finally:
            engine.dispose()


def _start(url: str, tmp: Path, n: int, key: Path, keydir: Path) -> tuple[subprocess.Popen[bytes],
                                                                         IO[bytes]]:
    # the fleet package these tests import (a worktree's, not an editable install's elsewhere)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    log = (tmp / f"worker{n}.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleet.cli", "worker", "--db", url, "--state-dir",
         str(tmp / f"state{n}"), "--signing-key", str(key), "--trusted-keys", str(keydir),
         "--lease", str(LEASE_S), "--poll", "0.2", "--retry-after", "0"],
        stdout=log, stderr=subprocess.STDOUT, env=env,
    )
    return proc, log


def _running(queue: JobQueue, job_id: int,
             procs: list[tuple[subprocess.Popen[bytes], IO[bytes]]]) -> Job | None:
    for p, log in procs:
        assert p.poll() is None, Path(log.name).read_text()
    job = queue.get(job_id)
    return job if job is not None and job.state == "running" else None


def _finished(queue: JobQueue, job_id: int) -> Job | None:
    job = queue.get(job_id)
    return job if job is not None and job.state in ("done", "failed") else None


def _count(engine: Engine, table: object) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())  # type: ignore[arg-type]


Procs = list[tuple[subprocess.Popen[bytes], IO[bytes]]]


def _freeze_mid_job(queue: JobQueue, job_id: int, procs: Procs) -> int | None:
    """Wait until a worker is training the job, SIGSTOP it and return its pid when the job is
    still its (running: claimed, not committed); None when it finished first (a fast machine)."""
    def training_or_finished() -> Job | None:
        job = _running(queue, job_id, procs)
        if job is not None:
            return job if job.progress != "claimed" else None
        job = queue.get(job_id)
        return job if job is not None and job.state != "queued" else None

    job = wait_for(training_or_finished, "a worker to be training", timeout=60)
    if job.state != "running":
        return None
    assert job.lease_owner is not None
    pid = int(job.lease_owner.split(":")[1])
    os.kill(pid, signal.SIGSTOP)
    now = queue.get(job_id)
    if now is not None and now.state == "running" and now.lease_owner == job.lease_owner:
        return pid
    os.kill(pid, signal.SIGCONT)
    return None


def test_kill_9_mid_job_another_worker_publishes_it_once(pg_engine: Engine,
                                                          tmp_path: Path) -> None:
    key, keydir = _keys(tmp_path)
    url = pg_engine.url.render_as_string(hide_password=False)
    devices = DeviceRegistry(pg_engine)
    samples = SampleStore(pg_engine)
    gateways = [f"gw{i}" for i in range(1, 6)]
    for d in gateways:
        devices.enroll(d, [])
        samples.add(SampleBatch.model_validate(_batch(d)), dt.datetime.now(dt.timezone.utc))
    queue = JobQueue(pg_engine)
    procs = [_start(url, tmp_path, n, key, keydir) for n in (1, 2)]
    try:
        # a job caught mid-training (a retraining takes about 1 s: try the next device if the
        # job finished before its worker could be stopped)
        for d in gateways[:-1]:
            job_id = queue.enqueue(d, "pump").id
            pid = _freeze_mid_job(queue, job_id, procs)
            if pid is not None:
                break
        else:
            pytest.fail("no job could be caught mid-training")
        published = _count(pg_engine, models)
        victim = next(p for p, _ in procs if p.pid == pid)
        survivor = next(p for p, _ in procs if p.pid != pid)
        os.kill(pid, signal.SIGKILL)
        victim.wait(10)
        assert _count(pg_engine, models) == published  # the killed worker published nothing
        done = wait_for(lambda: (j := queue.get(job_id)) and j.state in ("done", "failed") and j,
                        "the other worker to finish the job", timeout=60)
        assert done.state == "done", done
        assert done.attempts == 2 and done.result_version is not None
        assert done.rollout_id is not None
        # one version and one rollout per done job; the killed job's version is the survivor's
        finished = [j for j in queue.list() if j.state == "done"]
        assert _count(pg_engine, models) == len(finished) == _count(pg_engine, rollouts)
        with pg_engine.connect() as conn:
            versions = conn.execute(select(models.c.version).order_by(models.c.version)).all()
        assert [v for (v,) in versions] == list(range(NEXT, NEXT + len(finished)))

        # SIGTERM during a job: released (not failed, attempt not counted), exit 0
        last = queue.enqueue(gateways[-1], "pump").id
        alive = [pl for pl in procs if pl[0] is survivor]
        # claimed: running, or already done (a retraining can end between two polls)
        wait_for(lambda: _running(queue, last, alive) or _finished(queue, last),
                 "the survivor to claim the next job", 30)
        survivor.send_signal(signal.SIGTERM)
        assert survivor.wait(30) == 0
        job = queue.get(last)
        assert job is not None, job
        if job.state != "done":  # (unless it finished before the signal was handled)
            assert (job.state, job.attempts) == ("queued", 0), job
    finally:
        for p, log in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
            log.close()
    logs = "".join((tmp_path / f"worker{n}.log").read_text() for n in (1, 2))
    assert f"job {job_id}: published skab-wstat@" in logs, logs
    assert "SIGTERM received" in logs and "stopped after" in logs, logs
