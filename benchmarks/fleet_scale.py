"""Fleet simulation: devices against 2 ``edge-fleet serve`` replicas on one PostgreSQL, the
console's queries on a large aggregates table, a retraining burst across 2 ``edge-fleet worker``.

Everything runs on this machine: a fresh PostgreSQL database (dropped at the end), two replicas
(``serve --workers 1`` each, own port and state folder, one admin token), the load generator,
then two workers. Three parts:

1. **Devices** (``--devices 1000,5000,10000``). A simulated device sends what the agent's
   defaults make a gateway send (``agent/services``, ``cloud_sync``): per simulated minute one
   ingest batch (``POST /v1/ingest``: schema 3, the minute's aggregate of each of ``--streams``
   streams as columns, no alerts, gzip level 6 with ``Content-Encoding: gzip``, as
   ``cloud_sync.client`` encodes it; the uploader sends the aggregates closed at the minute
   in one batch), one health summary every ``--health-s`` (``fleet.health_interval_s``,
   default 60 s: streams, models, backlog and disk, plain JSON), and one assignment poll
   per stream every ``--poll-s`` (``updater.poll_interval_s``, default 300 s, ±10 % jitter:
   ``GET /v1/models/assignment?stream=<stream>``). A device's batches and health reports are
   spread evenly over the minute across devices (gateways are not synchronised), its polls
   start at a random time; device ``i`` talks to replica ``i % 2`` (a round-robin load
   balancer). ``--minute-s`` is the wall-clock length of a simulated minute: 60 (the
   default) is real time; less compresses time (the same traffic in less wall time: a higher
   request rate than the real fleet's). ``--minutes`` minutes are run per device count; the
   first is warm-up (token caches, connection pools) and not counted. The load is
   open-loop: each request has a scheduled time and its latency runs from that time to the
   end of its response, so a server (or a client connection pool) that falls behind shows
   as latency, not as a lower rate. Once a device count's p99 is over ``--give-up-ms``
   (saturated) the larger counts are not run (printed as such). The client keeps
   ``--connections`` keep-alive connections per replica (a gateway has its own; the
   server's work per request is the same; a response with ``Connection: close`` makes it
   open a new one, and a connection the server drops counts as an error). CPU per request:
   CPU time (from ``/proc``) of the replicas' processes, and of the PostgreSQL backends of
   the benchmark's database, over all requests sent for the device count (warm-up
   included). A second line per device count says where the tail is (:func:`tail_summary`:
   how the requests over the p99 bunch in time, the wait for a free client connection, the
   load generator's own loop lag); ``--trace DIR`` writes every request's due, sent and end
   times and the loop lag to CSV files.
2. **Console queries on ``--rows`` aggregates** (default 100,000,000). Generated in PostgreSQL
   with ``INSERT ... SELECT generate_series`` in chunks of ``--chunk-rows`` (a progress bar on
   stderr): 1,000 devices x ``--streams`` streams, one row per minute, oldest first, ending now
   (the weekly partitions of the range are created first, as the serving process does ahead of
   time; the table's keys and indexes are dropped for the load and rebuilt from their catalog
   definitions after it; ``--rows-budget-s`` stops inserting after that many seconds and
   measures the rows so far), then ``VACUUM ANALYZE``. Then ``--queries`` of each console
   read, in process through :mod:`fleet.db` (no HTTP): a device/stream/1-hour range
   (``RecordStore.aggregates``, the device API), and the plot (``ConsoleQueries.series``, 500
   points) over one day and over a week (both downsampled in the database).
3. **Retraining burst**: ``--jobs`` jobs (one per device stream with uploaded calibration
   samples) enqueued at once, drained by 2 ``edge-fleet worker`` processes running real
   retrainings (train, INT8, gate, sign, publish; about a second each on a free core: there is
   no fast job mode). Lost: a job not ended (done, gated or failed) by ``--jobs-timeout``.
   Duplicated: a job published more than once (worker logs), or more published versions than
   done jobs.

The last line: ``p99_ms_10000=<ms or n/a> query_p99_ms=<ms> jobs_lost=<n>
jobs_duplicated=<n>`` (``p99_ms_10000`` is the p99 at 10,000 devices; a part not run
prints n/a).

Usage::

    python3 benchmarks/fleet_scale.py [--devices 1000,5000,10000] [--minutes 2] [--minute-s 60]
        [--poll-s 300] [--health-s 60] [--rows 100000000] [--queries 200] [--jobs 500]
        [--rows-budget-s S] [--pg "host=... user=... dbname=test"] [--port N] [--workdir DIR]
        [--log FILE] [--trace DIR]

Takes long at full scale (about 40 minutes and 53 GB of disk for 100 M rows on a shared 2-core
VM; 500 real retrainings take minutes): see docs/fleet-scale.md. ``--log FILE`` keeps the
whole report (``benchmarks/results.py`` records only the last line).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import gzip
import json
import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import requests
from tqdm import tqdm
from workspace import add_arguments, free_port, pick_port, workspace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cloud_sync.client import columns_batch_json  # noqa: E402
from cloud_sync.health import DiskUse, HealthSummary, ModelHealth, StreamHealth  # noqa: E402
from cloud_sync.package import generate_keypair  # noqa: E402
from cloud_sync.protocol import (  # noqa: E402
    SCHEMA_VERSION,
    AggregateColumns,
    IngestBatch,
    SampleBatch,
)
from fleet.db.console_queries import ConsoleQueries  # noqa: E402
from fleet.db.devices import hash_token  # noqa: E402
from fleet.db.engine import make_engine  # noqa: E402
from fleet.db.partitions import SPECS, ensure  # noqa: E402
from fleet.db.records import RecordStore, TimeQuery  # noqa: E402
from fleet.db.samples import SampleStore  # noqa: E402
from fleet.jobs.queue import JobQueue  # noqa: E402
from fleet.settings import Settings  # noqa: E402

ADMIN_TOKEN = "bench-admin-" + "x" * 40
TICK = os.sysconf("SC_CLK_TCK")
QUERY_DEVICES = 1000
BASE_MODEL = ROOT / "models" / "skab-wstat"


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))] if s else float("nan")


# --- CPU time from /proc ------------------------------------------------------------------------

def _cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def _descendants(pids: list[int]) -> list[int]:
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent[int(entry.name)] = int(
                    (entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    out, todo = list(pids), list(pids)
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


class CpuMeter:
    """CPU seconds of the replicas (and their children) and of the database's backends."""

    def __init__(self, replica_pids: list[int], pg: psycopg.Connection[Any], dbname: str) -> None:
        self._replicas = replica_pids
        self._pg = pg
        self._db = dbname

    def _backends(self) -> list[int]:
        rows = self._pg.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s",
                                (self._db,)).fetchall()
        return [int(r[0]) for r in rows]

    def sample(self) -> dict[str, dict[int, float]]:
        return {"fleet": {p: _cpu_s(p) for p in _descendants(self._replicas)},
                "pg": {p: _cpu_s(p) for p in self._backends()}}

    @staticmethod
    def delta(before: dict[str, dict[int, float]], after: dict[str, dict[int, float]]
              ) -> dict[str, float]:
        return {k: sum(v - before[k].get(p, 0.0) for p, v in after[k].items()) for k in after}


