"""The retraining job queue in the fleet database (table ``retrain_jobs``,
:mod:`fleet.db.job_tables`).

Life of a job::

    enqueue ─► queued ──claim──► running ──complete_in──► done      (published, one version)
                 ▲                  │  ├───finish───────► gated     (refused by its gate)
                 │                  │  └───fail─────────► failed    (permanent, or attempts used)
                 └── release/fail(retry) ┘
                 running with an expired lease ──claim──► running (another worker; attempt + 1)

* :meth:`JobQueue.enqueue` coalesces: a device stream with a queued or running job gets no
  second one (a partial unique index enforces it; the existing job is returned).
* :meth:`JobQueue.claim` takes the oldest due job, or a running one whose lease expired (its
  worker was killed or hung), for ``lease_s`` seconds under a fresh owner token. On PostgreSQL
  the candidate row is selected ``FOR UPDATE SKIP LOCKED`` (workers never wait on each other's
  candidates, nor take the same one); on SQLite, which has one writer at a time, one conditional
  ``UPDATE … WHERE id = (SELECT …) RETURNING``. A job whose lease expired with
  ``attempts == max_attempts`` is failed instead ("worker lost …").
* :meth:`JobQueue.heartbeat` renews the lease and stores progress; it returns False once the
  lease is someone else's (the worker must stop).
* Every change a worker makes is conditional on its owner token still holding the job. The
  publication (package + rollout, :class:`fleet.training.retrain.Retrainer`) and
  :meth:`JobQueue.complete_in` commit in one transaction, so a job publishes at most one
  version: a worker that lost its lease cannot commit, and a completed job is never claimed.
"""

from __future__ import annotations

import datetime as dt
import os
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import Connection, Engine, and_, func, insert, or_, select, update
from sqlalchemy.exc import IntegrityError

from fleet.db.job_tables import retrain_jobs
from fleet.errors import LeaseLost

JobState = Literal["queued", "running", "done", "gated", "failed"]
STATES: tuple[JobState, ...] = ("queued", "running", "done", "gated", "failed")
#: Defaults of a new job: claims at most, seconds a worker may spend on it.
MAX_ATTEMPTS, TIME_LIMIT_S = 3, 900.0
_t = retrain_jobs.c


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def new_owner() -> str:
    """A worker's lease owner token: ``<host>:<pid>:<random>`` (the pid helps operators)."""
    return f"{socket.gethostname()[:80]}:{os.getpid()}:{secrets.token_hex(4)}"


@dataclass(frozen=True)
class Job:
    """One row of ``retrain_jobs`` (times aware UTC; ``progress_fraction`` in 0..1)."""

    id: int
    device_id: str
    stream: str
    state: str
    requested_by: str
    attempts: int
    max_attempts: int
    time_limit_s: float
    lease_owner: str | None
    lease_until: dt.datetime | None
    progress: str | None
    progress_fraction: float | None
    result_name: str | None
    result_version: int | None
    rollout_id: int | None
    reason: str | None
    created_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None


def _job(row: Any) -> Job:
    m = row._mapping
    return Job(**{f: m[f] for f in Job.__dataclass_fields__})


