"""The loop of ``edge-fleet worker``: claim a retraining job, run it, record how it ended.

One job at a time per process; run as many processes, on as many hosts, as the queue needs
(:mod:`fleet.jobs.queue` keeps them off each other's jobs). Per job:

* a heartbeat thread renews the lease every ``lease_s / 3`` seconds and stores the progress
  (training step, fraction; each step is also stored when it starts); it stops renewing at the
  job's time limit, so a worker hung in a step loses the job to another worker one lease later;
* the training's progress callbacks raise :class:`~fleet.errors.LeaseLost` once the lease is
  someone else's and :class:`~fleet.errors.JobInterrupted` past the time limit or after
  :meth:`Worker.stop`; nothing is published then;
* the package, its rollout and the job's completion commit in one transaction
  (:meth:`fleet.training.retrain.Retrainer.retrain` ``on_publish``), conditional on the lease:
  one published version per job, whichever worker finishes it.

Endings: published -> ``done``; refused by the gate -> ``gated``; no samples, samples that do not
fit the base model, or a registry refusal (untrusted key) -> ``failed`` at once (retrying cannot
help); time limit or any other error -> queued again after ``retry_after_s`` until the job's
attempts are used, then ``failed``; :meth:`Worker.stop` (SIGTERM) -> released: queued again at
once, the attempt not counted. An ``auto`` job (``serve --auto-retrain``) for a stream that
already has a device-specific model ends ``done`` without training (as before the queue).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from sqlalchemy import Connection

from fleet.errors import ApiError, Conflict, JobInterrupted, LeaseLost
from fleet.jobs.queue import Job, JobQueue
from fleet.training.retrain import NoSamples, Retrainer, RetrainOutcome
from fleet.training.train import STEPS

_log = logging.getLogger("fleet.jobs")
_STOPPING = "worker stopping"


class _Run:
    """One job in progress: its progress, lease state and deadline (shared with the heartbeat
    thread)."""

    def __init__(self, job: Job, deadline: float, stopping: threading.Event,
                 clock: Callable[[], float]) -> None:
        self.job = job
        self.deadline = deadline
        self.progress = "claimed"
        self.fraction = 0.0
        self.lost = threading.Event()
        self.done = threading.Event()
        self._stopping = stopping
        self._clock = clock

    def check(self) -> None:
        """Raises: LeaseLost, JobInterrupted (see the module docstring)."""
        if self.lost.is_set():
            raise LeaseLost(f"job {self.job.id}: lease lost", job_id=self.job.id)
        if self._clock() > self.deadline:
            raise JobInterrupted(f"time limit of {self.job.time_limit_s:g} s reached",
                                 job_id=self.job.id)
        if self._stopping.is_set():
            raise JobInterrupted(_STOPPING, job_id=self.job.id)


class Worker:
    """Claims and runs retraining jobs.

    Args:
        queue: The job queue.
        retrainer: Does one retraining (:class:`fleet.training.retrain.Retrainer`).
        owner: This worker's lease owner token (:func:`fleet.jobs.queue.new_owner`).
        lease_s: Lease length, seconds; renewed every third of it.
        poll_s: Seconds between claims while the queue is empty.
        retry_after_s: Delay before a failed attempt is claimable again, seconds.
        clock: Monotonic seconds (time limits).
    """

    def __init__(self, queue: JobQueue, retrainer: Retrainer, owner: str, *,
                 lease_s: float = 30.0, poll_s: float = 2.0, retry_after_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if lease_s <= 0 or poll_s <= 0 or retry_after_s < 0:
            raise ValueError("lease_s and poll_s must be > 0, retry_after_s >= 0")
        self.queue = queue
        self.retrainer = retrainer
        self.owner = owner
        self.lease_s = lease_s
        self.poll_s = poll_s
        self.retry_after_s = retry_after_s
        self._clock = clock
        self._stopping = threading.Event()

    def stop(self) -> None:
        """Stop after the current job is released (safe from a signal handler)."""
        self._stopping.set()

    def run(self, *, once: bool = False) -> int:
        """Claim and run jobs until :meth:`stop` (or, with ``once``, until none is due).

        Returns:
            How many jobs this call ran.
        """
        ran = 0
        _log.info("worker %s: waiting for jobs (lease %g s)", self.owner, self.lease_s)
        while not self._stopping.is_set():
            job = self.queue.claim(self.owner, self.lease_s)
            if job is None:
                if once:
                    break
                self._stopping.wait(self.poll_s)
                continue
            self.run_job(job)
            ran += 1
        _log.info("worker %s: stopped after %d job(s)", self.owner, ran)
        return ran

    def run_job(self, job: Job) -> str:
        """Run one claimed job to its end; returns the job's new state ('' when lost)."""
        run = _Run(job, self._clock() + job.time_limit_s, self._stopping, self._clock)
        beat = threading.Thread(target=self._heartbeat, args=(run,),
                                name=f"job-{job.id}-heartbeat", daemon=True)
        _log.info("job %d: %s/%s claimed (attempt %d of %d, requested by %s)", job.id,
                  job.device_id, job.stream, job.attempts, job.max_attempts, job.requested_by)
        started = self._clock()
        beat.start()
        try:
            state = self._attempt(run)
        finally:
            run.done.set()
            beat.join()
        _log.info("job %d: %s after %.1f s", job.id, state or "given up (lease lost)",
                  self._clock() - started)
        return state

    def _attempt(self, run: _Run) -> str:
        job = run.job

        def on_step(name: str) -> None:  # stored at once (and the lease renewed): 6 steps
            run.progress = name
            run.fraction = STEPS.index(name) / len(STEPS) if name in STEPS else run.fraction
            if not self.queue.heartbeat(job.id, self.owner, self.lease_s, name, run.fraction):
                run.lost.set()
            run.check()

        def on_publish(conn: Connection, outcome: RetrainOutcome) -> None:
            run.check()
            self.queue.complete_in(conn, job.id, self.owner, outcome.name, outcome.version,
                                   outcome.rollout_id)

        try:
            if job.requested_by == "auto" and self.retrainer.has_device_model(
                    job.device_id, job.stream):
                ok = self.queue.finish(job.id, self.owner, "done",
                                       "a device model exists; not retrained")
                return "done" if ok else ""
            out = self.retrainer.retrain(job.device_id, job.stream, on_step=on_step,
                                         on_quant_batch=run.check, on_publish=on_publish)
        except LeaseLost:
            _log.warning("job %d: lease lost (another worker holds it now); nothing published",
                         job.id)
            return ""
        except JobInterrupted as exc:
            if str(exc) == _STOPPING:
                return "queued" if self.queue.release(job.id, self.owner, str(exc)) else ""
            return self._failed(job, str(exc), retry=True)
        except (NoSamples, ValueError) as exc:
            return self._failed(job, f"{type(exc).__name__}: {exc}", retry=False)
        except Conflict as exc:
            return self._failed(job, f"registry: {exc.detail}", retry=True)
        except ApiError as exc:
            return self._failed(job, f"registry refused: {exc.detail}", retry=False)
        except Exception as exc:
            _log.exception("job %d: %s/%s failed", job.id, job.device_id, job.stream)
            return self._failed(job, f"{type(exc).__name__}: {exc}", retry=True)
        except BaseException:
            self.queue.release(job.id, self.owner, "worker interrupted")
            raise
        if out.published:
            _log.info("job %d: published %s@%d for %s/%s, rollout %s", job.id, out.name,
                      out.version, job.device_id, job.stream, out.rollout_id)
            return "done"
        ok = self.queue.finish(job.id, self.owner, "gated", out.reason, name=out.name,
                               version=out.version)
        return "gated" if ok else ""

    def _failed(self, job: Job, reason: str, *, retry: bool) -> str:
        state = self.queue.fail(job.id, self.owner, reason,
                                retry_after_s=self.retry_after_s if retry else None)
        level = logging.WARNING if state == "queued" else logging.ERROR
        _log.log(level, "job %d: attempt %d of %d failed (%s): %s", job.id, job.attempts,
                 job.max_attempts, "retried later" if state == "queued" else "job failed",
                 reason)
        return state

    def _heartbeat(self, run: _Run) -> None:
        every = self.lease_s / 3
        while not run.done.wait(every):
            if self._clock() > run.deadline:
                _log.warning("job %d: time limit reached; lease no longer renewed", run.job.id)
                return
            try:
                held = self.queue.heartbeat(run.job.id, self.owner, self.lease_s,
                                            run.progress, run.fraction)
            except Exception:  # the database may come back before the lease ends
                _log.exception("job %d: heartbeat failed", run.job.id)
                continue
            if not held:
                run.lost.set()
                return
