"""Drain a 1,000,000-aggregate backlog from the agent's SQLite store into a real fleet.

Scenario: the gateway was offline; its store buffered ``--rows`` aggregate rows (inserted fast:
``executemany`` in one transaction). Then a fleet service starts (``edge-fleet serve``
subprocess with ``--workers 2``: one per core of this 2-core host, as docs/fleet.md recommends for
ingest-heavy fleets) and the real :class:`agent.services.uploader.Uploader` with the real
:class:`cloud_sync.client.FleetClient` drains the backlog with the ``[fleet]`` config defaults
(``max_in_flight`` 2, ``gzip_level`` 6) and ``batch_records = 5000`` (the largest batch the
protocol allows; a documented setting). At the end the fleet database is checked:
``COUNT(*)`` and ``COUNT(DISTINCT id)`` against ``--rows``.

Fleet database (``--fleet-db``): ``sqlite`` (default: a SQLite file in ``--workdir``, WAL,
``synchronous=FULL``: the zero-setup fleet of one site, and what the sync fault tests run) or
``postgresql`` (a fresh database on ``--pg``, dropped at the end: what real fleets use; its server
shares this machine's cores with the agent and the fleet process). Commits are durable in both.

Usage::

    python benchmarks/backlog.py [--rows 1000000] [--batch 5000] [--gzip-level 6]
        [--in-flight 2] [--fleet-workers 2] [--fleet-db sqlite|postgresql]
        [--pg "host=127.0.0.1 user=postgres dbname=test"] [--port N] [--workdir DIR]

``--workdir`` is kept afterwards; without it the work folder (the agent's store: ~900 MB for
1,000,000 rows, and the fleet's) is a temporary folder removed at the end, also after an error.

Last line: ``rows_per_s=<n> lost=<n> duplicated=<n> peak_rss_mb=<n>`` (agent process).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import resource
import secrets
import sqlite3
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from prometheus_client import CollectorRegistry  # noqa: E402
from workspace import add_arguments, workspace  # noqa: E402

from agent.metrics import Metrics  # noqa: E402
from agent.services.uploader import FleetConfig, Uploader  # noqa: E402
from agent.store.sqlite import Store  # noqa: E402
from cloud_sync.client import FleetClient  # noqa: E402
from tests.integration.fleet_peer import FleetProcess  # noqa: E402

CHANNELS = json.dumps(
    [{"channel": f"ch{i}", "count": 600, "min": 1.0, "max": 2.0, "mean": 1.5, "std": 0.1}
     for i in range(4)],
    separators=(",", ":"),
)


def fill(db: Path, rows: int) -> float:
    Store(db).close()  # schema
    t0 = time.perf_counter()
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("BEGIN")
    conn.executemany(
        "INSERT INTO aggregates (aggregate_id, device_id, stream, interval_start, interval_s,"
        " count, channels, max_score, windows, alert_count) "
        "VALUES (?, 'gw1', ?, ?, 60.0, 600, ?, ?, 10, 0)",
        (
            (f"gw1:s{i % 4}:{(1_600_000_000 + 60 * (i // 4)) * 1000}", f"s{i % 4}",
             1_600_000_000.0 + 60 * (i // 4), CHANNELS, None if i % 10 == 0 else 1.25)
            for i in range(rows)
        ),
    )
    conn.execute("COMMIT")
    conn.close()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=5000)
    ap.add_argument("--gzip-level", type=int, default=FleetConfig().gzip_level,
                    help="the uploader's gzip level (default: the [fleet] config default)")
    ap.add_argument("--in-flight", type=int, default=FleetConfig().max_in_flight,
                    help="the uploader's max_in_flight (default: the [fleet] config default)")
    ap.add_argument("--fleet-workers", type=int, default=2,
                    help="edge-fleet serve --workers (docs/fleet.md: one per core; 2 here)")
    add_arguments(ap, port_help="port of the edge-fleet serve peer (default: a free one)")
    ap.add_argument("--profile", action="store_true", help="cProfile the agent side")
    ap.add_argument("--fleet-db", choices=("sqlite", "postgresql"), default="sqlite")
    ap.add_argument("--pg", default="host=127.0.0.1 port=5432 user=postgres dbname=test")
    args = ap.parse_args(argv)
    with workspace(args.workdir, "backlog-") as workdir:
        return run(args, workdir)


def run(args: argparse.Namespace, workdir: Path) -> int:
    """Fill the store in ``workdir``, start the fleet, drain; the fleet database is dropped."""
    db = workdir / "agent.db"
    print(f"workdir {workdir}; fleet storage: {args.fleet_db} (edge-fleet serve subprocess, "
          f"--workers {args.fleet_workers}); uploader max_in_flight {args.in_flight}; "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"filling the agent store with {args.rows} aggregates ...", flush=True)
    print(f"  filled in {fill(db, args.rows):.1f} s", flush=True)
    pg_admin = None
    db_url = None
    if args.fleet_db == "postgresql":
        import psycopg  # noqa: PLC0415

        pg_admin = psycopg.connect(args.pg, autocommit=True)
        pg_name = f"backlog_{secrets.token_hex(4)}"
        pg_admin.execute(f'CREATE DATABASE "{pg_name}"')
        info = pg_admin.info
        db_url = f"postgresql+psycopg://{info.user}@{info.host}:{info.port}/{pg_name}"
    fleet: FleetProcess | None = None
    try:
        fleet = FleetProcess(workdir / "fleet", db_url=db_url, workers=args.fleet_workers,
                             port=args.port)
        return drain(args, db, fleet)
    finally:
        if fleet is not None:
            fleet.stop()  # no-op when drain stopped it; before the work folder goes
        if pg_admin is not None:
            pg_admin.execute(f'DROP DATABASE IF EXISTS "{pg_name}" WITH (FORCE)')
            pg_admin.close()


def drain(args: argparse.Namespace, db: Path, fleet: FleetProcess) -> int:
    fleet.start()
    print(f"fleet at {fleet.url}", flush=True)
    store = Store(db, budget_bytes=None)
    client = FleetClient(fleet.url, fleet.token, read_timeout_s=120, gzip_level=args.gzip_level)
    up = Uploader(store, client, "gw1", Metrics(CollectorRegistry()), batch_records=args.batch,
                  interval_s=0.01, backoff_initial_s=0.1, backoff_max_s=2.0,
                  max_in_flight=args.in_flight)
    prof = cProfile.Profile() if args.profile else None
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    last = t0
    failures = 0
    try:
        if prof is not None:
            prof.enable()
        while True:
            delay = up.run_once()
            if delay > up.interval_s:
                failures += 1
                time.sleep(delay)
            now = time.perf_counter()
            if now - last >= 5 or delay == up.interval_s:
                _alerts, left = store.upload_backlog()
                done = args.rows - left
                print(f"  {done:>9} uploaded, {done / (now - t0):,.0f} rows/s, "
                      f"{failures} failed attempt(s)", flush=True)
                last = now
                if left == 0:
                    break
        elapsed = time.perf_counter() - t0
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        if prof is not None:
            prof.disable()
        fleet.stop()
        store.close()
    if prof is not None:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
    n, distinct = fleet.counts("aggregates")
    lost = args.rows - distinct
    duplicated = n - distinct
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    fleet_peak = children.ru_maxrss / 1024
    batches = -(-args.rows // args.batch)
    agent_cpu = (cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime) / batches
    fleet_cpu = (children.ru_utime + children.ru_stime) / batches  # incl. its start-up
    print(f"CPU per {args.batch}-row batch: agent {agent_cpu * 1000:.0f} ms, fleet process "
          f"{fleet_cpu * 1000:.0f} ms (a loaded machine stretches wall time, not CPU time)")
    print(f"fleet rows {n}, distinct {distinct}; drain {elapsed:.1f} s; "
          f"fleet peak RSS {fleet_peak:.0f} MB; load average {os.getloadavg()[0]:.2f}")
    print(f"rows_per_s={args.rows / elapsed:.0f} lost={lost} duplicated={duplicated} "
          f"peak_rss_mb={peak:.0f}")
    return 0 if lost == 0 and duplicated == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
