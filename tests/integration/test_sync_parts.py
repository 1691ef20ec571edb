"""Aggregate parts end to end: real SQLite files, a REAL fleet process (``edge-fleet serve``),
and the real agent replaying a file twice.

* An agent stopped within an interval (the shutdown flush stores part 0, already uploaded) and
  started again (it completes the interval: part 1) leaves both parts on the fleet; combined as
  docs/fleet-protocol.md says, they give the statistics of every reading of the interval.
* ``edge-agent run`` replaying the same file twice into one store stores each aggregate once
  (the second run restores the first run's calibration, so its score fields differ).
"""

from __future__ import annotations

import math
import os
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from agent.metrics import Metrics
from agent.pipeline.aggregates import IntervalAggregator
from agent.services.uploader import Uploader
from agent.store.sqlite import Store
from cloud_sync.client import FleetClient
from tests.integration.fleet_peer import ADMIN_TOKEN, FleetProcess
from tests.integration.test_agent_e2e import SKAB_FILE, edge_agent, skab_dir
from tests.integration.test_sync_pipeline import drain

pytestmark = pytest.mark.integration

T0 = 1_700_000_040.0  # an interval start (multiple of 60 s)


def agent_process(db: Path, fleet: FleetProcess, values: np.ndarray, ts: np.ndarray,
                  *, sigterm: bool) -> None:
    """One agent process: aggregate the readings, store what closes (and the open interval
    when stopped by SIGTERM), upload everything, close the store."""
    agg = IntervalAggregator("gw1", "pump1", ("v", "i"), 60.0)
    out = agg.add_readings(values, ts)
    if sigterm:
        out += agg.flush()
    store = Store(db)
    metrics = Metrics(CollectorRegistry())
    client = FleetClient(fleet.url, fleet.token, read_timeout_s=60)
    up = Uploader(store, client, "gw1", metrics, batch_records=100, interval_s=0.01,
                  backoff_initial_s=0.05, backoff_max_s=0.5)
    try:
        for a in out:
            store.add_aggregate(a)
        drain(up, store)
    finally:
        client.close()
        store.close()


def combine(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """docs/fleet-protocol.md's rule for the parts of one interval (one channel list each, in
    the same order)."""
    out: dict[str, Any] = {
        "count": sum(p["count"] for p in parts),
        "windows": sum(p["windows"] for p in parts),
        "alert_count": sum(p["alert_count"] for p in parts),
        "max_score": max((p["max_score"] for p in parts if p["max_score"] is not None),
                         default=None),
        "channels": [],
    }
    for chans in zip(*(p["channels"] for p in parts), strict=True):
        n, mean, m2 = 0, 0.0, 0.0
        for c in chans:  # Chan, Golub & LeVeque: pairwise update of (n, mean, M2)
            nb, mb, m2b = c["count"], c["mean"], c["std"] ** 2 * c["count"]
            delta = mb - mean
            total = n + nb
            mean += delta * nb / total
            m2 += m2b + delta * delta * n * nb / total
            n = total
        out["channels"].append({
            "channel": chans[0]["channel"], "count": n, "mean": mean, "std": math.sqrt(m2 / n),
            "min": min(c["min"] for c in chans), "max": max(c["max"] for c in chans),
        })
    return out


def test_restart_within_an_interval_reaches_the_fleet_as_two_parts(
    tmp_path: Path, fleet: FleetProcess
) -> None:
    rng = np.random.default_rng(7)
    values = 230.0 + rng.normal(0, 2, (120, 2))
    ts = T0 + np.arange(120) * 0.5  # 60 s: exactly one interval
    db = tmp_path / "agent.db"
    # readings 0..59 before SIGTERM, 62..119 after the restart (2 lost while it was down),
    # and the next interval's first reading, which closes the interval
    agent_process(db, fleet, values[:60], ts[:60], sigterm=True)
    assert fleet.counts("aggregates") == (1, 1)
    agent_process(db, fleet, np.vstack([values[62:], values[:1]]),
                  np.concatenate([ts[62:], [T0 + 60]]), sigterm=False)
    base = f"gw1:pump1:{round(T0 * 1000)}"
    assert sorted(fleet.ids("aggregates")) == [base, f"{base}:1"]
    # the same second process again (a replay of its readings): nothing new anywhere
    agent_process(db, fleet, np.vstack([values[62:], values[:1]]),
                  np.concatenate([ts[62:], [T0 + 60]]), sigterm=False)
    assert fleet.counts("aggregates") == (2, 2)
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT COUNT(*) FROM aggregates").fetchone() == (2,)
    conn.close()

    resp = httpx.get(f"{fleet.url}/v1/devices/gw1/aggregates",
                     headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30)
    assert resp.status_code == 200, resp.text
    items = resp.json()["items"]
    assert len(items) == 2 and {i["interval_start"] for i in items} == {items[0]["interval_start"]}
    whole = combine(items)
    kept = np.vstack([values[:60], values[62:]])
    assert whole["count"] == 118
    for k, ch in enumerate(whole["channels"]):
        assert ch["count"] == 118
        assert ch["mean"] == pytest.approx(kept[:, k].mean(), rel=1e-12)
        assert ch["std"] == pytest.approx(kept[:, k].std(), rel=1e-9)
        assert ch["min"] == kept[:, k].min() and ch["max"] == kept[:, k].max()


@pytest.mark.dataset
def test_replaying_the_same_file_twice_stores_each_aggregate_once(tmp_path: Path) -> None:
    csv_path = skab_dir() / SKAB_FILE
    config = tmp_path / "agent.toml"
    config.write_text(
        '[agent]\ndevice_id = "gw-test"\nstate_dir = "state"\n\n'
        '[[streams]]\nname = "s1"\nmodel = "builtin:skab-wstat"\n'
        f'[streams.source]\nkind = "replay"\npath = "{csv_path}"\nspeed = 0\n\n'
        "[store]\naggregate_interval_s = 60.0\n\n[mqtt]\nenabled = false\n"
    )
    db = tmp_path / "state" / "agent.db"
    stored: list[list[tuple[Any, ...]]] = []
    for run in range(2):
        proc = subprocess.run(
            [*edge_agent(), "run", "--config", str(config)], cwd=tmp_path, capture_output=True,
            text=True, timeout=280, env={**os.environ, "PYTHONUNBUFFERED": "1"}, check=False,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        if run == 1:
            assert "calibration restored" in proc.stderr  # the scores differ from run 0's
        conn = sqlite3.connect(db)
        stored.append(conn.execute(
            "SELECT aggregate_id, count, channels, max_score, windows FROM aggregates ORDER BY id"
        ).fetchall())
        conn.close()
    assert len(stored[0]) > 10
    assert stored[1] == stored[0]
    assert all(r[0].count(":") == 2 for r in stored[1])  # no part ids
