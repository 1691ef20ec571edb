"""Camera alert snapshots through ``edge-agent run``: a watched image folder (generated images,
the shipped mtd-patchcore model), a real mosquitto and a real ``edge-fleet serve``. Every alert
names its snapshot; the retained snapshot and heatmap topics hold images of the right size; the
fleet stores the snapshot beside the alert and serves it to the operator."""

from __future__ import annotations

import io
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

from agent.store.sqlite import Store
from tests.conftest import MosquittoBroker
from tests.integration.fleet_peer import ADMIN_TOKEN, FleetProcess
from tests.integration.mqtt_subscriber import Subscriber, subscriber_factory

cv2 = pytest.importorskip("cv2")
Image = pytest.importorskip("PIL.Image")
pytest.importorskip("onnx")

START_S = 240.0  # model load + backend selection on a loaded 2-core machine
DEADLINE_S = 90.0


@pytest.fixture
def subscribers() -> Iterator[Callable[..., Subscriber]]:
    yield from subscriber_factory(Subscriber)


def wait_for(cond: Callable[[], Any], what: str, timeout_s: float, proc: Any = None) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"edge-agent exited ({proc.returncode}) waiting for {what}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def tile(seed: int) -> np.ndarray:
    """An 800 x 600 gray tile with a bright square (scores far above the threshold)."""
    rng = np.random.default_rng(seed)
    img = (100 + rng.normal(0, 3, (600, 800))).clip(0, 255).astype(np.uint8)
    img[380:490, 100:210] = 255
    return img


def test_camera_alert_snapshot_published_retained_and_served_by_the_fleet(
    tmp_path: Path, mosquitto: MosquittoBroker, fleet: FleetProcess,
    subscribers: Callable[..., Subscriber],
) -> None:
    frames = tmp_path / "frames"
    frames.mkdir()
    for i in range(2):
        cv2.imwrite(str(frames / f"part{i}.png"), tile(i))
    sub = subscribers(mosquitto, ["edge/gw1/#"])
    config = tmp_path / "agent.toml"
    config.write_text(f"""
[agent]
device_id = "gw1"
state_dir = "{tmp_path / 'state'}"
console_alerts = false
[[streams]]
name = "cam1"
model = "builtin:mtd-patchcore"
[streams.source]
kind = "camera"
folder = "{frames}"
watch = true
[mqtt]
enabled = true
host = "{mosquitto.host}"
port = {mosquitto.port}
[fleet]
enabled = true
url = "{fleet.url}"
token_env = "EDGE_TEST_TOKEN"
interval_s = 0.5
[snapshots]
max_edge = 640
""")
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
    env["EDGE_TEST_TOKEN"] = fleet.token
    err = tmp_path / "agent.stderr"
    with err.open("wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "agent.cli", "run", "--config", str(config)],
                                stdout=subprocess.DEVNULL, stderr=fh, env=env, cwd=tmp_path)
    try:
        alerts = wait_for(lambda: len(sub.alerts()) >= 2 and sub.alerts(), "two alerts",
                          START_S, proc)
        for a in alerts:
            assert a["snapshot"] == {"id": a["alert_id"], "topic": "edge/gw1/cam1/snapshot",
                                     "heatmap_topic": "edge/gw1/cam1/heatmap"}
        snap = wait_for(lambda: sub.messages("edge/gw1/cam1/snapshot"), "a snapshot",
                        DEADLINE_S, proc)
        heat = wait_for(lambda: sub.messages("edge/gw1/cam1/heatmap"), "a heatmap",
                        DEADLINE_S, proc)
        with Image.open(io.BytesIO(snap[-1].payload)) as img:
            assert img.format == "JPEG" and img.size == (640, 480)
        with Image.open(io.BytesIO(heat[-1].payload)) as img:
            assert img.format == "PNG" and img.size[0] == 640 and img.size[1] > 480
            assert float(img.text["threshold"]) > 0
        ids = [a["alert_id"] for a in alerts]
        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

        def served(kind: str = "snapshot") -> requests.Response | None:
            r = requests.get(f"{fleet.url}/v1/devices/gw1/alerts/{ids[0]}/{kind}",
                             headers=admin, timeout=10)
            return r if r.status_code == 200 else None

        resp = wait_for(served, "the fleet serving the snapshot", DEADLINE_S, proc)
        assert resp.headers["content-type"] == "image/jpeg"
        with Image.open(io.BytesIO(resp.content)) as img:
            assert img.size == (640, 480)
        # the heatmap is uploaded in its own request, after the snapshot
        heat_resp = wait_for(lambda: served("heatmap"), "the fleet serving the heatmap",
                             DEADLINE_S, proc)
        assert heat_resp.status_code == 200 and heat_resp.headers["content-type"] == "image/png"
        def listed() -> bool:  # every alert reaches the fleet (its upload is a batch of its own)
            got = requests.get(f"{fleet.url}/v1/devices/gw1/alerts", headers=admin, timeout=10)
            return {a["id"] for a in got.json()["items"]} >= set(ids)

        wait_for(listed, "both alerts listed by the fleet", DEADLINE_S, proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, err.read_text(errors="replace")[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    log = err.read_text(errors="replace")
    assert "Traceback" not in log, log[-3000:]


def test_kill_9_keeps_every_stored_alert_and_whole_snapshots(tmp_path: Path) -> None:
    """kill -9 while snapshots are being made: every alert the store took is there after, and a
    snapshot is either whole or absent (one transaction per snapshot)."""
    frames = tmp_path / "frames"
    frames.mkdir()
    for i in range(4):
        cv2.imwrite(str(frames / f"part{i}.png"), tile(10 + i))
    state = tmp_path / "state"
    config = tmp_path / "agent.toml"
    config.write_text(f"""
[agent]
device_id = "gw1"
state_dir = "{state}"
console_alerts = false
[[streams]]
name = "cam1"
model = "builtin:mtd-patchcore"
[streams.source]
kind = "camera"
folder = "{frames}"
watch = true
""")
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
    err = tmp_path / "agent.stderr"
    db = state / "agent.db"

    def alerts_stored() -> int:
        if not db.exists():
            return 0
        try:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as conn:
                return int(conn.execute("SELECT COUNT(*) FROM alerts").fetchone()[0])
        except sqlite3.Error:
            return 0

    with err.open("wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "agent.cli", "run", "--config", str(config)],
                                stdout=subprocess.DEVNULL, stderr=fh, env=env, cwd=tmp_path)
    try:
        wait_for(lambda: alerts_stored() >= 1, "a stored alert", START_S, proc)
        proc.kill()  # SIGKILL: no shutdown, snapshots possibly half made
        proc.wait(30)
        seen = alerts_stored()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    with Store(db) as store:
        assert store.quarantined is None  # the file is intact
        alerts = store.alerts()
        assert len(alerts) >= seen >= 1
        for a in alerts:
            snap = store.snapshot(a["alert_id"])
            if snap is None:
                continue  # a snapshot may be lost, never the alert
            with Image.open(io.BytesIO(snap.jpeg)) as img:
                img.load()
                assert img.size == (640, 480)
