"""Fleet ingest benchmark: N simulated gateways post gzip batches to a real ``edge-fleet serve``.

Creates a PostgreSQL database (dropped at the end), starts the server in a subprocess on a free
port, enrolls ``--devices`` devices over HTTP, then every device (one thread each, own HTTP
session) posts ``--batches`` gzip batches of ``--records`` aggregates. Each device sends one batch
every ``--interval`` seconds (start times spread over one interval), which is how gateways upload;
``--interval 0`` makes every device post back-to-back (closed loop, saturation). Bodies are built
before the clock starts so the client spends its CPU on HTTP only.

Prints latency percentiles per request (client-side, wall clock) and stored records per second;
the last line is ``p50_ms=<x> p99_ms=<y> records_per_s=<n>``.

Usage::

    python3 benchmarks/fleet_ingest.py [--devices 200] [--batches 20] [--records 50]
        [--interval 1.0] [--workers 1] [--pool-size 10]
        [--pg "host=127.0.0.1 user=postgres dbname=test"]

This is a benchmark, not a test: it needs PostgreSQL and takes ~30 s.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg
import requests

T0 = 1_700_000_000.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
    return gzip.compress(json.dumps(doc).encode(), compresslevel=5)


def percentile(sorted_values: list[float], q: float) -> float:
    k = min(len(sorted_values) - 1, max(0, round(q / 100 * (len(sorted_values) - 1))))
    return sorted_values[k]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=200)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--records", type=int, default=50)
    ap.add_argument("--interval", type=float, default=1.0, help="s between a device's batches")
    ap.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    ap.add_argument("--pool-size", type=int, default=10)
    ap.add_argument("--pg", default="host=127.0.0.1 port=5432 user=postgres dbname=test")
    args = ap.parse_args()

    dbname = f"fleet_bench_{secrets.token_hex(4)}"
    admin_conn = psycopg.connect(args.pg, autocommit=True)
    admin_conn.execute(f'CREATE DATABASE "{dbname}"')
    info = admin_conn.info
    url = f"postgresql+psycopg://{info.user}@{info.host}:{info.port}/{dbname}"
    state = Path(tempfile.mkdtemp(prefix="fleet-bench-"))
    port = free_port()
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
        tokens: dict[str, str] = {}
        with requests.Session() as http:
            for d in devices:
                r = http.post(f"{base}/v1/devices", json={"device_id": d}, headers=admin,
                              timeout=30)
                r.raise_for_status()
                tokens[d] = r.json()["token"]
        bodies = {d: [body(d, b, args.records) for b in range(args.batches)] for d in devices}
        print(f"{args.devices} devices x {args.batches} batches x {args.records} aggregates, "
              f"interval {args.interval} s, {args.workers} worker(s), pool {args.pool_size}; "
              f"gzip body ~{len(bodies[devices[0]][0])} B")

        latencies: list[float] = []
        accepted = [0]
        errors: list[str] = []
        lock = threading.Lock()
        start_gate = threading.Event()

        def device_loop(i: int, device: str) -> None:
            headers = {"Authorization": f"Bearer {tokens[device]}",
                       "Content-Type": "application/json", "Content-Encoding": "gzip"}
            own: list[float] = []
            ok = 0
            with requests.Session() as http:
                start_gate.wait()
                t_start = time.monotonic() + args.interval * i / max(1, args.devices)
                for b, data in enumerate(bodies[device]):
                    delay = t_start + b * args.interval - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                    t = time.perf_counter()
                    r = http.post(f"{base}/v1/ingest", data=data, headers=headers, timeout=60)
                    own.append(time.perf_counter() - t)
                    if r.status_code != 200:
                        with lock:
                            errors.append(f"{r.status_code} {r.text[:200]}")
                        continue
                    ok += sum(1 for x in r.json()["results"] if x["status"] == "accepted")
            with lock:
                latencies.extend(own)
                accepted[0] += ok

        threads = [threading.Thread(target=device_loop, args=(i, d), daemon=True)
                   for i, d in enumerate(devices)]
        for th in threads:
            th.start()
        t0 = time.perf_counter()
        start_gate.set()
        for th in threads:
            th.join()
        wall = time.perf_counter() - t0

        lat = sorted(x * 1000 for x in latencies)
        p50, p99 = percentile(lat, 50), percentile(lat, 99)
        rate = accepted[0] / wall
        print(f"requests {len(lat)} in {wall:.1f} s ({len(lat) / wall:.0f} req/s), "
              f"errors {len(errors)}{': ' + errors[0] if errors else ''}")
        print(f"latency ms: p50 {p50:.1f}  p90 {percentile(lat, 90):.1f}  p99 {p99:.1f}  "
              f"max {lat[-1]:.1f}  mean {statistics.fmean(lat):.1f}")
        print(f"records accepted {accepted[0]} of {args.devices * args.batches * args.records}")
        print(f"p50_ms={p50:.1f} p99_ms={p99:.1f} records_per_s={rate:.0f}")
        return 0 if not errors else 1
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()
        admin_conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        admin_conn.close()
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