# --- part 1: devices ----------------------------------------------------------------------------

@dataclass
class Tally:
    latencies: dict[str, list[float]] = field(default_factory=lambda: {
        "ingest": [], "health": [], "poll": []})
    errors: list[str] = field(default_factory=list)
    sent: int = 0  # requests sent, warm-up included (the CPU is measured over all of them)
    #: (due, written, ended, kind, replica, counted) of every request, perf_counter seconds
    trace: list[tuple[float, float, float, str, int, bool]] = field(default_factory=list)
    #: (at, lag s, CPU s) of the load generator's loop: a 5 ms sleep's lateness, its CPU time
    lags: list[tuple[float, float, float]] = field(default_factory=list)


@dataclass(frozen=True)
class DeviceShape:
    """What one simulated device sends (the agent's defaults; module docstring)."""

    streams: int = 2
    health_s: float = 60.0  # simulated seconds between two health reports
    poll_s: float = 300.0  # simulated seconds between two polls of one stream
    channels: tuple[str, ...] = ()


def _request(port: int, method: str, path: str, token: str, body: bytes = b"",
             gzipped: bool = False) -> bytes:
    head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Authorization: Bearer {token}\r\nAccept: application/json\r\n")
    if method == "POST":
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        if gzipped:
            head += "Content-Encoding: gzip\r\n"
    return (head + "\r\n").encode("ascii") + body


async def _response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    """``(status, body, close)``: ``close`` when the server ends the connection after it
    (``Connection: close``)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length, close = 0, False
    for line in lines[1:]:
        name, _, value = line.partition(":")
        name = name.strip().lower()
        if name == "content-length":
            length = int(value)
        elif name == "connection":
            close = value.strip().lower() == "close"
    return int(lines[0].split(" ", 2)[1]), await reader.readexactly(length), close


def _ingest_json(device: str, shape: DeviceShape, minute: float, now: float) -> bytes:
    """The agent's upload of one minute before gzip: schema 3, aggregates as columns
    (:func:`cloud_sync.client.columns_batch_json`); sent with gzip level 6
    (``FleetConfig.gzip_level``)."""
    streams = [f"s{s}" for s in range(shape.streams)]
    channels = json.dumps([{"channel": c, "count": 600, "min": -1.0, "max": 1.0, "mean": 0.01,
                            "std": 0.2} for c in shape.channels], separators=(",", ":"))
    columns = AggregateColumns(
        ids=[f"{device}:{s}:{int(minute * 1000)}" for s in streams], streams=streams,
        interval_start=[minute] * len(streams), interval_s=[60.0] * len(streams),
        count=[600] * len(streams), channels=[channels] * len(streams),
        max_score=[0.4] * len(streams), windows=[12] * len(streams),
        alert_count=[0] * len(streams))
    header = IngestBatch.model_validate({
        "schema": SCHEMA_VERSION, "device_id": device, "sent_at": now,
        "agent_version": "bench", "model": {"name": "skab-wstat", "version": 1},
        "backlog": {"alerts": 0, "aggregates": 0}, "records": []})
    return columns_batch_json(header, [], columns.model_dump_json())


def _health_json(device: str, shape: DeviceShape, now: float) -> bytes:
    """The agent's health summary (:func:`agent.services.health_reporter.summarize`)."""
    streams = [f"s{s}" for s in range(shape.streams)]
    return HealthSummary(
        device_id=device, at=now, status="green", agent_version="bench",
        streams=[StreamHealth(stream=s, state="green") for s in streams],
        models=[ModelHealth(stream=s, name="skab-wstat", version=1) for s in streams],
        disk=DiskUse(used_bytes=12_345_678, budget_bytes=512 * 1024 * 1024),
    ).model_dump_json().encode()


