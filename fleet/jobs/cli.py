"""``edge-fleet worker`` and ``edge-fleet jobs``: run and inspect retraining jobs.

::

    edge-fleet worker [--db URL] [--state-dir DIR] --signing-key FILE --trusted-keys DIR
                      [--base-model DIR] [--lease 30] [--poll 2] [--retry-after 30] [--once]
    edge-fleet jobs list [--state queued|running|done|gated|failed] [--limit 50]
    edge-fleet jobs enqueue --device D --stream S [--max-attempts 3] [--time-limit 900]

``worker`` claims jobs from the database (:mod:`fleet.jobs.worker`) until SIGTERM or SIGINT:
the job in progress is then released (queued again for another worker) and the process exits
0. ``--once`` exits when no job is due. Run any number of workers on any hosts against the
same PostgreSQL. ``jobs list`` prints the queue (newest first) and the count per state;
``jobs enqueue`` queues a retraining by hand (coalesced with a pending one of that stream).
Exit codes as ``edge-fleet`` (1 unknown device, 78 bad configuration, 69 database
unreachable).
"""

from __future__ import annotations

import argparse
import logging
import signal
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import IntegrityError

from fleet.errors import ConfigError, NotFound
from fleet.jobs.queue import MAX_ATTEMPTS, STATES, TIME_LIMIT_S, Job, JobQueue, new_owner
from fleet.settings import Settings

COMMANDS = ("worker", "jobs")
_log = logging.getLogger("fleet.jobs")


def add_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``worker`` and ``jobs`` to the ``edge-fleet`` subparsers."""
    from fleet.training import cli as training_cli  # noqa: PLC0415

    worker = sub.add_parser("worker", parents=[common],
                            help="run retraining jobs from the queue (any number, any host)")
    worker.add_argument("--signing-key", type=Path, help="the fleet's ID.key (signs packages)")
    worker.add_argument("--trusted-keys", type=Path, help="dir of ID.pub keys (registry check)")
    worker.add_argument("--lease", type=float, default=30.0, metavar="S",
                        help="seconds a claimed job stays this worker's without a heartbeat; "
                             "a killed worker's job is taken over after this (default 30)")
    worker.add_argument("--poll", type=float, default=2.0, metavar="S",
                        help="seconds between claims while the queue is empty (default 2)")
    worker.add_argument("--retry-after", type=float, default=30.0, metavar="S",
                        help="delay before a failed attempt is retried (default 30)")
    worker.add_argument("--once", action="store_true", help="exit when no job is due")
    training_cli.add_arguments(worker, serve=False, device=False)

    jobs = sub.add_parser("jobs", help="list or enqueue retraining jobs")
    jobs_sub = jobs.add_subparsers(dest="jobs_command", required=True)
    lst = jobs_sub.add_parser("list", parents=[common], help="the queue, newest first")
    lst.add_argument("--state", choices=STATES)
    lst.add_argument("--limit", type=int, default=50)
    enq = jobs_sub.add_parser("enqueue", parents=[common], help="queue a retraining")
    enq.add_argument("--device", required=True)
    enq.add_argument("--stream", required=True)
    enq.add_argument("--max-attempts", type=int, default=MAX_ATTEMPTS)
    enq.add_argument("--time-limit", type=float, default=TIME_LIMIT_S, metavar="S")


def run(args: argparse.Namespace, settings: Settings, engine: Engine) -> int:
    """Run ``worker`` or ``jobs``; returns the exit code.

    Raises:
        ConfigError: bad options, no signing key, a key file or the base model cannot be loaded.
    """
    queue = JobQueue(engine)
    if args.command == "worker":
        return _worker(args, settings, engine, queue)
    if args.jobs_command == "enqueue":
        try:
            job = queue.enqueue(args.device, args.stream, "operator",
                                max_attempts=args.max_attempts, time_limit_s=args.time_limit)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        except IntegrityError:
            raise NotFound(f"no device {args.device}") from None
        print(f"job {job.id}: {job.device_id}/{job.stream} {job.state}")
        return 0
    print(format_jobs(queue.list(args.state, args.limit)))
    print("  ".join(f"{s} {n}" for s, n in queue.counts().items()))
    return 0


def _worker(args: argparse.Namespace, settings: Settings, engine: Engine,
            queue: JobQueue) -> int:
    from fleet.jobs.worker import Worker  # noqa: PLC0415 - onnx, torch-free but heavy
    from fleet.training import cli as training_cli  # noqa: PLC0415

    if not (0 < args.lease <= 3600 and 0 < args.poll <= 3600 and args.retry_after >= 0):
        raise ConfigError("--lease and --poll must be 0..3600 s, --retry-after >= 0")
    retrainer = training_cli.build_retrainer(settings, engine, args.base_model)
    worker = Worker(queue, retrainer, new_owner(), lease_s=args.lease, poll_s=args.poll,
                    retry_after_s=args.retry_after)

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        _log.info("worker %s: %s received; releasing the job in progress and stopping",
                  worker.owner, signal.Signals(signum).name)
        worker.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    worker.run(once=args.once)
    return 0


def format_jobs(jobs: Sequence[Job]) -> str:
    """Jobs as a fixed-width table (one header line, one line per job)."""
    header = ("ID", "DEVICE", "STREAM", "STATE", "TRIES", "PROGRESS", "RESULT", "REASON")
    rows = [header]
    for j in jobs:
        pct = f" {100 * j.progress_fraction:.0f}%" if j.progress_fraction is not None else ""
        result = (f"{j.result_name}@{j.result_version}" if j.result_version is not None else "-")
        if j.rollout_id is not None:
            result += f" rollout {j.rollout_id}"
        rows.append((str(j.id), j.device_id, j.stream, j.state,
                     f"{j.attempts}/{j.max_attempts}", (j.progress or "-") + pct, result,
                     (j.reason or "-")[:80]))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )
