"""Store-and-forward sync against the REAL fleet (``edge-fleet serve`` on a SQLite file).

Nothing lost, nothing duplicated: after every fault the fleet's database holds each record of the
agent's store exactly once (``COUNT(*) == COUNT(DISTINCT id) ==`` the agent's count) and the
agent's upload queue is empty. Waits poll with deadlines.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from agent.metrics import Metrics
from agent.publish.mqtt import MqttConfig, MqttPublisher
from agent.services.uploader import Uploader
from agent.store.sqlite import Store
from cloud_sync.client import FleetClient
from tests.conftest import MosquittoBroker
from tests.integration.fleet_peer import FleetProcess
from tests.unit.test_store import make_aggregate, make_alert

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def wait_until(pred: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


def assert_exactly_once(fleet: FleetProcess, store: Store) -> None:
    agent_alerts = {a["alert_id"] for a in store.alerts(limit=10**7)}
    agent_aggs = {a["aggregate_id"] for a in store.aggregates()}
    assert store.upload_backlog() == (0, 0)
    assert fleet.counts("alerts") == (len(agent_alerts), len(agent_alerts))
    assert fleet.counts("aggregates") == (len(agent_aggs), len(agent_aggs))
    assert set(fleet.ids("alerts")) == agent_alerts
    assert set(fleet.ids("aggregates")) == agent_aggs


def test_fleet_down_60_s_while_the_agent_produces(tmp_path: Path, fleet: FleetProcess) -> None:
    m = Metrics(CollectorRegistry())
    store = Store(tmp_path / "agent.db", metrics=m)
    up = Uploader(store, FleetClient(fleet.url, fleet.token, read_timeout_s=5), "gw1", m,
                  batch_records=200, interval_s=0.5, backoff_initial_s=0.5, backoff_max_s=4.0)
    up.start()
    stop = threading.Event()

    def produce() -> None:
        i = 0
        while not stop.is_set():
            store.add_aggregate(make_aggregate(60.0 * i))
            if i % 25 == 0:
                store.add_alert(make_alert(i // 25 + 1))
                up.notify()
            i += 1
            time.sleep(0.01)

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        time.sleep(3)
        fleet.stop()
        t_down = time.monotonic()
        time.sleep(60)
        fleet.start()
        outage = time.monotonic() - t_down
        stop.set()
        producer.join()
        wait_until(lambda: store.upload_backlog() == (0, 0), 30, "the backlog to drain")
    finally:
        stop.set()
        producer.join()
        up.stop(5)
    assert outage >= 60
    assert m.registry.get_sample_value(
        "edge_agent_upload_failures_total", {"reason": "unavailable"}) >= 5
    assert len(store.aggregates()) > 3000
    assert_exactly_once(fleet, store)
    store.close()


def test_kill_9_during_upload_20_times(tmp_path: Path, fleet: FleetProcess) -> None:
    db = tmp_path / "agent.db"
    rng = random.Random(7)
    n_agg = n_alert = 0
    cmd = [sys.executable, "-m", "tests.integration.upload_worker", str(db), fleet.url,
           fleet.token, "20"]
    killed = 0
    for _trial in range(20):
        with Store(db) as store:
            for _ in range(1500):
                store.add_aggregate(make_aggregate(60.0 * n_agg))
                n_agg += 1
            for _ in range(5):
                n_alert += 1
                store.add_alert(make_alert(n_alert))
        # Kill after a random number of upload attempts (plus a random fraction of the next),
        # so the kill lands mid-upload whatever the machine's speed.
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        for _ in range(rng.randint(1, 40)):
            if not proc.stdout.readline():
                break
        time.sleep(rng.uniform(0.0, 0.03))
        if proc.poll() is None:
            proc.kill()
            killed += 1
        proc.wait()
        proc.stdout.close()
    assert killed >= 10, "the worker finished before most kills: the test proves little"
    final = subprocess.run(cmd, cwd=REPO, timeout=120, check=False, stdout=subprocess.DEVNULL)
    assert final.returncode == 0
    with Store(db) as store:
        assert len(store.aggregates()) == n_agg
        assert_exactly_once(fleet, store)


class FaultProxy:
    """HTTP proxy to the fleet: ``mode`` ok | 500 | malformed (forwards, then garbles the 200)."""

    def __init__(self, target: str) -> None:
        self.mode = "ok"
        self.calls: dict[str, int] = {}
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                mode = proxy.mode
                proxy.calls[mode] = proxy.calls.get(mode, 0) + 1
                if mode == "500":
                    self._reply(500, b"boom")
                    return
                req = urllib.request.Request(target + self.path, data=body, method="POST",
                                             headers=dict(self.headers.items()))
                with urllib.request.urlopen(req, timeout=30) as resp:
                    answer = resp.read()
                    status = resp.status
                if mode == "malformed":
                    answer = json.dumps({"results": [{"index": 0, "status": "accepted"}]}
                                        ).encode()[:-3]
                self._reply(status, answer)

            def _reply(self, status: int, payload: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize("in_flight", [1, 2])
def test_500s_and_malformed_responses_keep_rows_until_the_fleet_recovers(
    tmp_path: Path, fleet: FleetProcess, in_flight: int
) -> None:
    proxy = FaultProxy(fleet.url)
    m = Metrics(CollectorRegistry())
    try:
        with Store(tmp_path / "agent.db") as store:
            for i in range(300):
                store.add_aggregate(make_aggregate(60.0 * i))
            for i in range(10):
                store.add_alert(make_alert(i + 1))
            up = Uploader(store, FleetClient(proxy.url, fleet.token), "gw1", m,
                          batch_records=100, backoff_initial_s=0.01, backoff_max_s=0.05,
                          max_in_flight=in_flight)
            for mode in ("500", "malformed"):
                proxy.mode = mode
                for _ in range(5):
                    assert up.run_once() > 0  # a failure: backoff
                assert store.upload_backlog() == (10, 300)  # nothing cleared without an ack
            # malformed answers hid stored batches: the first (10 alerts + 90 aggregates) and,
            # with two in flight, the next 100 aggregates too
            hidden = 90 + 100 * (in_flight - 1)
            assert fleet.counts("aggregates")[0] == hidden
            proxy.mode = "ok"
            while store.upload_backlog() != (0, 0):
                assert up.run_once() in (0.0, up.interval_s)  # no failure
            assert_exactly_once(fleet, store)
            dup = m.registry.get_sample_value(
                "edge_agent_upload_records_total", {"kind": "aggregate", "status": "duplicate"})
            assert dup == hidden
            assert m.registry.get_sample_value(  # every failed request counts
                "edge_agent_upload_failures_total", {"reason": "protocol"}) == 5 * in_flight
    finally:
        proxy.close()


def test_tiny_budget_evicts_aggregates_while_alerts_reach_mqtt_and_the_fleet(
    tmp_path: Path, fleet: FleetProcess, mosquitto: MosquittoBroker
) -> None:
    from tests.integration.test_mqtt_publish import Subscriber  # noqa: PLC0415

    m = Metrics(CollectorRegistry())
    sub = Subscriber(mosquitto, ["edge/gw1/alerts"])
    store = Store(tmp_path / "agent.db", metrics=m, budget_bytes=256 * 1024,
                  maintenance_interval_s=0.0)
    pub = MqttPublisher(MqttConfig(enabled=True, host=mosquitto.host, port=mosquitto.port),
                        store, "gw1", m)
    pub.start()
    up = Uploader(store, FleetClient(fleet.url, fleet.token), "gw1", m, batch_records=100,
                  interval_s=0.2)
    try:
        for i in range(4000):
            store.add_aggregate(make_aggregate(60.0 * i))
            if i % 100 == 0:
                store.add_alert(make_alert(i // 100 + 1))
                pub.notify(f"gw1:pump1:{i // 100 + 1}", None)
        assert store.size_bytes() <= 256 * 1024 + 64 * 1024
        assert (m.registry.get_sample_value(
            "edge_agent_dropped_total", {"kind": "aggregate", "reason": "budget"}) or 0) > 1000
        assert not m.registry.get_sample_value(
            "edge_agent_dropped_total", {"kind": "alert", "reason": "budget"})
        up.start()
        wait_until(lambda: len(sub.messages()) >= 40, 30, "40 alerts over MQTT")
        wait_until(lambda: store.upload_backlog() == (0, 0), 30, "the upload to finish")
        assert fleet.counts("alerts") == (40, 40)
        n, distinct = fleet.counts("aggregates")
        assert n == distinct > 0
    finally:
        up.stop(5)
        pub.stop()
        store.close()


def test_a_re_enrolled_token_written_to_the_token_file_is_used_without_a_restart(
    tmp_path: Path, fleet: FleetProcess
) -> None:
    """The agent's own uploader wiring (``agent.app._build_uploader``) against the real fleet:
    a refused token, then the operator writes the device's new token into the file; the backlog
    drains without a restart or SIGHUP (a tester's agent kept sending the old token)."""
    from agent.app import _build_uploader  # noqa: PLC0415 - the wiring under test
    from agent.config.loader import load_config  # noqa: PLC0415

    token_file = tmp_path / "fleet.token"
    token_file.write_text("not-the-enrolled-token\n")
    cfg_file = tmp_path / "agent.toml"
    cfg_file.write_text(
        '[agent]\ndevice_id = "gw1"\n'
        f'[fleet]\nenabled = true\nurl = "{fleet.url}"\ntoken_file = "{token_file}"\n'
        "interval_s = 0.2\nbackoff_max_s = 1.0\n"
        '[[streams]]\nname = "pump1"\n[streams.source]\nkind = "simulator"\n'
    )
    config = load_config(cfg_file).resolved(tmp_path)
    m = Metrics(CollectorRegistry())
    store = Store(tmp_path / "agent.db")
    for i in range(5):
        store.add_aggregate(make_aggregate(60.0 * i))
    up = _build_uploader(config, store, m, time.time)
    up.start()
    try:
        wait_until(lambda: (m.registry.get_sample_value(
            "edge_agent_upload_failures_total", {"reason": "auth"}) or 0) >= 2, 60,
            "the fleet to refuse the wrong token twice")
        assert store.upload_backlog() == (0, 5)
        token_file.write_text(fleet.token + "\n")
        wait_until(lambda: store.upload_backlog() == (0, 0), 60, "the backlog to drain")
    finally:
        up.stop(30)
        up.close()
    assert_exactly_once(fleet, store)
    store.close()