_DEV, _MINUTE, _NOW = "zzdevicezz", 1111111111.0, 2222222222.5


class Bodies:
    """The device requests' bodies from templates: one pydantic-built body per kind with
    placeholder device, minute and clock, then the placeholders substituted per request (the
    load generator shares the replicas' cores: building every body through pydantic cost it
    about a quarter of a millisecond per request). The substitution is checked against a
    pydantic-built body once (``RuntimeError`` when they differ)."""

    def __init__(self, shape: DeviceShape) -> None:
        self._ingest = _ingest_json(_DEV, shape, _MINUTE, _NOW)
        self._health = _health_json(_DEV, shape, _NOW)
        minute, now = 1_790_000_040.0, 1_790_000_051.25
        if (json.loads(self._ingest_json("bench00007", minute, now))
                != json.loads(_ingest_json("bench00007", shape, minute, now))
                or json.loads(self._health_json("bench00007", now))
                != json.loads(_health_json("bench00007", shape, now))):
            raise RuntimeError("body templates differ from the pydantic-built bodies")

    def _ingest_json(self, device: str, minute: float, now: float) -> bytes:
        return (self._ingest.replace(_DEV.encode(), device.encode())
                .replace(b"%d" % int(_MINUTE * 1000), b"%d" % int(minute * 1000))
                .replace(repr(_MINUTE).encode(), repr(minute).encode())
                .replace(repr(_NOW).encode(), repr(now).encode()))

    def _health_json(self, device: str, now: float) -> bytes:
        return (self._health.replace(_DEV.encode(), device.encode())
                .replace(repr(_NOW).encode(), repr(now).encode()))

    def ingest(self, device: str, minute: float) -> bytes:
        """The gzip body of ``device``'s batch of the simulated ``minute`` (epoch s)."""
        return gzip.compress(self._ingest_json(device, minute, time.time()), compresslevel=6,
                             mtime=0)

    def health(self, device: str) -> bytes:
        """``device``'s health summary (plain JSON)."""
        return self._health_json(device, time.time())


