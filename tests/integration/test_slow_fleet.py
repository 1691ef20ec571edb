"""A fleet that trickles its answers one byte per second (a real socket peer on loopback).

Each byte resets ``requests``' per-read timeout, so only the client's total deadline ends such a
call; stopping the agent cuts its calls short instead of waiting for the peer to give up.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from cloud_sync.client import FleetClient
from cloud_sync.errors import FleetDeadlineExceeded, FleetUnavailable
from tests.integration.fleet_peer import free_port
from tests.integration.slow_peer import Mode, TricklePeer, self_signed
from tests.unit.test_fleet_client import batch

pytestmark = pytest.mark.integration


@pytest.fixture(params=["headers", "body"])
def peer(request: pytest.FixtureRequest) -> Iterator[TricklePeer]:
    mode: Mode = request.param
    p = TricklePeer(mode, interval_s=1.0, max_bytes=120)
    yield p
    p.close()


def test_an_upload_to_a_trickling_fleet_ends_at_its_total_deadline(peer: TricklePeer) -> None:
    client = FleetClient(peer.url, "tok", connect_timeout_s=1.0, read_timeout_s=2.0)
    assert client.total_timeout_s == 5.0
    with pytest.raises(FleetDeadlineExceeded, match="total deadline of 5 s"):
        client.ingest(batch(3))
    peer.wait_for_cut()  # the client closed the connection; the peer did not outlast it
    client.close()


def test_a_deadline_that_cuts_the_headers_after_the_status_line_is_a_deadline() -> None:
    """The deadline shut the socket after ``HTTP/1.1 200 OK`` and part of the headers: the
    truncated header block read as a complete 200 with an empty body, so the cut-off upload was
    reported as a protocol error ("200 response is not an IngestResult") instead of a deadline
    (no smaller batch, no "cut off" reason in /healthz)."""
    peer = TricklePeer("headers", interval_s=0.2, max_bytes=400)  # ~25 bytes in 5 s
    client = FleetClient(peer.url, "tok", connect_timeout_s=1.0, read_timeout_s=2.0)
    try:
        with pytest.raises(FleetDeadlineExceeded, match="total deadline of 5 s"):
            client.ingest(batch(3))
    finally:
        peer.close()
        client.close()


def test_an_assignment_poll_and_a_download_end_at_their_total_deadline(
    peer: TricklePeer, tmp_path: Path,
) -> None:
    client = FleetClient(peer.url, "tok", connect_timeout_s=1.0, read_timeout_s=1.5,
                         min_bytes_per_s=1000.0)
    with pytest.raises(FleetDeadlineExceeded):
        client.assignment("pump1")
    with pytest.raises(FleetDeadlineExceeded, match="package download"):
        client.download("/v1/models/m/2/package", tmp_path / "m.tar.gz", 2000, "0" * 64)
    client.close()


def test_abort_cuts_a_hung_call_short() -> None:
    peer = TricklePeer("headers", interval_s=1.0, max_bytes=120)
    client = FleetClient(peer.url, "tok", connect_timeout_s=1.0, read_timeout_s=30.0)
    errors: list[BaseException] = []

    def call() -> None:
        try:
            client.ingest(batch(1))
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=call)
    try:
        t.start()
        peer.wait_for_request()
        assert client.abort() == 1
        t.join(10.0)
        assert not t.is_alive()
        assert len(errors) == 1
        assert isinstance(errors[0], FleetUnavailable)
        assert not isinstance(errors[0], FleetDeadlineExceeded)
        assert "stopping" in str(errors[0])
        with pytest.raises(FleetUnavailable, match="stopping"):  # and every later call
            client.ingest(batch(1))
    finally:
        peer.close()
        client.close()


def _healthz(port: int) -> dict[str, object] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
            body: dict[str, object] = json.loads(resp.read())
            return body
    except urllib.error.HTTPError as exc:
        body = json.loads(exc.read())
        return body
    except OSError:
        return None


def test_a_hung_fleet_turns_healthz_yellow_and_sigterm_does_not_wait_for_it(
    tmp_path: Path,
) -> None:
    peer = TricklePeer("headers", interval_s=1.0, max_bytes=300)
    port = free_port()
    cfg = tmp_path / "agent.toml"
    cfg.write_text(
        f'[agent]\nstate_dir = "{tmp_path / "state"}"\nconsole_alerts = false\n'
        f"metrics_port = {port}\n"
        '[[streams]]\nname = "demo"\n[streams.source]\nkind = "simulator"\nspeed = 50.0\n'
        "[store]\naggregate_interval_s = 1\n"
        f'[fleet]\nenabled = true\nurl = "{peer.url}"\ntoken_env = "EDGE_FLEET_TOKEN"\n'
        "interval_s = 0.5\nconnect_timeout_s = 1\nread_timeout_s = 3\n"
    )
    env = dict(os.environ, EDGE_FLEET_TOKEN="tok")
    env.pop("NOTIFY_SOCKET", None)
    err = (tmp_path / "stderr.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "agent.cli", "run", "--config", str(cfg)],
                            env=env, stdout=subprocess.DEVNULL, stderr=err)
    try:
        peer.wait_for_request(timeout_s=90.0)
        uploader: dict[str, object] = {}
        deadline = time.monotonic() + 60.0
        while time.monotonic() < deadline:
            health = _healthz(port)
            comps = health.get("components", {}) if health else {}
            assert isinstance(comps, dict)
            uploader = comps.get("uploader") or {}
            if uploader.get("state") == "yellow":
                break
            time.sleep(0.2)
        assert uploader.get("state") == "yellow", uploader
        reason = str(uploader.get("reason"))
        assert "in flight" in reason or "total deadline" in reason, reason
        assert proc.poll() is None

        peer.wait_for_open()  # a request is hanging right now
        proc.send_signal(signal.SIGTERM)
        # bounded by the stop timeouts (a few seconds), not by the peer (300 s)
        assert proc.wait(timeout=40) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        err.close()
        peer.close()
    log = (tmp_path / "stderr.log").read_text()
    assert "total deadline" in log


def test_a_hung_http_proxy_is_cut_at_the_deadline_too() -> None:
    proxy = TricklePeer("headers", interval_s=1.0, max_bytes=120)  # answers as a proxy would
    session = requests.Session()
    session.trust_env = False
    session.proxies = {"http": proxy.url}
    client = FleetClient("http://fleet.invalid:8700", "tok", session=session,
                         connect_timeout_s=1.0, read_timeout_s=2.0)
    try:
        with pytest.raises(FleetDeadlineExceeded):
            client.ingest(batch(1))
        assert proxy.requests and "http://fleet.invalid:8700/v1/ingest" in proxy.requests[0]
        proxy.wait_for_cut()
    finally:
        proxy.close()
        session.close()


def test_an_https_upload_to_a_trickling_fleet_ends_at_its_total_deadline(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    peer = TricklePeer("body", interval_s=1.0, max_bytes=120, tls=(cert, key))
    session = requests.Session()
    session.trust_env = False  # REQUESTS_CA_BUNDLE would win over session.verify
    session.verify = str(cert)
    client = FleetClient(peer.url, "tok", session=session, connect_timeout_s=1.0,
                         read_timeout_s=2.0)
    try:
        with pytest.raises(FleetDeadlineExceeded):
            client.ingest(batch(1))
        assert peer.requests  # the TLS handshake and the request went through
        peer.wait_for_cut()
    finally:
        peer.close()
        session.close()