class JobQueue:
    """Enqueue, claim and finish retraining jobs (see the module docstring).

    Args:
        engine: The fleet database (migrated to 0008 or later).
        clock: Aware UTC now.
    """

    def __init__(self, engine: Engine, clock: Callable[[], dt.datetime] = _now) -> None:
        self._engine = engine
        self._clock = clock

    def enqueue(self, device_id: str, stream: str, requested_by: str = "operator", *,
                max_attempts: int = MAX_ATTEMPTS, time_limit_s: float = TIME_LIMIT_S) -> Job:
        """Queue a retraining of ``device_id``/``stream``, or return its pending job.

        Raises:
            ValueError: ``max_attempts`` < 1 or ``time_limit_s`` <= 0.
            sqlalchemy.exc.IntegrityError: no such device.
        """
        if max_attempts < 1 or time_limit_s <= 0:
            raise ValueError("max_attempts must be >= 1 and time_limit_s > 0")
        now = self._clock()
        try:
            with self._engine.begin() as conn:
                row = conn.execute(insert(retrain_jobs).values(
                    device_id=device_id, stream=stream, state="queued",
                    requested_by=requested_by, attempts=0, max_attempts=max_attempts,
                    time_limit_s=time_limit_s, run_after=now, created_at=now, updated_at=now,
                ).returning(*retrain_jobs.c)).one()
            return _job(row)
        except IntegrityError:
            pending = self._pending(device_id, stream)
            if pending is None:  # not the pending index: an unknown device
                raise
            return pending

    def _pending(self, device_id: str, stream: str) -> Job | None:
        with self._engine.connect() as conn:
            row = conn.execute(select(retrain_jobs).where(
                _t.device_id == device_id, _t.stream == stream,
                _t.state.in_(("queued", "running")),
            )).first()
        return None if row is None else _job(row)

    def claim(self, owner: str, lease_s: float) -> Job | None:
        """Take the next job for ``lease_s`` seconds under ``owner`` (attempts + 1); None when
        nothing is due. Fails the expired jobs that have no attempt left first."""
        now = self._clock()
        expired = and_(_t.state == "running", _t.lease_until < now)
        with self._engine.begin() as conn:
            conn.execute(update(retrain_jobs).where(expired, _t.attempts >= _t.max_attempts).values(
                state="failed", lease_owner=None, lease_until=None, finished_at=now,
                updated_at=now,
                reason="worker lost (lease expired) on each of its attempts; last owner "
                       + _t.lease_owner,
            ))
        claimable = _claimable(_t, now)
        claimed = dict(
            state="running", attempts=_t.attempts + 1, lease_owner=owner,
            lease_until=now + dt.timedelta(seconds=lease_s), started_at=now, updated_at=now,
            progress="claimed", progress_fraction=0.0, reason=None,
        )
        with self._engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                job_id = conn.execute(
                    select(_t.id).where(claimable).order_by(_t.id).limit(1)
                    .with_for_update(skip_locked=True)
                ).scalar()
                if job_id is None:
                    return None
                row: Any = conn.execute(update(retrain_jobs).where(_t.id == job_id)
                                        .values(**claimed).returning(*retrain_jobs.c)).one()
            else:
                j = retrain_jobs.alias("j")  # not correlated with the UPDATE's table
                first = (select(j.c.id).where(_claimable(j.c, now)).order_by(j.c.id).limit(1)
                         .scalar_subquery())
                row = conn.execute(update(retrain_jobs).where(_t.id == first, claimable)
                                   .values(**claimed).returning(*retrain_jobs.c)).first()
                if row is None:
                    return None
        return _job(row)

    def heartbeat(self, job_id: int, owner: str, lease_s: float, progress: str | None = None,
                  fraction: float | None = None) -> bool:
        """Renew the lease for ``lease_s`` seconds from now and store the progress (text up to
        200 characters, fraction 0..1); False when ``owner`` no longer holds the job."""
        now = self._clock()
        values: dict[str, Any] = {"lease_until": now + dt.timedelta(seconds=lease_s),
                                  "updated_at": now}
        if progress is not None:
            values["progress"] = progress[:200]
        if fraction is not None:
            values["progress_fraction"] = min(max(fraction, 0.0), 1.0)
        with self._engine.begin() as conn:
            return bool(conn.execute(update(retrain_jobs).where(self._held(job_id, owner))
                                     .values(**values)).rowcount)

    def complete_in(self, conn: Connection, job_id: int, owner: str, name: str, version: int,
                    rollout_id: int | None) -> None:
        """Mark the job ``done`` with its package inside the publishing transaction.

        Raises:
            LeaseLost: ``owner`` no longer holds the job (the transaction must roll back).
        """
        now = self._clock()
        if not conn.execute(update(retrain_jobs).where(self._held(job_id, owner)).values(
            state="done", result_name=name, result_version=version, rollout_id=rollout_id,
            progress="published", progress_fraction=1.0, lease_owner=None, lease_until=None,
            finished_at=now, updated_at=now,
        )).rowcount:
            raise LeaseLost(f"job {job_id} is no longer held by {owner}", job_id=job_id)

    def finish(self, job_id: int, owner: str, state: Literal["done", "gated", "failed"],
               reason: str | None = None, *, name: str | None = None,
               version: int | None = None) -> bool:
        """End the job without publishing (``gated``, ``failed``, or ``done`` with nothing to
        do); False when ``owner`` no longer holds it."""
        now = self._clock()
        with self._engine.begin() as conn:
            return bool(conn.execute(update(retrain_jobs).where(self._held(job_id, owner)).values(
                state=state, reason=None if reason is None else reason[:2000],
                result_name=name, result_version=version, lease_owner=None, lease_until=None,
                finished_at=now, updated_at=now,
            )).rowcount)

    def fail(self, job_id: int, owner: str, reason: str, *, retry_after_s: float | None) -> str:
        """A failed attempt: queued again after ``retry_after_s`` seconds while attempts are
        left, else (or with ``retry_after_s=None``: permanent) ``failed``. Returns the new state,
        or '' when ``owner`` no longer holds the job."""
        now = self._clock()
        with self._engine.begin() as conn:
            row = conn.execute(select(_t.attempts, _t.max_attempts)
                               .where(self._held(job_id, owner))).first()
            if row is None:
                return ""
            again = retry_after_s is not None and row.attempts < row.max_attempts
            values: dict[str, Any] = {"reason": reason[:2000], "lease_owner": None,
                                      "lease_until": None, "updated_at": now}
            if again:
                assert retry_after_s is not None
                values |= {"state": "queued",
                           "run_after": now + dt.timedelta(seconds=retry_after_s)}
            else:
                values |= {"state": "failed", "finished_at": now}
            conn.execute(update(retrain_jobs).where(self._held(job_id, owner)).values(**values))
        return str(values["state"])

    def release(self, job_id: int, owner: str, reason: str) -> bool:
        """Give the job back unfinished (the worker is stopping): queued at once, this attempt
        not counted. False when ``owner`` no longer holds it."""
        now = self._clock()
        with self._engine.begin() as conn:
            return bool(conn.execute(update(retrain_jobs).where(self._held(job_id, owner)).values(
                state="queued", attempts=_t.attempts - 1, lease_owner=None, lease_until=None,
                run_after=now, progress=f"released: {reason}"[:200], updated_at=now,
            )).rowcount)

    def get(self, job_id: int) -> Job | None:
        with self._engine.connect() as conn:
            row = conn.execute(select(retrain_jobs).where(_t.id == job_id)).first()
        return None if row is None else _job(row)

    def list(self, state: JobState | None = None, limit: int = 100) -> list[Job]:
        """Newest first."""
        query = select(retrain_jobs).order_by(_t.id.desc()).limit(limit)
        if state is not None:
            query = query.where(_t.state == state)
        with self._engine.connect() as conn:
            return [_job(r) for r in conn.execute(query)]

    def counts(self) -> dict[str, int]:
        """Jobs per state (every state present, 0 when none): the queue depth for scaling."""
        with self._engine.connect() as conn:
            got = {str(r.state): int(r.n) for r in conn.execute(
                select(_t.state, func.count().label("n")).group_by(_t.state))}
        return {s: got.get(s, 0) for s in STATES}

    @staticmethod
    def _held(job_id: int, owner: str) -> Any:
        return and_(_t.id == job_id, _t.state == "running", _t.lease_owner == owner)


def _claimable(c: Any, now: dt.datetime) -> Any:
    """Due and queued, or running with an expired lease; attempts left either way."""
    return and_(or_(and_(c.state == "queued", c.run_after <= now),
                    and_(c.state == "running", c.lease_until < now)),
                c.attempts < c.max_attempts)