def schedule(devices: list[str], shape: DeviceShape, minutes: int, minute_s: float,
             start: float, rng: random.Random) -> list[tuple[float, str, str, int, int]]:
    """``(due, kind, device, minute number, stream)`` of every request, by due time."""
    n, scale, span = len(devices), minute_s / 60.0, minutes * minute_s
    out = []
    for i, d in enumerate(devices):
        phase = i / n
        for m in range(minutes):
            out.append((start + minute_s * (m + phase), "ingest", d, m, 0))
        t = minute_s * ((phase + 0.5) % 1.0)
        while t < span:
            out.append((start + t, "health", d, int(t // minute_s), 0))
            t += shape.health_s * scale
        for s in range(shape.streams):
            t = rng.uniform(0.0, shape.poll_s * scale)
            while t < span:
                out.append((start + t, "poll", d, int(t // minute_s), s))
                t += shape.poll_s * scale * rng.uniform(0.9, 1.1)
    out.sort()
    return out


async def _run_minutes(ports: list[int], tokens: dict[str, str], shape: DeviceShape,
                       minutes: int, minute_s: float, first_minute: float, connections: int,
                       tally: Tally) -> None:
    """Open-loop schedule of ``minutes`` simulated minutes; latencies of minute 0 not kept."""
    devices = list(tokens)
    bodies = Bodies(shape)
    queues: list[asyncio.Queue[tuple[float, str, str, int, int] | None]] = [
        asyncio.Queue() for _ in ports]

    async def conn_worker(r: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", ports[r])
        idle_since = time.perf_counter()
        try:
            while (item := await queues[r].get()) is not None:
                due, kind, device, minute_no, stream = item
                token = tokens[device]
                if kind == "ingest":
                    req = _request(ports[r], "POST", "/v1/ingest", token, bodies.ingest(
                        device, first_minute + 60.0 * minute_no), gzipped=True)
                elif kind == "health":
                    req = _request(ports[r], "POST", "/v1/devices/self/health", token,
                                   bodies.health(device))
                else:
                    req = _request(ports[r], "GET", f"/v1/models/assignment?stream=s{stream}",
                                   token)
                written = time.perf_counter()
                tally.sent += 1
                try:
                    writer.write(req)
                    status, content, close = await _response(reader)
                except (asyncio.IncompleteReadError, ConnectionError) as exc:
                    # a failed request (counted as an error, no latency); a new connection
                    tally.errors.append(f"{kind}: connection lost ({type(exc).__name__}) "
                                        f"{written - idle_since:.1f} s after its previous "
                                        f"response, {written - due:.3f} s after due")
                    writer.close()
                    reader, writer = await asyncio.open_connection("127.0.0.1", ports[r])
                    idle_since = time.perf_counter()
                    continue
                ended = idle_since = time.perf_counter()
                if close:  # the server ends this connection: open another, as a client does
                    writer.close()
                    reader, writer = await asyncio.open_connection("127.0.0.1", ports[r])
                tally.trace.append((due, written, ended, kind, r, minute_no > 0))
                if minute_no > 0:
                    tally.latencies[kind].append(ended - due)
                if status not in (200, 204):
                    tally.errors.append(f"{kind} {status} {content[:160]!r}")
        finally:
            writer.close()

    async def lag_monitor() -> None:
        while True:
            t, cpu = time.perf_counter(), time.process_time()
            await asyncio.sleep(0.005)
            now = time.perf_counter()
            tally.lags.append((now, now - t - 0.005, time.process_time() - cpu))

    monitor = asyncio.create_task(lag_monitor())
    route = {d: i % len(ports) for i, d in enumerate(devices)}
    workers = [asyncio.create_task(conn_worker(r)) for r in range(len(ports))
               for _ in range(connections)]
    # perf_counter, not loop.time(): uvloop's clock has 1 ms steps and is read once per loop pass
    plan = schedule(devices, shape, minutes, minute_s, time.perf_counter() + 1.0,
                    random.Random(3))
    for due, kind, device, m, stream in plan:
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        queues[route[device]].put_nowait((due, kind, device, m, stream))
    for q in queues:
        for _ in range(connections):
            q.put_nowait(None)
    await asyncio.gather(*workers)
    monitor.cancel()


def tail_summary(tally: Tally, p99_s: float) -> str:
    """Where the counted requests' tail is: in how many one-second slots of their due times the
    requests over the p99 fall (a stall bunches them; a slow handler spreads them), the time
    requests waited for a free client connection, and the load generator's own loop lag (the
    lateness of a 5 ms sleep: when it is large, the load generator was waiting for a core
    and its latencies include that)."""
    counted = [t for t in tally.trace if t[5]]
    if not counted:
        return "tail: no counted requests"
    start = min(t[0] for t in counted)
    slots = {int(t[0] - start) for t in counted}
    slow: dict[int, int] = {}
    for t in counted:
        if t[2] - t[0] > p99_s:
            slow[int(t[0] - start)] = slow.get(int(t[0] - start), 0) + 1
    waits = [1000 * (t[1] - t[0]) for t in counted]
    lags = [1000 * lag for _, lag, _ in tally.lags]
    worst = max(slow.values(), default=0)
    return (f"tail: the {sum(slow.values())} requests over the p99 fall in {len(slow)} of "
            f"{len(slots)} seconds (at most {worst} in one); waiting for a free client "
            f"connection p99 {percentile(waits, 99):.1f} ms; load generator loop lag p99 "
            f"{percentile(lags, 99):.1f} ms, max {max(lags, default=0.0):.1f} ms")


def _loop_factory() -> Any:
    """uvloop's event loop when installed (``uvicorn[standard]`` brings it; the replicas run on
    it too): a cheaper load generator leaves more of the shared cores to the replicas."""
    try:
        import uvloop  # noqa: PLC0415
    except ImportError:
        return None
    return uvloop.new_event_loop


def enroll_direct(pg: psycopg.Connection[Any], names: list[str]) -> dict[str, str]:
    """Enroll devices straight into the database (as ``POST /v1/devices`` stores them)."""
    tokens = {d: secrets.token_urlsafe(32) for d in names}
    with pg.cursor() as cur, cur.copy(
            "COPY devices (device_id, token_hash, tags, created_at) FROM STDIN") as copy:
        now = dt.datetime.now(dt.UTC)
        for d, t in tokens.items():
            copy.write_row((d, hash_token(t), "[]", now))
    pg.commit()
    return tokens


# --- part 2: the console's queries --------------------------------------------------------------

def _drop_keys(pg: psycopg.Connection[Any], table: str) -> list[str]:
    """Drop ``table``'s constraints (primary, unique, foreign keys) and other indexes; returns
    the statements that recreate them exactly (from the catalog), constraints first."""
    cons = pg.execute(
        "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = "
        "%s::regclass AND contype IN ('p', 'u', 'f') ORDER BY contype DESC, conname",
        (table,)).fetchall()
    idx = pg.execute(
        "SELECT c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i JOIN pg_class c ON "
        "c.oid = i.indexrelid WHERE i.indrelid = %s::regclass AND NOT EXISTS (SELECT 1 FROM "
        "pg_constraint k WHERE k.conindid = i.indexrelid) ORDER BY c.relname",
        (table,)).fetchall()
    for name, _ in cons:
        pg.execute(f'ALTER TABLE "{table}" DROP CONSTRAINT "{name}"')
    for name, _ in idx:
        pg.execute(f'DROP INDEX "{name}"')
    pg.commit()
    return ([f'ALTER TABLE "{table}" ADD CONSTRAINT "{n}" {d}' for n, d in cons]
            + [d.replace(" ON ONLY ", " ON ", 1) for _, d in idx])


def generate_rows(pg: psycopg.Connection[Any], engine: Any, rows: int, streams: int,
                  chunk_rows: int, budget_s: float) -> tuple[dt.datetime, dt.datetime]:
    """``rows`` aggregates of :data:`QUERY_DEVICES` devices, one per minute and stream, oldest
    first, ending at the current minute; returns the time range of the rows generated.

    The table's keys and indexes are dropped first and rebuilt from the catalog's definitions
    after the load (one sorted build each instead of 100 M index insertions). Generation stops
    after ``budget_s`` seconds of inserting (the rows so far are kept and measured: the caller
    prints the count)."""
    per_minute = QUERY_DEVICES * streams
    minutes = max(1, rows // per_minute)
    end = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0)
    start = end - dt.timedelta(minutes=minutes)
    with engine.begin() as conn:
        ensure(conn, SPECS["aggregates"], start, end)
    rebuild = _drop_keys(pg, "aggregates")
    step = max(1, chunk_rows // per_minute)
    sql = (
        "INSERT INTO aggregates (id, device_id, stream, interval_start, interval_s, count, "
        "channels, max_score, windows, alert_count, received_at) "
        "SELECT 'bench' || lpad(d::text, 5, '0') || ':s' || s || ':' || "
        "(extract(epoch FROM t) * 1000)::bigint, 'bench' || lpad(d::text, 5, '0'), 's' || s, "
        "t, 60, 600, %(ch)s::jsonb, random(), 12, (random() < 0.01)::int, t "
        "FROM generate_series(%(a)s::timestamptz, %(b)s::timestamptz, interval '1 minute') t, "
        "generate_series(0, %(nd)s - 1) d, generate_series(0, %(ns)s - 1) s")
    channels = json.dumps([{"channel": f"ch{c}", "count": 600, "min": -1.0, "max": 1.0,
                            "mean": 0.01, "std": 0.2} for c in range(2)])
    last = start
    t0 = time.perf_counter()
    with tqdm(total=minutes * per_minute, unit="row", unit_scale=True, file=sys.stderr,
              desc="aggregates") as bar:
        for m in range(0, minutes, step):
            a = start + dt.timedelta(minutes=m)
            b = start + dt.timedelta(minutes=min(minutes, m + step) - 1)
            n = pg.execute(sql, {"a": a, "b": b, "nd": QUERY_DEVICES, "ns": streams,
                                 "ch": channels}).rowcount
            pg.commit()
            bar.update(n)
            last = b + dt.timedelta(minutes=1)
            if time.perf_counter() - t0 > budget_s:
                print(f"generation stopped after {budget_s:.0f} s (--rows-budget-s)",
                      file=sys.stderr, flush=True)
                break
    print(f"inserted in {time.perf_counter() - t0:.0f} s", flush=True)
    pg.execute("SET maintenance_work_mem = '1GB'")
    for stmt in rebuild:
        t = time.perf_counter()
        pg.execute(stmt)
        pg.commit()
        print(f"{stmt[:90]}: {time.perf_counter() - t:.0f} s", flush=True)
    pg.autocommit = True
    t = time.perf_counter()
    pg.execute("VACUUM ANALYZE aggregates")
    pg.autocommit = False
    print(f"VACUUM ANALYZE {time.perf_counter() - t:.0f} s", flush=True)
    return start, last


def run_queries(engine: Any, start: dt.datetime, end: dt.datetime, streams: int, n: int
                ) -> dict[str, list[float]]:
    rng = random.Random(1)
    store, console = RecordStore(engine), ConsoleQueries(engine)
    out: dict[str, list[float]] = {"range_1h": [], "plot_1d": [], "plot_7d": []}
    span = (end - start).total_seconds()
    for _ in range(n):
        dev = f"bench{rng.randrange(QUERY_DEVICES):05d}"
        stream = f"s{rng.randrange(streams)}"
        for kind, width in (("range_1h", 3600), ("plot_1d", 86400), ("plot_7d", 7 * 86400)):
            lo = start + dt.timedelta(seconds=rng.uniform(0, max(0.0, span - width)))
            hi = lo + dt.timedelta(seconds=width)
            t = time.perf_counter()
            if kind == "range_1h":
                store.aggregates(TimeQuery(dev, stream, lo, hi, limit=1000))
            else:
                console.series(dev, stream, lo, hi, 500)
            out[kind].append(time.perf_counter() - t)
    return out


# --- part 3: retraining burst -------------------------------------------------------------------

def run_jobs(url: str, engine: Any, state: Path, env: dict[str, str], cmd: list[str],
             key: Path, keydir: Path, jobs: int, timeout_s: float) -> tuple[int, int, str]:
    """Enqueue ``jobs`` retrainings, drain them with 2 workers; returns (lost, duplicated,
    summary)."""
    manifest = json.loads((BASE_MODEL / "manifest.json").read_text())
    channels = manifest["input"]["channels"]
    store, queue = SampleStore(engine), JobQueue(engine)
    rng = np.random.default_rng(7)
    now = dt.datetime.now(dt.UTC)
    ids = []
    for j in range(jobs):
        device = f"bench{j:05d}"
        level = rng.uniform(0.5, 90.0, len(channels))
        noise = rng.uniform(0.01, 0.5, len(channels)) * level / 10
        t = np.arange(400)[:, None]
        windows = level + noise * (rng.normal(size=(400, len(channels)))
                                   + 0.5 * np.sin(t / 17.0))
        store.add(SampleBatch.model_validate({
            "device_id": device, "stream": "pump", "channels": channels,
            "config_hash": "bench", "sample_rate_hz": 1.0, "kind": "calibration",
            "model": {"name": "skab-wstat", "version": 1}, "windows": [windows.tolist()]}), now)
    t0 = time.perf_counter()
    for j in range(jobs):
        ids.append(queue.enqueue(f"bench{j:05d}", "pump").id)
    logs = [state / f"worker{n}.log" for n in (1, 2)]
    procs = []
    for n, log in enumerate(logs, 1):
        with log.open("wb") as out:
            procs.append(subprocess.Popen(
                [*cmd, "worker", "--db", url, "--state-dir", str(state / f"worker{n}"),
                 "--signing-key", str(key), "--trusted-keys", str(keydir), "--poll", "0.2",
                 ], stdout=out, stderr=subprocess.STDOUT, env=env))
    ended: dict[str, int] = {}
    try:
        deadline = time.monotonic() + timeout_s
        with tqdm(total=jobs, unit="job", file=sys.stderr, desc="retraining") as bar:
            while time.monotonic() < deadline:
                ended = {}
                for job in queue.list(limit=jobs + 10):
                    if job.state in ("done", "gated", "failed"):
                        ended[job.state] = ended.get(job.state, 0) + 1
                bar.update(sum(ended.values()) - bar.n)
                if sum(ended.values()) >= jobs or any(p.poll() is not None for p in procs):
                    break
                time.sleep(1.0)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    wall = time.perf_counter() - t0
    published: dict[str, int] = {}
    for log in logs:
        for m in re.finditer(r"job (\d+): published", log.read_text(errors="replace")):
            published[m.group(1)] = published.get(m.group(1), 0) + 1
    with engine.connect() as conn:
        versions = conn.exec_driver_sql("SELECT count(*) FROM models WHERE name = 'skab-wstat'"
                                        ).scalar_one()
    done = ended.get("done", 0)
    lost = jobs - sum(ended.values())
    duplicated = sum(c - 1 for c in published.values()) + max(0, int(versions) - done)
    summary = (f"{jobs} jobs in {wall:.0f} s ({jobs / wall:.2f} jobs/s) across 2 workers: "
               f"{ended}; published versions {versions}")
    return lost, duplicated, summary


# --- main ---------------------------------------------------------------------------------------

def _start_replica(cmd: list[str], url: str, port: int, state: Path, token_file: Path,
                   keydir: Path, name: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    state.mkdir(parents=True, exist_ok=True)
    with (state / "serve.log").open("wb") as out:
        return subprocess.Popen(
            [*cmd, "serve", "--db", url, "--port", str(port), "--state-dir", str(state),
             "--admin-token-file", str(token_file), "--replica-id", name,
             "--trusted-keys", str(keydir), "--pool-size", "8", "--log-level", "warning"],
            stdout=out, stderr=subprocess.STDOUT, env=env)


def _wait_healthy(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 90
    while True:
        try:
            if requests.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200:
                return
        except requests.RequestException:  # not listening yet, or slow to answer under load
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"replica on {port} did not start:\n{log.read_text()}")
        time.sleep(0.2)


class _Tee:
    """A text stream writing to two (``--log``)."""

    def __init__(self, first: Any, second: Any) -> None:
        self._streams = (first, second)

    def write(self, text: str) -> int:
        for stream in self._streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self._streams:
            stream.flush()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", default="1000,5000,10000", help="device counts, comma-separated")
    ap.add_argument("--minutes", type=int, default=2, help="simulated minutes per device count "
                    "(the first is warm-up)")
    ap.add_argument("--minute-s", type=float, default=60.0,
                    help="wall seconds per simulated minute (60: real time; less compresses)")
    ap.add_argument("--give-up-ms", type=float, default=5000.0,
                    help="skip the larger device counts once a p99 is over this (saturated)")
    ap.add_argument("--streams", type=int, default=2, help="streams per device")
    ap.add_argument("--poll-s", type=float, default=300.0,
                    help="simulated seconds between two assignment polls of one stream (the "
                         "agent's updater.poll_interval_s; default 300)")
    ap.add_argument("--health-s", type=float, default=60.0,
                    help="simulated seconds between two health reports (the agent's "
                         "fleet.health_interval_s; default 60)")
    ap.add_argument("--connections", type=int, default=32, help="client connections per replica")
    ap.add_argument("--rows", type=int, default=100_000_000)
    ap.add_argument("--chunk-rows", type=int, default=1_000_000)
    ap.add_argument("--rows-budget-s", type=float, default=float("inf"),
                    help="stop inserting aggregates after this many seconds and measure the "
                         "rows generated so far (printed)")
    ap.add_argument("--queries", type=int, default=200, help="queries of each console read")
    ap.add_argument("--jobs", type=int, default=500)
    ap.add_argument("--jobs-timeout", type=float, default=3600.0)
    ap.add_argument("--pg", default="host=127.0.0.1 port=5432 user=postgres dbname=test")
    add_arguments(ap, port_help="port of the first replica (the second: a free one)")
    ap.add_argument("--log", type=Path, help="also append everything printed on stdout to this "
                    "file (results.py keeps only the last line)")
    ap.add_argument("--trace", type=Path, help="write every request's times and the load "
                    "generator's loop lag to CSV files in this folder")
    args = ap.parse_args(argv)
    if args.log is not None:
        sys.stdout = _Tee(sys.stdout, args.log.open("a", encoding="utf-8"))
    counts = [int(x) for x in args.devices.split(",") if x.strip()]
    if not (args.poll_s > 0 and args.health_s > 0 and args.streams > 0):
        ap.error("--poll-s, --health-s and --streams must be positive")

    dbname = f"fleet_scale_{secrets.token_hex(4)}"
    admin = psycopg.connect(args.pg, autocommit=True)
    admin.execute(f'CREATE DATABASE "{dbname}"')
    try:
        with workspace(args.workdir, "fleet-scale-") as state:
            return run(args, counts, admin, dbname, state)
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        admin.close()


def run(args: argparse.Namespace, counts: list[int], admin: psycopg.Connection[Any],
        dbname: str, state: Path) -> int:
    info = admin.info
    url = f"postgresql+psycopg://{info.user}@{info.host}:{info.port}/{dbname}"
    engine = make_engine(Settings(db_url=url, admin_token=ADMIN_TOKEN, pool_size=2))
    token_file = state / "admin.token"
    token_file.write_text(ADMIN_TOKEN + "\n")
    key, _pub = generate_keypair(state / "keys", "bench")
    keydir = state / "keys"
    exe = shutil.which("edge-fleet")
    cmd = [exe] if exe else [sys.executable, "-m", "fleet.cli"]
    env = {k: v for k, v in os.environ.items() if k != "EDGE_FLEET_ADMIN_TOKEN"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    ports = [pick_port(args.port), free_port()]
    replicas: list[subprocess.Popen[bytes]] = []
    pg = psycopg.connect(args.pg.replace("dbname=test", f"dbname={dbname}"))
    results: dict[int, dict[str, float]] = {}
    try:
        for name, port in zip("ab", ports, strict=True):
            replicas.append(_start_replica(cmd, url, port, state / f"replica-{name}", token_file,
                                           keydir, name, env))
        for port, proc, name in zip(ports, replicas, "ab", strict=True):
            _wait_healthy(port, proc, state / f"replica-{name}" / "serve.log")
        meter = CpuMeter([p.pid for p in replicas], admin, dbname)
        manifest = json.loads((BASE_MODEL / "manifest.json").read_text())
        shape = DeviceShape(args.streams, args.health_s, args.poll_s,
                            tuple(manifest["input"]["channels"]))
        # requests a device sends per simulated minute (ingest, health, polls)
        per_device_minute = 1 + 60 / args.health_s + args.streams * 60 / args.poll_s
        print(f"each device per minute: 1 ingest (gzip, schema {SCHEMA_VERSION}, "
              f"{args.streams} aggregates), {60 / args.health_s:.2g} health, "
              f"{args.streams * 60 / args.poll_s:.2g} polls", flush=True)
        tokens: dict[str, str] = {}
        minute0 = float(int(time.time() // 60) * 60)
        for n in counts:
            if results and max(r["p99"] for r in results.values()) > args.give_up_ms:
                print(f"{n} devices: not run (p99 over {args.give_up_ms:.0f} ms at "
                      f"{max(results)}: saturated)", flush=True)
                continue
            new = [f"bench{i:05d}" for i in range(len(tokens), n)]
            tokens.update(enroll_direct(pg, new))
            use = {d: tokens[d] for d in list(tokens)[:n]}
            tally = Tally()
            before, cpu0, t0 = meter.sample(), time.process_time(), time.perf_counter()
            with asyncio.Runner(loop_factory=_loop_factory()) as runner:
                runner.run(_run_minutes(ports, use, shape, args.minutes, args.minute_s,
                                        minute0, args.connections, tally))
            minute0 += 60.0 * args.minutes
            wall = time.perf_counter() - t0
            if args.trace is not None:
                args.trace.mkdir(parents=True, exist_ok=True)
                with (args.trace / f"requests-{n}.csv").open("w") as fh:
                    fh.write("due,written,ended,kind,replica,counted\n")
                    fh.writelines(f"{a:.6f},{b:.6f},{c:.6f},{k},{r},{int(m)}\n"
                                  for a, b, c, k, r, m in tally.trace)
                with (args.trace / f"client-lag-{n}.csv").open("w") as fh:
                    fh.write("at,lag,cpu\n")
                    fh.writelines(f"{a:.6f},{b:.6f},{c:.6f}\n" for a, b, c in tally.lags)
            cpu = CpuMeter.delta(before, meter.sample())
            lat = [x * 1000 for v in tally.latencies.values() for x in v]
            counted = tally.sent  # CPU is measured over every minute, warm-up too
            res = {"p50": percentile(lat, 50), "p99": percentile(lat, 99),
                   "fleet_cpu_ms": 1000 * cpu["fleet"] / max(1.0, counted),
                   "pg_cpu_ms": 1000 * cpu["pg"] / max(1.0, counted),
                   "rps": per_device_minute * n / args.minute_s, "errors": len(tally.errors)}
            results[n] = res
            kinds = "  ".join(f"{k} p99 {percentile([x * 1000 for x in v], 99):.1f}"
                              for k, v in tally.latencies.items())
            print(f"{n} devices: {len(lat)} requests counted ({res['rps']:.0f}/s offered), "
                  f"p50 {res['p50']:.1f} ms p99 {res['p99']:.1f} ms ({kinds}); CPU/request "
                  f"fleet {res['fleet_cpu_ms']:.2f} ms, PostgreSQL {res['pg_cpu_ms']:.2f} ms, "
                  f"client {1000 * (time.process_time() - cpu0) / max(1.0, counted):.2f} ms; "
                  f"errors {len(tally.errors)}{': ' + tally.errors[0] if tally.errors else ''}; "
                  f"wall {wall:.0f} s, load average {os.getloadavg()[0]:.1f}", flush=True)
            print("  " + tail_summary(tally, res["p99"] / 1000), flush=True)
        if len(results) > 1:
            lo, hi = min(results), max(results)
            print(f"growth {lo} -> {hi} devices (x{hi / lo:.0f}): p50 "
                  f"x{results[hi]['p50'] / results[lo]['p50']:.2f}, p99 "
                  f"x{results[hi]['p99'] / results[lo]['p99']:.2f}, fleet CPU/request "
                  f"x{results[hi]['fleet_cpu_ms'] / results[lo]['fleet_cpu_ms']:.2f}, "
                  f"PostgreSQL CPU/request "
                  f"x{results[hi]['pg_cpu_ms'] / max(1e-9, results[lo]['pg_cpu_ms']):.2f}",
                  flush=True)
        for proc in replicas:  # idle from here on: out of the way of the next parts
            proc.send_signal(signal.SIGTERM)

        query_p99 = float("nan")
        if args.rows > 0:
            if len(tokens) < QUERY_DEVICES:
                tokens.update(enroll_direct(pg, [f"bench{i:05d}" for i in
                                                 range(len(tokens), QUERY_DEVICES)]))
            pg.execute("TRUNCATE aggregates")
            pg.commit()
            t = time.perf_counter()
            start, end = generate_rows(pg, engine, args.rows, args.streams, args.chunk_rows,
                                       args.rows_budget_s)
            total = pg.execute("SELECT count(*) FROM aggregates").fetchone()
            size = pg.execute("SELECT pg_size_pretty(sum(pg_total_relation_size(c.oid))) FROM "
                              "pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE "
                              "i.inhparent = 'aggregates'::regclass").fetchone()
            pg.commit()
            print(f"aggregates: {total[0] if total else 0} rows, {size[0] if size else '?'} "
                  f"with indexes, {start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M}, generated in "
                  f"{time.perf_counter() - t:.0f} s", flush=True)
            times = run_queries(engine, start, end, args.streams, args.queries)
            every = [x * 1000 for v in times.values() for x in v]
            query_p99 = percentile(every, 99)
            print("console queries ms: " + "  ".join(
                f"{k} p50 {percentile([x * 1000 for x in v], 50):.1f} "
                f"p99 {percentile([x * 1000 for x in v], 99):.1f}" for k, v in times.items())
                + f"  all p99 {query_p99:.1f}", flush=True)

        lost = duplicated = 0
        if args.jobs > 0:
            if len(tokens) < args.jobs:
                tokens.update(enroll_direct(pg, [f"bench{i:05d}" for i in
                                                 range(len(tokens), args.jobs)]))
            lost, duplicated, summary = run_jobs(url, engine, state, env, cmd, key, keydir,
                                                 args.jobs, args.jobs_timeout)
            print(summary + f"; lost {lost}, duplicated {duplicated}", flush=True)
        p99_10k = f"{results[10000]['p99']:.1f}" if 10000 in results else "n/a"
        q99 = f"{query_p99:.1f}" if args.rows > 0 else "n/a"
        jl, jd = (str(lost), str(duplicated)) if args.jobs > 0 else ("n/a", "n/a")
        print(f"p99_ms_10000={p99_10k} query_p99_ms={q99} jobs_lost={jl} jobs_duplicated={jd}")
        return 0 if lost == duplicated == 0 else 1
    finally:
        for proc in replicas:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in replicas:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        pg.close()
        engine.dispose()


if __name__ == "__main__":
    raise SystemExit(main())
