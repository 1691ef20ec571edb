"""``/metrics`` with a real ``edge-fleet serve --workers 2``: counters are summed over the worker
processes (prometheus_client multiprocess mode), whichever worker answers the scrape."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import requests

from tests.fleet.live import free_port, wait_for

N_REQUESTS = 120
ROOT = Path(__file__).resolve().parents[2]
_HEALTHZ = re.compile(
    r'^fleet_http_requests_total\{method="GET",route="/healthz",status="200"\} ([0-9.e+]+)$', re.M)


def _healthz_count(base: str) -> float:
    text = requests.get(f"{base}/metrics", timeout=10, headers={"Connection": "close"}).text
    found = _HEALTHZ.search(text)
    return float(found.group(1)) if found else 0.0


def test_counters_sum_across_two_workers(tmp_path: Path) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "fleet.cli"]  # this checkout's code (PYTHONPATH below)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("EDGE_FLEET_ADMIN_TOKEN", "PROMETHEUS_MULTIPROC_DIR")}
    env["TMPDIR"] = str(tmp)  # serve makes the multiprocess directory here
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*cmd, "serve", "--db", f"sqlite:///{tmp_path / 'fleet.db'}", "--port", str(port),
             "--state-dir", str(tmp_path / "state"), "--workers", "2"],
            stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        def up() -> bool:
            assert proc.poll() is None, log.read_text()
            try:
                return requests.get(f"{base}/healthz", timeout=2).status_code == 200
            except requests.ConnectionError:
                return False

        wait_for(up, "edge-fleet serve --workers 2", timeout=90)
        metrics_dirs = list(tmp.glob("edge-fleet-metrics-*"))
        assert len(metrics_dirs) == 1, (list(tmp.iterdir()), log.read_text()[-2000:])
        # wait until both workers serve (each writes its own counter_<pid>.db on first count)
        sent = [1]

        def both_workers() -> bool:
            for _ in range(20):
                requests.get(f"{base}/healthz", timeout=10, headers={"Connection": "close"})
                sent[0] += 1
            return len(list(metrics_dirs[0].glob("counter_*.db"))) >= 2

        wait_for(both_workers, "requests served by both workers", timeout=90)
        for _ in range(N_REQUESTS):
            assert requests.get(f"{base}/healthz", timeout=10,
                                headers={"Connection": "close"}).status_code == 200
        total = sent[0] + N_REQUESTS
        # every scrape, whichever worker answers it, sees the sum over both workers
        counts = {_healthz_count(base) for _ in range(10)}
        assert counts == {float(total)}, (counts, total)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]
    assert not list(tmp.glob("edge-fleet-metrics-*")), "serve removes its metrics directory"
