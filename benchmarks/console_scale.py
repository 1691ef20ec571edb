"""Console routes at fleet scale: 1,000 devices and 10 million aggregate rows on PostgreSQL.

Creates a fresh PostgreSQL database (dropped at the end unless ``--keep``), migrates it, and
loads it with COPY (the aggregates' secondary indexes are dropped for the load and built again
after it, then ``VACUUM ANALYZE``, as a bulk load is done):

* ``--devices`` devices (tags ``line=<k>``, ``site=<a|b>``) with a health summary each and two
  model status reports per stream (version 2 then 3, ``active``);
* ``--rows`` aggregates: ``--streams`` streams per device, one aggregate every ``--interval-s``
  seconds (default 300 s: 10,000 per stream is 35 days), time-ordered across devices as an
  ingesting fleet writes them;
* ``--alerts`` alerts spread over the devices and the same time span, one in ten acknowledged;
* ``--models`` versions of one package in the registry (a 4 KiB archive each), ``--rollouts``
  rollouts of them (each to one ``line=<k>`` tag, every tenth to every device, with a
  per-device row each, most ``active``) and ``--audit`` audit log entries over the same span.

Then it times the routes the console (``fleet/console/static/app.js``) calls, with the
console's query parameters, through the fleet's HTTP routes (the app in process, over ASGI, so
routing, validation and JSON encoding count), ``--repeat`` times each, on random devices. The
data end at a fixed time, so "now" in the console's parameters is that time:

* devices page: ``devices`` = ``GET /v1/devices`` (every device with its state and health),
  ``models_running`` = ``GET /v1/models/running``;
* device page: ``streams`` = ``GET /v1/devices/{id}/streams``, ``device_alerts`` =
  ``GET /v1/alerts?device=&limit=50``, ``device_models`` = ``GET /v1/devices/{id}/models?limit=50``,
  ``series_6h|24h|7d|28d`` = ``GET /v1/devices/{id}/series?stream=&since=&until=`` over the
  console's four zoom ranges ending at the newest score (default ``points``: 500);
* alerts page: ``alerts`` = ``GET /v1/alerts?limit=500``, ``alerts_device``, ``alerts_tag``,
  ``alerts_week`` (``since`` = now - 7 d), ``alerts_unacked`` (``acked=false``), each
  ``limit=500``;
* device page, the requests of its default plot: ``device_one`` = ``GET /v1/devices?device=``
  (the device's own state and health), ``series_extent`` = ``GET /v1/devices/{id}/series?
  stream=&points=10`` (the server's default range, the last 24 h before the real now: empty
  here, so mostly the data's extent, ``first_at``/``last_at``, and the newest alert's
  threshold), then ``series_all`` = the "all data" range ``since=first_at&until=last_at+1``;
* rollouts page: ``rollouts`` = ``GET /v1/rollouts`` (with the registry's ``GET /v1/models``,
  timed as ``models``), rollout page: ``rollout`` = ``GET /v1/rollouts/{id}`` of a random one;
* registry page: ``models`` and ``models_running``;
* audit page: ``audit`` = ``GET /v1/audit?limit=100``, ``audit_action`` (``action=`` one of the
  actions), ``audit_actor`` (``actor=``), ``audit_older`` (``before=`` a random entry id).

Prints p50/p99 per route (milliseconds); the last line is
``devices=<n> rows=<n> p99_ms_max=<ms> worst_route=<name>``. The 10 M load takes minutes on
two cores: run it once, under ``nice``; ``--rows 200000`` is a quick run::

    nice -n 10 python benchmarks/console_scale.py [--devices 1000] [--rows 10000000]
        [--streams 1] [--interval-s 300] [--alerts 100000] [--models 20]
        [--rollouts 100] [--audit 100000] [--repeat 50]
        [--pg "host=127.0.0.1 port=5432 user=postgres dbname=test"] [--keep] [--reuse DB]

``--keep`` keeps the loaded database (its name is printed) and ``--reuse DB`` measures again on
it without loading (give the same sizes), so the 10 M load is done once.

This is a benchmark, not a test: it needs PostgreSQL.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import random
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from fastapi.testclient import TestClient
from tqdm import tqdm

from fleet.app import create_app
from fleet.db import migrate, partitions
from fleet.db.engine import make_engine
from fleet.settings import Settings

END = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
ADMIN = "bench-" + "a" * 40
CHANNELS = json.dumps([{"channel": "vib_x", "count": 600, "min": -1.0, "max": 1.5,
                        "mean": 0.1, "std": 0.3}], separators=(",", ":"))


def _ts(t: float) -> str:
    return dt.datetime.fromtimestamp(t, tz=dt.UTC).isoformat()


def _copy(conn: psycopg.Connection[Any], sql: str, chunks: Iterator[str], total: int,
          what: str) -> None:
    with conn.cursor() as cur, cur.copy(sql) as copy, \
            tqdm(total=total, desc=what, unit="row", unit_scale=True, file=sys.stderr) as bar:
        for chunk in chunks:
            copy.write(chunk.encode())
            bar.update(chunk.count("\n"))


def _devices(n: int) -> list[str]:
    return [f"gw{i:04d}" for i in range(n)]


def load_health(conn: psycopg.Connection[Any], args: argparse.Namespace) -> None:
    """(Re)write every device's health summary (a ``--reuse`` run does it again: the data are
    from :data:`END`, so a fleet's retention would have removed them)."""
    devices = _devices(args.devices)
    streams = [f"s{k}" for k in range(args.streams)]
    now = _ts(END.timestamp())
    summary = json.dumps({"status": "green", "streams": [
        {"stream": s, "state": "green", "reason": None} for s in streams],
        "models": [{"stream": s, "name": "skab-wstat", "version": 3} for s in streams],
        "backlog_alerts": 0, "backlog_aggregates": 3, "agent_version": "0.9.1",
        "disk": {"used_bytes": 12345678, "budget_bytes": 1 << 30}, "reasons": []})
    conn.execute("DELETE FROM device_health")
    _copy(conn, "COPY device_health (device_id, status, state, summary, received_at, "
          "state_since) FROM STDIN",
          iter(["".join(f"{d}\tgreen\tonline\t{summary}\t{now}\t{now}\n"
                        for d in devices)]), len(devices), "health")


