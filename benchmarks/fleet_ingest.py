"""Fleet ingest benchmark: N simulated gateways post gzip batches to a real ``edge-fleet serve``.

Creates a PostgreSQL database (dropped at the end), starts the server in a subprocess on a free
port (``--workers`` uvicorn processes, ``--pool-size`` connections each), enrolls ``--devices``
devices over HTTP, then every device posts ``--batches`` gzip batches of ``--records``
aggregates, all devices concurrently.

Rate: each device posts ONE batch every ``--interval`` seconds (default 2 s: 25 records/s per
device, 200 devices x 50 records / 2 s = 5,000 records/s offered; a real gateway's uploader polls
every 5 s), with the devices' start times spread evenly over one interval, which is how gateways
upload. ``--interval 0`` makes every device post back-to-back (closed loop: saturation).
Every batch holds distinct records (ids from device, batch and index), so the database does real
inserts; at the end the stored rows are counted in PostgreSQL and must equal
devices x batches x records (``COUNT(*)`` and ``COUNT(DISTINCT id)``).

The load generator is cheap so it does not steal the server's CPU (the machine may have only two
cores): one asyncio event loop (uvloop when installed), one keep-alive HTTP/1.1 connection per
device over raw asyncio streams, and every request (headers + gzip body) encoded before the clock
starts. Latency is per request, client side, from writing the request to having read the whole
response.

Prints latency percentiles and stored records per second; the last line is
``p50_ms=<x> p99_ms=<y> records_per_s=<n> stored=<n>/<expected>``.

Usage::

    python3 benchmarks/fleet_ingest.py [--devices 200] [--batches 20] [--records 50]
        [--interval 2.0] [--workers 2] [--pool-size 10]
        [--pg "host=127.0.0.1 user=postgres dbname=test"] [--port N] [--workdir DIR]

The server's state folder is ``--workdir`` (kept) or a temporary folder removed at the end; the
database is dropped at the end, also after an error.

This is a benchmark, not a test: it needs PostgreSQL and takes ~60 s.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import requests
from workspace import add_arguments, pick_port, workspace

T0 = 1_700_000_000.0


def body(device: str, batch_no: int, n: int) -> bytes:
    records = []
    for i in range(n):
        t = T0 + 60.0 * (batch_no * n + i)
        records.append({
            "kind": "aggregate",
            "id": f"{device}:pump1:{int(t * 1000)}",
            "body": {
                "device_id": device, "stream": "pump1", "interval_start": t, "interval_s": 60.0,
                "count": 600, "max_score": 0.4, "windows": 12, "alert_count": 0,
                "channels": [
                    {"channel": f"ch{c}", "count": 600, "min": -1.0, "max": 1.0, "mean": 0.01,
                     "std": 0.2} for c in range(4)
                ],
            },
        })
    doc = {
        "schema": 1, "device_id": device, "sent_at": time.time(), "agent_version": "bench",
        "model": {"name": "bench", "version": 1},
        "backlog": {"alerts": 0, "aggregates": n}, "records": records,
    }
    return gzip.compress(json.dumps(doc, separators=(",", ":")).encode(), compresslevel=1)


def request_bytes(port: int, token: str, data: bytes) -> bytes:
    head = (
        "POST /v1/ingest HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {token}\r\n"
        "Content-Type: application/json\r\n"
        "Content-Encoding: gzip\r\n"
        "Accept: application/json\r\n"
        f"Content-Length: {len(data)}\r\n"
        "\r\n"
    )
    return head.encode("ascii") + data


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One HTTP/1.1 response with a Content-Length body (what uvicorn sends here)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    return status, await reader.readexactly(length)


def percentile(sorted_values: list[float], q: float) -> float:
    k = min(len(sorted_values) - 1, max(0, round(q / 100 * (len(sorted_values) - 1))))
    return sorted_values[k]


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)
    accepted: int = 0
    errors: list[str] = field(default_factory=list)


async def device_loop(i: int, n_devices: int, port: int, requests_: list[bytes],
                      interval: float, start: float, tally: Tally) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    loop = asyncio.get_running_loop()
    t_start = start + interval * i / max(1, n_devices)
    try:
        for b, req in enumerate(requests_):
            delay = t_start + b * interval - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            t = time.perf_counter()
            writer.write(req)
            status, content = await read_response(reader)
            tally.latencies.append(time.perf_counter() - t)
            if status != 200:
                tally.errors.append(f"{status} {content[:200]!r}")
                continue
            tally.accepted += sum(
                1 for x in json.loads(content)["results"] if x["status"] == "accepted"
            )
    finally:
        writer.close()


async def run_load(port: int, reqs: dict[str, list[bytes]], interval: float) -> tuple[Tally, float]:
    tally = Tally()
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.5  # every connection opened before the first post
    t0 = time.perf_counter() + 0.5
    await asyncio.gather(*(
        device_loop(i, len(reqs), port, r, interval, start, tally)
        for i, r in enumerate(reqs.values())
    ))
    return tally, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=200)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--records", type=int, default=50)
    ap.add_argument("--interval", type=float, default=2.0, help="s between a device's batches")
    ap.add_argument("--workers", type=int, default=2, help="uvicorn worker processes")
    ap.add_argument("--pool-size", type=int, default=10)
    ap.add_argument("--pg", default="host=127.0.0.1 port=5432 user=postgres dbname=test")
    add_arguments(ap, port_help="port of the edge-fleet serve peer (default: a free one)")
    args = ap.parse_args(argv)

    dbname = f"fleet_bench_{secrets.token_hex(4)}"
    admin_conn = psycopg.connect(args.pg, autocommit=True)
    admin_conn.execute(f'CREATE DATABASE "{dbname}"')
    try:
        with workspace(args.workdir, "fleet-bench-") as state:
            return serve_and_load(args, admin_conn, dbname, state)
    finally:
        admin_conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        admin_conn.close()


def serve_and_load(
    args: argparse.Namespace, admin_conn: psycopg.Connection[Any], dbname: str, state: Path
) -> int:
    """Start the server on database ``dbname`` with state in ``state``, enroll, load, count."""
    info = admin_conn.info
    url = f"postgresql+psycopg://{info.user}@{info.host}:{info.port}/{dbname}"
    port = pick_port(args.port)
    base = f"http://127.0.0.1:{port}"
    exe = shutil.which("edge-fleet")
    cmd = [exe] if exe else [sys.executable, "-m", "fleet.cli"]
    env = {k: v for k, v in os.environ.items() if k != "EDGE_FLEET_ADMIN_TOKEN"}
    log = (state / "serve.log").open("wb")
    server = subprocess.Popen(
        [*cmd, "serve", "--db", url, "--port", str(port), "--state-dir", str(state),
         "--workers", str(args.workers), "--pool-size", str(args.pool_size),
         "--log-level", "warning"],
        stdout=log, stderr=subprocess.STDOUT, env=env,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if requests.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                print((state / "serve.log").read_text(), file=sys.stderr)
                return 1
            time.sleep(0.2)
        admin = {"Authorization": f"Bearer {(state / 'admin.token').read_text().strip()}"}
        devices = [f"bench{i:04d}" for i in range(args.devices)]
        reqs: dict[str, list[bytes]] = {}
        with requests.Session() as http:
            for d in devices:
                r = http.post(f"{base}/v1/devices", json={"device_id": d}, headers=admin,
                              timeout=30)
                r.raise_for_status()
                token = r.json()["token"]
                reqs[d] = [request_bytes(port, token, body(d, b, args.records))
                           for b in range(args.batches)]
        size = len(reqs[devices[0]][0])
        print(f"{args.devices} devices x {args.batches} batches x {args.records} aggregates, "
              f"one batch per device every {args.interval} s, {args.workers} worker(s), "
              f"pool {args.pool_size}; request ~{size} B (gzip body)")
        load_before = os.getloadavg()
        try:
            import uvloop  # noqa: PLC0415 (optional, faster event loop for the client)

            runner = uvloop.run
        except ImportError:
            runner = asyncio.run
        tally, wall = runner(run_load(port, reqs, args.interval))

        expected = args.devices * args.batches * args.records
        with psycopg.connect(args.pg.replace("dbname=test", f"dbname={dbname}")) as conn:
            row = conn.execute("SELECT COUNT(*), COUNT(DISTINCT id) FROM aggregates").fetchone()
        stored, distinct = (int(row[0]), int(row[1])) if row else (0, 0)
        lat = sorted(x * 1000 for x in tally.latencies)
        p50, p99 = percentile(lat, 50), percentile(lat, 99)
        rate = tally.accepted / wall
        errors = tally.errors
        print(f"requests {len(lat)} in {wall:.1f} s ({len(lat) / wall:.0f} req/s), "
              f"errors {len(errors)}{': ' + errors[0] if errors else ''}")
        print(f"latency ms: p50 {p50:.1f}  p90 {percentile(lat, 90):.1f}  p99 {p99:.1f}  "
              f"max {lat[-1]:.1f}  mean {statistics.fmean(lat):.1f}")
        print(f"records accepted {tally.accepted} of {expected}; stored {stored} "
              f"(distinct {distinct}); load average before {load_before[0]:.2f}, "
              f"after {os.getloadavg()[0]:.2f}")
        print(f"p50_ms={p50:.1f} p99_ms={p99:.1f} records_per_s={rate:.0f} "
              f"stored={distinct}/{expected}")
        ok = not errors and stored == distinct == expected == tally.accepted
        return 0 if ok else 1
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


if __name__ == "__main__":
    raise SystemExit(main())