def load(dsn: str, args: argparse.Namespace) -> None:
    """Fill the migrated database at ``dsn`` (module docstring)."""
    devices = _devices(args.devices)
    streams = [f"s{k}" for k in range(args.streams)]
    per_stream = max(1, args.rows // (len(devices) * len(streams)))
    start = END.timestamp() - per_stream * args.interval_s
    now = _ts(END.timestamp())
    with psycopg.connect(dsn, autocommit=True) as conn:
        _copy(conn, "COPY devices (device_id, tags, created_at, last_seen, agent_version, "
              "model_name, model_version, backlog_alerts, backlog_aggregates) FROM STDIN",
              iter(["".join(
                  f'{d}\t["line={i % 20}", "site={"ab"[i % 2]}"]\t{now}\t{now}\t0.9.1\t'
                  f"skab-wstat\t3\t0\t{i % 50}\n" for i, d in enumerate(devices))]),
              len(devices), "devices")
        load_health(conn, args)
        reports = "".join(
            f"{d}\t{s}\tskab-wstat\t{v}\tactive\t{{}}\t{END.timestamp() - 86400 * (4 - v)}\t"
            f"{_ts(END.timestamp() - 86400 * (4 - v))}\n"
            for d in devices for s in streams for v in (2, 3))
        _copy(conn, "COPY model_status_reports (device_id, stream, name, version, state, "
              "details, at, received_at) FROM STDIN", iter([reports]),
              2 * len(devices) * len(streams), "status reports")
        indexes = conn.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'aggregates' "
            "AND indexname NOT IN ('pk_aggregates', 'uq_aggregates_id')").fetchall()
        for name, _ in indexes:
            conn.execute(f'DROP INDEX "{name}"')
        rng = random.Random(7)

        def aggregate_chunks() -> Iterator[str]:
            for i in range(per_stream):
                t = start + i * args.interval_s
                ms, ts = int(t * 1000), _ts(t)
                lines = []
                for d in devices:
                    for s in streams:
                        score = rng.random() * 2.0
                        alerts = 1 if score > 1.95 else 0
                        lines.append(f"{d}:{s}:{ms}\t{d}\t{s}\t{ts}\t{args.interval_s}\t600\t"
                                     f"{CHANNELS}\t{score:.4f}\t12\t{alerts}\t{ts}\n")
                yield "".join(lines)

        _copy(conn, "COPY aggregates (id, device_id, stream, interval_start, interval_s, "
              "count, channels, max_score, windows, alert_count, received_at) FROM STDIN",
              aggregate_chunks(), per_stream * len(devices) * len(streams), "aggregates")
        for name, ddl in indexes:
            t0 = time.perf_counter()
            # pg_indexes gives a partitioned table's index as "ON ONLY" (the parent alone,
            # invalid until each partition has one): build it on every partition
            conn.execute(ddl.replace(" ON ONLY ", " ON ", 1))
            print(f"index {name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)

        def alert_chunks() -> Iterator[str]:
            span = per_stream * args.interval_s
            lines = []
            for k in range(args.alerts):
                d, s = devices[k % len(devices)], streams[k % len(streams)]
                t = start + rng.random() * span
                payload = json.dumps({"schema": 1, "alert_id": f"{d}:{s}:{k}"})
                lines.append(f"{d}:{s}:{k}\t{d}\t{s}\t{k}\t{2 + rng.random():.3f}\t2.0\t"
                             f"{_ts(t)}\t{_ts(t + 10)}\t{_ts(t + 10)}\tskab-wstat\t3\t"
                             f"{payload}\t{_ts(t + 11)}\n")
                if len(lines) == 10_000:
                    yield "".join(lines)
                    lines = []
            yield "".join(lines)

        _copy(conn, "COPY alerts (id, device_id, stream, seq, score, threshold, window_start, "
              "window_end, raised_at, model_name, model_version, payload, received_at) "
              "FROM STDIN", alert_chunks(), args.alerts, "alerts")
        if conn.execute("SELECT to_regclass('alert_ids')").fetchone() != (None,):
            # partitioned alerts keep their ids unique in alert_ids (fleet.db.records)
            conn.execute("INSERT INTO alert_ids (id, device_id, window_start) "
                         "SELECT id, device_id, window_start FROM alerts")
        acks = "".join(f"{devices[k % len(devices)]}:{streams[k % len(streams)]}:{k}\tbench\t"
                       f"{now}\t\\N\n" for k in range(0, args.alerts, 10))
        _copy(conn, "COPY alert_acks (alert_id, acked_by, acked_at, note) FROM STDIN",
              iter([acks]), len(range(0, args.alerts, 10)), "acks")
        load_registry(conn, args)
        t0 = time.perf_counter()
        conn.execute("VACUUM ANALYZE")
        print(f"vacuum analyze: {time.perf_counter() - t0:.0f} s", file=sys.stderr)


#: COPY's NULL.
NULL = "\\N"
#: Audit actions the generated log uses (``audit_action`` filters by one of them).
AUDIT_ACTIONS = ("alert.ack", "rollout.create", "rollout.promote", "rollout.abort",
                 "model.push", "session.login", "device.tag")
#: Operators the generated log names (``audit_actor`` filters by one of them).
ACTORS = ("ada", "otto", "olga", "oscar", "vera")


def load_registry(conn: psycopg.Connection[Any], args: argparse.Namespace) -> None:
    """Packages, rollouts (with their per-device rows) and the audit log (module docstring)."""
    devices = _devices(args.devices)
    span = max(1, args.rows // (args.devices * args.streams)) * args.interval_s
    start = END.timestamp() - span
    rng = random.Random(13)
    blob = bytes(rng.randrange(256) for _ in range(4096))
    with conn.cursor() as cur:
        for v in range(1, args.models + 1):
            at = _ts(start + span * v / (args.models + 1))
            manifest = json.dumps({"name": "skab-wstat", "version": v,
                                   "description": f"SKAB pump model, retrained #{v}"})
            cur.execute(
                "INSERT INTO models (name, version, archive, archive_sha256, size, manifest, "
                "key_id, uploaded_at, uploaded_by) VALUES ('skab-wstat', %s, %s, %s, %s, %s, "
                "'ops', %s, 'otto')",
                (v, blob, hashlib.sha256(blob + bytes([v % 256])).hexdigest(), len(blob),
                 manifest, at))
    states = ("aborted", "promoted", "halted", "promoted", "canary", "paused")
    rollout_rows, member_rows = [], []
    for r in range(1, args.rollouts + 1):
        version = 1 + r % args.models
        at = _ts(start + span * r / (args.rollouts + 1))
        everyone = r % 10 == 0
        tag = None if everyone else f"line={r % 20}"
        targets = devices if everyone else [d for i, d in enumerate(devices) if i % 20 == r % 20]
        state = states[r % len(states)]
        reason = NULL if state != "halted" else "2 devices failed (halt after 2)"
        target_devices = json.dumps([] if tag else targets)
        rollout_rows.append(f"{r}\tskab-wstat\t{version}\t{tag or NULL}\t{target_devices}\t"
                            f"{NULL}\t10\t2\t{state}\t{NULL}\t{reason}\t{at}\t{at}\n")
        for k, d in enumerate(targets):
            dstate = "active" if k % 13 else "rejected"
            why = NULL if dstate == "active" else "self-test failed: score 3.1 over 2.0"
            member_rows.append(f"{r}\t{d}\t{'t' if k % 10 == 0 else 'f'}\tt\t{version - 1 or 1}"
                               f"\t{dstate}\t{why}\t{at}\t{at}\n")
    _copy(conn, "COPY rollouts (id, model_name, model_version, target_tag, target_devices, "
          "stream, canary_percent, halt_after_failures, state, resume_state, reason, "
          "created_at, updated_at) FROM STDIN", iter(["".join(rollout_rows)]), len(rollout_rows),
          "rollouts")
    conn.execute("SELECT setval(pg_get_serial_sequence('rollouts', 'id'), %s)",
                 (max(1, args.rollouts),))
    _copy(conn, "COPY rollout_devices (rollout_id, device_id, canary, assigned, "
          "previous_version, state, reason, reported_at, updated_at) FROM STDIN",
          iter(["".join(member_rows)]), len(member_rows), "rollout devices")

    def audit_chunks() -> Iterator[str]:
        lines = []
        for k in range(args.audit):
            at = _ts(start + span * k / max(1, args.audit))
            action = AUDIT_ACTIONS[k % len(AUDIT_ACTIONS)]
            target = devices[k % len(devices)] if action in ("alert.ack", "device.tag") else str(k)
            lines.append(f"{k + 1}\t{at}\t{ACTORS[k % len(ACTORS)]}\tsession\t{action}\t"
                         f"{target}\t10.0.{k % 250}.{k % 199}\t{{}}\n")
            if len(lines) == 10_000:
                yield "".join(lines)
                lines = []
        yield "".join(lines)

    _copy(conn, "COPY audit_log (id, at, actor, via, action, target, address, detail) "
          "FROM STDIN", audit_chunks(), args.audit, "audit")
    conn.execute("SELECT setval(pg_get_serial_sequence('audit_log', 'id'), %s)",
                 (max(1, args.audit),))


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(url: str, args: argparse.Namespace) -> tuple[float, str]:
    """Time the console's routes; prints one line per query, returns the largest p99 (ms) and
    the name of the route that had it."""
    devices = _devices(args.devices)
    rng = random.Random(11)
    with tempfile.TemporaryDirectory() as state:
        # the data end at END: no offline sweep and no retention may change them while measured
        settings = Settings(db_url=url, admin_token=ADMIN, state_dir=Path(state), pool_size=4,
                            offline_after_s=100 * 365 * 86400.0, status_retention_days=0,
                            retention_s={"health": 0.0, "webhook_deliveries": 0.0})
        engine = make_engine(settings)
        auth = {"Authorization": f"Bearer {ADMIN}"}
        end = int(END.timestamp())
        day = 86400

        def device() -> str:
            return rng.choice(devices)

        def series(hours: int) -> str:
            # the console's zoom: until = now, since = now - range, epoch seconds as floats
            return (f"/v1/devices/{device()}/series?stream=s0&since={end - hours * 3600.0}"
                    f"&until={float(end)}")

        week_ago = float(end - 7 * day)
        span = (args.rows // (args.devices * args.streams)) * args.interval_s
        first = float(end) - span  # the data's extent (aggregates up to END, see load)
        queries: dict[str, Any] = {
            "devices": lambda: "/v1/devices",
            "models_running": lambda: "/v1/models/running",
            "streams": lambda: f"/v1/devices/{device()}/streams",
            "device_alerts": lambda: f"/v1/alerts?device={device()}&limit=50",
            "device_models": lambda: f"/v1/devices/{device()}/models?limit=50",
            "device_one": lambda: f"/v1/devices?device={device()}",
            "series_extent": lambda: f"/v1/devices/{device()}/series?stream=s0&points=10",
            "series_all": lambda: (f"/v1/devices/{device()}/series?stream=s0&since={first}"
                                   f"&until={float(end) + 1}"),
            "series_6h": lambda: series(6),
            "series_24h": lambda: series(24),
            "series_7d": lambda: series(7 * 24),
            "series_28d": lambda: series(28 * 24),
            "alerts": lambda: "/v1/alerts?limit=500",
            "alerts_device": lambda: f"/v1/alerts?device={device()}&limit=500",
            "alerts_tag": lambda: f"/v1/alerts?tag=line%3D{rng.randrange(20)}&limit=500",
            "alerts_week": lambda: f"/v1/alerts?since={week_ago}&limit=500",
            "alerts_unacked": lambda: "/v1/alerts?acked=false&limit=500",
            "rollouts": lambda: "/v1/rollouts",
            "rollout": lambda: f"/v1/rollouts/{rng.randrange(1, args.rollouts + 1)}",
            "models": lambda: "/v1/models",
            "audit": lambda: "/v1/audit?limit=100",
            "audit_action": lambda: f"/v1/audit?limit=100&action={rng.choice(AUDIT_ACTIONS)}",
            "audit_actor": lambda: f"/v1/audit?limit=100&actor={rng.choice(ACTORS)}",
            "audit_older": lambda: f"/v1/audit?limit=100&before={rng.randrange(2, args.audit + 2)}",
        }
        worst, worst_name = 0.0, ""
        with TestClient(create_app(settings, engine)) as client:
            for name, make in queries.items():
                for _ in range(3):  # warm the connection pool and caches
                    client.get(make(), headers=auth)
                times = []
                for _ in range(args.repeat):
                    path = make()
                    t0 = time.perf_counter()
                    resp = client.get(path, headers=auth)
                    times.append((time.perf_counter() - t0) * 1000)
                    if resp.status_code != 200:
                        raise SystemExit(f"{path}: HTTP {resp.status_code} {resp.text[:200]}")
                p50, p99 = statistics.median(times), _pct(times, 0.99)
                if p99 >= worst:
                    worst, worst_name = p99, name
                size = len(resp.content)
                print(f"{name:14s} p50_ms={p50:7.1f} p99_ms={p99:7.1f} (n={len(times)}, "
                      f"last answer {size} bytes)")
        engine.dispose()
    return worst, worst_name


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=1000)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--streams", type=int, default=1)
    parser.add_argument("--interval-s", type=float, default=300.0)
    parser.add_argument("--alerts", type=int, default=100_000)
    parser.add_argument("--models", type=int, default=20)
    parser.add_argument("--rollouts", type=int, default=100)
    parser.add_argument("--audit", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--pg", default="host=127.0.0.1 port=5432 user=postgres dbname=test")
    parser.add_argument("--keep", action="store_true", help="keep the database")
    parser.add_argument("--reuse", metavar="DB",
                        help="measure only, on a database a --keep run loaded (same sizes)")
    args = parser.parse_args()
    name = args.reuse or f"console_scale_{secrets.token_hex(4)}"
    admin = psycopg.connect(args.pg, autocommit=True)
    if not args.reuse:
        admin.execute(f'CREATE DATABASE "{name}"')
    params = psycopg.conninfo.conninfo_to_dict(args.pg)
    dsn = psycopg.conninfo.make_conninfo(args.pg, dbname=name)
    user, host = params.get("user", "postgres"), params.get("host", "127.0.0.1")
    url = f"postgresql+psycopg://{user}@{host}:{params.get('port', 5432)}/{name}"
    try:
        engine = make_engine(Settings(db_url=url, admin_token=ADMIN))
        migrate.upgrade(engine)
        if not args.reuse:
            # the data end at END, not now: create their periods' partitions as a serving
            # fleet would have (else every row lands in the DEFAULT partition)
            span = (args.rows // (args.devices * args.streams)) * args.interval_s
            with engine.begin() as conn:
                for spec in partitions.SPECS.values():
                    if partitions.is_partitioned(conn, spec.table):
                        partitions.ensure(conn, spec, END - dt.timedelta(seconds=span), END)
        engine.dispose()
        if not args.reuse:
            t0 = time.perf_counter()
            load(dsn, args)
            print(f"loaded {name} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        else:
            with psycopg.connect(dsn, autocommit=True) as conn:
                load_health(conn, args)
        worst, worst_name = measure(url, args)
        total = (args.rows // (args.devices * args.streams)) * args.devices * args.streams
        print(f"devices={args.devices} rows={total} p99_ms_max={worst:.1f} "
              f"worst_route={worst_name}")
    finally:
        if not args.keep and not args.reuse:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
