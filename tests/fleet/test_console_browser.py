"""The console in a real browser: Debian's chromium driven by Playwright, against a real
``edge-fleet serve`` process fed by the real device client (:class:`cloud_sync.client.
FleetClient`) and set up with the real CLI (``edge-fleet user add``).

Playwright's own browser builds are never installed or downloaded: the test launches
``/usr/bin/chromium`` (``apt-get install chromium``; CI installs it) and skips, with that
reason, only when it is absent. Screenshots go to the test's tmp dir (the paths are printed).
Runs on SQLite (the routes the console calls run on both databases in
tests/fleet/test_console_data.py and test_accounts.py).
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from cloud_sync.client import FleetClient
from cloud_sync.health import HealthSummary, StreamHealth
from cloud_sync.protocol import IngestBatch, ModelStatusReport
from tests.fleet.conftest import wait_healthy
from tests.fleet.live import Receiver, wait_for
from tests.fleet.model_pkg import archive, make_keys
from tests.fleet.wire import aggregate, alert, batch

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
EXE = shutil.which("edge-fleet")
CMD = [EXE] if EXE else [sys.executable, "-m", "fleet.cli"]
ENV = {k: v for k, v in os.environ.items() if k != "EDGE_FLEET_ADMIN_TOKEN"}
PASSWORD = "console test password"
XSS = "<img src=x onerror=window.__xss=1>"
#: Aggregates of gw1/pump1, one a minute, the newest a minute ago (all within the last 6 h).
N_AGGREGATES = 90
#: Older ones, 2..3 days ago: seen only when the plot zooms out to 7 days.
N_OLD = 20
#: gw1's camera stream (after pump1 in name order: the plot opens on pump1) and its alert, whose
#: frame and heatmap the device uploads (rendered by the agent's own snapshot renderer).
CAM, CAM_ALERT = "yard-cam", "gw1:yard-cam:1"
FRAME_W, FRAME_H = 320, 240

try:
    from playwright.sync_api import expect
except ImportError:  # the test extra is not installed: the module is skipped below
    expect = None

pytestmark = pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK),
                                reason=f"{CHROMIUM} is absent (apt-get install chromium)")
# Waits use Playwright's locator assertions: page.wait_for_function evaluates a string, which
# the console's Content-Security-Policy (no 'unsafe-eval') refuses, as it should.


@dataclass
class Fleet:
    base: str
    admin: dict[str, str]
    tokens: dict[str, str]
    shots: Path
    #: A signed package archive of skab-wstat@8, not pushed yet.
    archive_v8: Path
    #: The webhook receiver (answers 500 until a test changes its status).
    receiver: Receiver


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cli(*args: Any) -> str:
    out = subprocess.run([*CMD, *map(str, args)], capture_output=True, text=True, env=ENV,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    return out.stdout


def _camera_images() -> tuple[bytes, bytes]:
    """A synthetic yard frame (JPEG) with a bright object, and its heatmap (PNG), rendered by
    the agent's snapshot renderer (agent/services/snapshot_render.py) as a camera stream does."""
    import numpy as np  # noqa: PLC0415
    pytest.importorskip("PIL")
    from agent.services.snapshot_render import frame_jpeg, heatmap_png  # noqa: PLC0415

    yy, xx = np.mgrid[0:FRAME_H, 0:FRAME_W]
    frame = np.stack([60 + xx * 80 // FRAME_W, 70 + yy * 60 // FRAME_H,
                      90 + 0 * xx], axis=-1).astype(np.uint8)
    frame[40:200:40, :] = 150  # rails
    frame[120:170, 200:250] = (40, 200, 240)  # the anomaly: an object on the rails (BGR)
    rows, cols = np.mgrid[0:6, 0:8]
    patch = 0.3 + 2.2 * np.exp(-((rows - 3.6) ** 2 + (cols - 5.6) ** 2) / 1.5)
    return (frame_jpeg(frame, 320, 85),
            heatmap_png(frame, patch, threshold=1.0, max_edge=320,
                        text={"alert_id": CAM_ALERT, "model": "yard-padim@2"}))


def _feed(base: str, admin: dict[str, str], tmp: Path, key: Path) -> dict[str, str]:
    """Enroll gw1, gw2 (tag line=1), upload through the device client (a camera alert with
    its frame and heatmap included), push a package."""
    tokens = {}
    for dev in ("gw1", "gw2"):
        r = requests.post(f"{base}/v1/devices", json={"device_id": dev, "tags": ["line=1"]},
                          headers=admin, timeout=10)
        assert r.status_code == 201, r.text
        tokens[dev] = r.json()["token"]
    now = float(int(time.time()))  # whole seconds: record ids are interval_start in ms
    recent = [aggregate("gw1", "pump1", now - 60 * (N_AGGREGATES - i), max_score=0.2 + 0.01 * i)
              for i in range(N_AGGREGATES)]
    old = [aggregate("gw1", "pump1", now - 2 * 86400 - 60 * i, max_score=0.3)
           for i in range(N_OLD)]
    hostile = alert("gw1", "pump1", 1, now - 1800, threshold=0.9,
                    top_channels=[{"channel": XSS, "contribution": 0.9}])
    camera = alert("gw1", CAM, 1, now - 2400, score=2.5, threshold=1.0, top_channels=[],
                   model={"name": "yard-padim", "version": 2})
    client = FleetClient(base, tokens["gw1"])
    doc = batch("gw1", [*recent, *old, hostile, camera], agent_version=XSS, sent_at=now)
    result = client.ingest(IngestBatch.model_validate(doc))
    assert {r.status for r in result.results} == {"accepted"}, [
        r for r in result.results if r.status != "accepted"][:3]
    jpeg, png = _camera_images()
    client.put_snapshot("gw1", CAM_ALERT, "snapshot", jpeg)
    client.put_snapshot("gw1", CAM_ALERT, "heatmap", png)
    other = FleetClient(base, tokens["gw2"])
    other.ingest(IngestBatch.model_validate(
        batch("gw2", [aggregate("gw2", "fan", now - 120),  # and one 3 h ahead (a fast simulator)
                      aggregate("gw2", "fan", now + 3 * 3600)], sent_at=now)))
    # health reports: gw1 green, gw2 yellow with a hostile reason (shown as text, amber)
    client.post_health(HealthSummary(
        device_id="gw1", at=now, status="green", agent_version=XSS,
        streams=[StreamHealth(stream="pump1", state="green")]))
    other.post_health(HealthSummary(
        device_id="gw2", at=now, status="yellow", reasons=[f"source:fan: {XSS}"],
        streams=[StreamHealth(stream="fan", state="yellow", reason=XSS)]))
    client.close()
    other.close()
    pkg = archive(tmp, 7, key)
    r = requests.post(f"{base}/v1/models", data=pkg, timeout=30,
                      headers={**admin, "Content-Type": "application/gzip"})
    assert r.status_code == 201, r.text
    return tokens


@dataclass
class Served:
    """A running ``edge-fleet serve``: its URL, database URL, state dir and admin header."""

    base: str
    db: str
    state: Path
    admin: dict[str, str]


@contextmanager
def _serving(tmp_path: Path, *serve_args: str) -> Iterator[Served]:
    """``edge-fleet serve`` on a free port and a SQLite file in ``tmp_path``, with the users
    vera (viewer), otto (operator) and ada (admin) added by ``edge-fleet user add``."""
    port = _free_port()
    state = tmp_path / "state"
    db = f"sqlite:///{tmp_path / 'fleet.db'}"
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*CMD, "serve", "--db", db, "--port", str(port), "--state-dir", str(state),
             *serve_args],
            stdout=out, stderr=subprocess.STDOUT, env=ENV,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, proc, log, 60)
        admin = {"Authorization": f"Bearer {(state / 'admin.token').read_text().strip()}"}
        pw = tmp_path / "pw"
        pw.write_text(PASSWORD + "\n")
        for name, role in (("vera", "viewer"), ("otto", "operator"), ("ada", "admin")):
            _cli("user", "add", name, "--role", role, "--password-file", pw, "--db", db,
                 "--state-dir", state)
        yield Served(base=base, db=db, state=state, admin=admin)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert "Traceback" not in log.read_text()


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    key, trusted = make_keys(tmp_path / "keys")
    receiver = Receiver(status=500).start()
    try:
        with _serving(tmp_path, "--trusted-keys", str(trusted), "--webhook-max-attempts", "2",
                      "--webhook-backoff", "0.2") as served:
            base, admin = served.base, served.admin
            tokens = _feed(base, admin, tmp_path, key)
            shots = tmp_path / "screenshots"
            shots.mkdir()
            v8 = tmp_path / "skab-wstat-8.tar.gz"
            v8.write_bytes(archive(tmp_path, 8, key))
            yield Fleet(base=base, admin=admin, tokens=tokens, shots=shots, archive_v8=v8,
                        receiver=receiver)
    finally:
        receiver.stop()


@pytest.fixture
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright  # noqa: PLC0415 (test extra)


    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


def _shot(page: Any, fleet: Fleet | Path, name: str) -> None:
    path = (fleet if isinstance(fleet, Path) else fleet.shots) / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")


def _login(browser: Any, fleet: Fleet | Served, user: str) -> Any:
    page = browser.new_context().new_page()
    page.set_default_timeout(30_000)
    page.goto(f"{fleet.base}/console/")
    page.fill("#login-user", user)
    page.fill("#login-password", PASSWORD)
    page.click("#login-submit")
    page.wait_for_selector("#devices")
    assert page.text_content("#whoami") is not None
    return page


def _natural_size(img: Any) -> tuple[int, int]:
    """The image's decoded size once it loaded (0 x 0 while loading or when it failed)."""
    deadline = time.monotonic() + 20
    while True:
        size = img.evaluate("i => i.complete ? [i.naturalWidth, i.naturalHeight] : null")
        if size is not None or time.monotonic() > deadline:
            return (int(size[0]), int(size[1])) if size else (0, 0)
        time.sleep(0.1)


def _device_ids(page: Any) -> list[str]:
    return [t.strip() for t in page.locator("#devices a.device-link").all_text_contents()]


def test_viewer_sees_devices_and_reads_the_plot(browser: Any, fleet: Fleet) -> None:
    # gw1's pump1 runs v7 and refused v8 (docs/rollouts.md: RollbackRefused): it still runs v7
    gw1 = FleetClient(fleet.base, fleet.tokens["gw1"])
    for version, state, why in ((7, "active", None), (8, "rejected", "RollbackRefused: old")):
        gw1.report_status(ModelStatusReport(device_id="gw1", stream="pump1", name="skab-wstat",
                                            version=version, reason=why, at=time.time(),
                                            state=state))  # type: ignore[arg-type]
    gw1.close()
    page = browser.new_context().new_page()
    page.set_default_timeout(30_000)
    page.goto(f"{fleet.base}/console/")
    expect(page.locator("#login-form")).to_be_visible()
    expect(page.locator("#top")).to_be_hidden()  # no nav bar or "Log out" before login
    page.fill("#login-user", "vera")
    page.fill("#login-password", "not the password")
    page.click("#login-submit")
    expect(page.locator("#login-error")).to_have_text("Wrong username or password.")
    _shot(page, fleet, "login-refused")

    page = _login(browser, fleet, "vera")
    assert page.text_content("#whoami") == "vera (viewer)"
    assert _device_ids(page) == ["gw1", "gw2"]
    row = page.locator("#devices tbody tr").first
    cells = row.locator("td").all_text_contents()
    assert cells[4] == XSS  # hostile agent version shown as text
    assert "online" in cells[1] and cells[2] == "green" and "line=1" in cells[7]
    assert cells[5] == "pump1: skab-wstat@7", cells
    assert row.locator(".health-ok").count() == 1
    row2 = page.locator("#devices tbody tr").nth(1)
    cells2 = row2.locator("td").all_text_contents()
    assert "online" in cells2[1] and cells2[2] == f"yellow: source:fan: {XSS}"
    assert row2.locator(".health-stale").count() == 1  # a yellow report: amber
    assert page.locator("#devices img").count() == 0
    _shot(page, fleet, "devices")
    # the page refreshes itself: a device enrolled meanwhile appears without a reload
    expect(page.locator("#devices-refresh")).to_contain_text("Refreshes every 15 s")
    r = requests.post(f"{fleet.base}/v1/devices", json={"device_id": "gw3"}, headers=fleet.admin,
                      timeout=10)
    assert r.status_code == 201, r.text
    expect(page.locator("#devices a.device-link")).to_have_count(3, timeout=25_000)

    page.click("#devices a.device-link >> text=gw1")
    page.wait_for_selector("#score-plot")
    # the default range is all the stream's data (the old ones too), whatever "now" is
    assert page.get_attribute("#score-plot", "data-points") == str(N_AGGREGATES + N_OLD)
    assert page.locator("#score-plot text.y-tick").first.evaluate(
        "t => getComputedStyle(t).fontSize") == "12px"
    own = page.locator("#device-health tbody td").all_text_contents()
    assert "online" in own[0] and own[1] == "green" and own[4] == XSS
    streams = page.locator("#streams tbody td").all_text_contents()
    assert streams[1:4] == ["skab-wstat@7", "activerejected skab-wstat@8: RollbackRefused: old",
                            "green"], streams
    # timestamps and model@version never wrap (1280 px wide): one line each
    for cell in ("#alerts tbody td:nth-child(1)", "#alerts tbody td:nth-child(8)",
                 "#model-history tbody td:nth-child(1)", "#model-history tbody td:nth-child(3)"):
        assert page.locator(cell).first.evaluate(
            "td => [getComputedStyle(td.firstElementChild || td).whiteSpace, new Set("
            "[...td.firstElementChild.getClientRects()].map((r) => Math.round(r.top))).size]"
        ) == ["nowrap", 1], cell
    assert page.locator("#score-plot polyline.threshold").count() == 1
    # scores 0.2..1.09, threshold 0.9: ticks in steps of 0.5 up to 1.5 (1, 2, 5 x 10^k)
    assert page.locator("#score-plot text.y-tick").all_text_contents() == [
        "0.0", "0.5", "1.0", "1.5"]
    assert page.locator("#plot-ahead").count() == 0  # no score later than now
    rows = page.locator("#alerts tbody tr")
    assert rows.count() == 2 and rows.first.get_attribute("data-event") == "raised"
    assert [r.get_attribute("data-episode") for r in rows.all()] == ["gw1:pump1:1", CAM_ALERT]
    alerts_text = page.text_content("#alerts")
    assert alerts_text is not None and XSS in alerts_text  # hostile channel name, as text
    assert page.locator("#alerts img").count() == 0  # the hostile <img> stayed text
    assert page.locator("#view button.ack").count() == 0  # a viewer acknowledges nothing
    # the camera alert's frame and heatmap, loaded with the session cookie
    figures = page.locator("#snapshots figure")
    assert figures.count() == 1 and figures.first.get_attribute("data-alert") == CAM_ALERT
    frame, heat = page.locator("#snapshots img[data-kind=snapshot]"), page.locator(
        "#snapshots img[data-kind=heatmap]")
    assert frame.get_attribute("alt", timeout=5000) is not None
    assert (frame.get_attribute("alt") or "").startswith(f"Camera frame of alert {CAM_ALERT}")
    assert (heat.get_attribute("alt") or "").startswith(f"Anomaly heatmap of alert {CAM_ALERT}")
    assert _natural_size(frame) == (FRAME_W, FRAME_H)
    heat_w, heat_h = _natural_size(heat)
    assert heat_w == FRAME_W and heat_h > FRAME_H  # the frame plus the legend strip
    _shot(page, fleet, "device-all-data")
    heat.click()  # enlarges it in a dialog; a click anywhere closes it
    expect(page.locator("#enlarged")).to_be_visible()
    assert _natural_size(page.locator("#enlarged-img")) == (heat_w, heat_h)
    expect(page.locator("#enlarged-caption")).to_contain_text(f"heatmap of alert {CAM_ALERT}")
    _shot(page, fleet, "device-snapshot-enlarged")
    page.locator("#enlarged").click()
    expect(page.locator("#enlarged")).to_be_hidden()
    assert page.locator("#nav-webhooks").is_hidden()  # a viewer has no Webhooks page
    page.click("#ranges button >> text=24 h")
    expect(page.locator("#score-plot")).to_have_attribute("data-points", str(N_AGGREGATES))
    page.click("#ranges button >> text=7 d")
    expect(page.locator("#score-plot")).to_have_attribute("data-points",
                                                          str(N_AGGREGATES + N_OLD))
    _shot(page, fleet, "device-7d")
    assert page.evaluate("window.__xss === undefined")

    page.goto(f"{fleet.base}/console/#/alerts")
    page.wait_for_selector("#alert-filters")
    page.fill("#alert-filters input[name=device]", "gw1")
    page.select_option("#alert-filters select[name=since_s]", str(86400))
    page.click("#alert-filters button[type=submit]")
    drawn = expect(page.locator("#view"))
    drawn.to_have_attribute("data-route", "#/alerts?device=gw1&since_s=86400")
    expect(page.locator("#alert-timeline")).to_have_attribute("data-alerts", "2")
    page.fill("#alert-filters input[name=device]", "gw2")
    page.click("#alert-filters button[type=submit]")
    drawn.to_have_attribute("data-route", "#/alerts?device=gw2&since_s=86400")
    expect(page.locator("#alert-timeline")).to_have_attribute("data-alerts", "0")
    _shot(page, fleet, "alerts-filtered")

    # gw2's newest score is 3 h ahead of now: the range ends there and says so
    page.goto(f"{fleet.base}/console/#/device/gw2")
    expect(page.locator("#score-plot")).to_have_attribute("data-points", "2")
    expect(page.locator("#plot-ahead")).to_contain_text("later than now")
    expect(page.locator("#snapshots")).to_have_text("No camera snapshots among the recent alerts.")
    page.click("#ranges button >> text=1 h")
    expect(page.locator("#score-plot")).to_have_attribute("data-points", "1")
    _shot(page, fleet, "device-ahead")
    # an unknown device: the error replaces gw2's page
    page.goto(f"{fleet.base}/console/#/device/nosuch")
    expect(page.locator("#page-error")).to_have_text("No device named nosuch.")
    assert page.locator("#view h1").all_text_contents() == ["Not found"]
    page.goto(f"{fleet.base}/console/#/rollout/99")
    expect(page.locator("#page-error")).to_have_text("No rollout 99.")

    page.goto(f"{fleet.base}/console/#/registry")
    page.wait_for_selector("#models")
    assert "skab-wstat" in (page.text_content("#models") or "")
    assert page.locator("#push-form").count() == 0
    page.click("#logout")
    expect(page.locator("#login-form")).to_be_visible()
    expect(page.locator("#top")).to_be_hidden()
    assert page.text_content("#whoami") == ""


def test_operator_starts_and_aborts_a_rollout_viewer_is_refused(
    browser: Any, fleet: Fleet
) -> None:
    op = _login(browser, fleet, "otto")
    op.goto(f"{fleet.base}/console/#/registry")
    op.wait_for_selector("#push-form")
    op.set_input_files("#push-form input[name=archive]", str(fleet.archive_v8))
    op.click("#push-submit")
    expect(op.locator("#flash")).to_contain_text("Pushed skab-wstat@8")
    expect(op.locator("#models")).to_contain_text("otto")
    _shot(op, fleet, "registry-pushed")
    op.goto(f"{fleet.base}/console/#/rollouts")
    op.wait_for_selector("#rollout-form")
    expect(op.locator("#rollouts tbody tr.empty")).to_have_text("nothing yet")
    op.fill("#rollout-form input[name=version]", "8")
    op.fill("#rollout-form input[name=target]", "line=1")
    op.fill("#rollout-form input[name=canary]", "50")
    op.click("#rollout-create")
    op.wait_for_selector("#rollout-state")
    assert op.text_content("#rollout-state") == "canary"
    expect(op.locator("#flash")).to_be_visible()  # seen on its page
    expect(op.locator("#flash")).to_contain_text(f"Rollout {op.url.rsplit('/', 1)[1]} created")
    # only the actions the fleet accepts in canary (resume is not one)
    assert [b.get_attribute("id") for b in op.locator("#rollout-actions button").all()] == [
        "rollout-promote", "rollout-pause", "rollout-abort"]
    assert op.locator("#rollout-actions button").all_text_contents() == [
        "Promote", "Pause", "Abort"]
    rollout_url = op.url
    _shot(op, fleet, "rollout-created")

    # the canary device takes it and reports, through the real device client
    rollout_id = int(rollout_url.rsplit("/", 1)[1])
    detail = requests.get(f"{fleet.base}/v1/rollouts/{rollout_id}", headers=fleet.admin,
                          timeout=10).json()
    canary = next(d["device_id"] for d in detail["devices"] if d["canary"])
    device = FleetClient(fleet.base, fleet.tokens[canary])
    assigned = device.assignment("pump1")
    assert assigned is not None and assigned.version == 8
    device.report_status(ModelStatusReport(device_id=canary, stream="pump1", name="skab-wstat",
                                           version=8, rollout_id=rollout_id, state="active",
                                           at=time.time()))
    device.close()
    # at once, before the page's next refresh: the question is built from the rollout as it is
    # now, so it says the active canary keeps the version (this fleet has no rollback key)
    op.once("dialog", lambda dialog: dialog.dismiss())
    with op.expect_event("dialog") as shown:
        op.click("#rollout-abort")
    dialogs = [shown.value.message]
    assert "Abort rollout" in dialogs[0]
    assert f"({canary}) KEEP it" in dialogs[0] and "--rollback-key" in dialogs[0], dialogs[0]
    assert op.text_content("#rollout-state") == "canary"  # dismissed: nothing happened

    viewer = _login(browser, fleet, "vera")
    viewer.goto(rollout_url)
    viewer.wait_for_selector("#rollout-state")
    assert viewer.text_content("#rollout-state") == "canary"
    assert viewer.locator("#view button").count() == 0  # a viewer is offered no action
    viewer.goto(f"{fleet.base}/console/#/rollouts")
    viewer.wait_for_selector("#rollouts")
    assert viewer.locator("#rollout-form").count() == 0
    _shot(viewer, fleet, "rollout-viewer-no-actions")

    # the operator's page was left open: it refreshes itself while the rollout runs
    expect(op.locator("#rollout-devices")).to_contain_text("active (@8)", timeout=30_000)
    op.once("dialog", lambda dialog: dialog.accept())
    op.click("#rollout-abort")
    expect(op.locator("#rollout-state")).to_have_text("aborted")
    expect(op.locator("#flash")).to_contain_text(f"{canary} keep skab-wstat@8")
    expect(op.locator("#flash")).to_contain_text("--rollback-key")
    assert op.get_attribute("#flash", "class") != "ok"  # a warning, not "done"
    assert op.locator("#rollout-actions button").count() == 0
    expect(op.locator("#rollout-refresh")).to_have_text("final (aborted): not refreshed")
    _shot(op, fleet, "rollout-aborted")

    op.goto(f"{fleet.base}/console/#/audit")
    op.wait_for_selector("#audit")
    audit = op.text_content("#audit") or ""
    assert "rollout.create" in audit and "rollout.abort" in audit and "otto" in audit
    assert "null" not in (op.text_content("#view") or "").replace(audit, "")
    _shot(op, fleet, "audit")
    op.fill("#audit-filters input[name=action]", "rollout.abort")
    op.click("#audit-filters button[type=submit]")
    expect(op.locator("#view")).to_have_attribute("data-route", "#/audit?action=rollout.abort")
    actions = op.locator("#audit tbody tr td:nth-child(4)").all_text_contents()
    assert actions == ["rollout.abort"]
    op.fill("#audit-filters input[name=action]", "no.such.action")
    op.click("#audit-filters button[type=submit]")
    expect(op.locator("#audit tbody tr.empty")).to_have_text("No entries match these filters.")

    # acknowledging an episode's raised record, with a note
    op.goto(f"{fleet.base}/console/#/alerts")
    op.wait_for_selector("#alerts button.ack")
    pump = op.locator('#alerts tr[data-episode="gw1:pump1:1"]')
    pump.locator("input.ack-note").fill("pump checked")
    pump.locator("button.ack").click()
    expect(pump).to_contain_text("otto at")
    expect(pump).to_contain_text("pump checked")
    assert pump.locator("button.ack").count() == 0
    assert op.locator("#alerts button.ack").count() == 1  # the camera episode: not yet


def test_admin_sees_dead_letters_and_redelivers_others_do_not(
    browser: Any, fleet: Fleet
) -> None:
    hook = requests.post(f"{fleet.base}/v1/webhooks", headers=fleet.admin, timeout=10, json={
        "url": fleet.receiver.url, "events": ["alert"], "secret": "console-test-" + "s" * 12})
    assert hook.status_code == 201, hook.text
    device = FleetClient(fleet.base, fleet.tokens["gw2"])
    device.ingest(IngestBatch.model_validate(batch("gw2", [alert("gw2", "fan", 1, time.time())])))
    device.close()
    # the receiver answers 500: two attempts (serve --webhook-max-attempts 2), then dead
    dead = wait_for(lambda: requests.get(f"{fleet.base}/v1/webhooks/deliveries?state=dead",
                                         headers=fleet.admin, timeout=10).json()["deliveries"],
                    "the dead letter")
    assert len(dead) == 1 and dead[0]["attempts"] == 2 and len(fleet.receiver.got) == 2

    for user in ("vera", "otto"):  # the API is admin-only: no link, and the page is refused
        page = _login(browser, fleet, user)
        assert page.locator("#nav-webhooks").is_hidden()
        page.goto(f"{fleet.base}/console/#/webhooks")
        expect(page.locator("#flash")).to_contain_text("Refused (403)")
        expect(page.locator("#refused")).to_contain_text(f"refused this to {user}")
        assert page.locator("#deliveries").count() == 0
        assert page.locator("#devices").count() == 0  # the page before it is not left shown
        if user == "otto":
            _shot(page, fleet, "webhooks-operator-refused")
        else:  # the session ends (its cookie is gone): the login form says so
            page.context.clear_cookies()
            page.goto(f"{fleet.base}/console/#/devices")
            expect(page.locator("#login-error")).to_have_text(
                "Your session has ended: log in again.")
            expect(page.locator("#top")).to_be_hidden()
        page.context.close()

    page = _login(browser, fleet, "ada")
    page.click("#nav-webhooks")
    page.wait_for_selector("#deliveries")
    expect(page.locator("#webhooks")).to_contain_text(fleet.receiver.url)
    row = page.locator("#deliveries tbody tr")
    assert row.count() == 1 and row.first.get_attribute("data-state") == "dead"
    cells = row.first.locator("td").all_text_contents()
    assert cells[0] == str(dead[0]["id"]) and cells[1] == fleet.receiver.url
    assert cells[2] == "alert" and cells[3] == "2" and cells[4] == "500"
    assert "gw2:fan:1" in cells[8]  # the body as sent
    _shot(page, fleet, "webhooks-dead-letters")

    fleet.receiver.status = 204  # the receiver is fixed: redeliver
    row.first.locator("button.redeliver").click()
    expect(page.locator("#flash")).to_contain_text(f"Delivery {dead[0]['id']} queued again")
    # the receiver records the POST before it answers: wait for the fleet to mark it delivered
    wait_for(lambda: requests.get(f"{fleet.base}/v1/webhooks/deliveries?state=delivered",
                                  headers=fleet.admin, timeout=10).json()["deliveries"],
             "the redelivery")
    assert len(fleet.receiver.got) == 3
    page.click("#delivery-states >> text=delivered")
    expect(page.locator("#view")).to_have_attribute("data-route", "#/webhooks?state=delivered")
    expect(page.locator("#deliveries tbody tr")).to_have_attribute("data-state", "delivered")
    _shot(page, fleet, "webhooks-redelivered")
    page.click("#delivery-states >> text=dead letters")
    expect(page.locator("#deliveries tbody tr.empty")).to_have_text("nothing yet")
    page.goto(f"{fleet.base}/console/#/audit?action=webhook.redeliver")
    expect(page.locator("#audit tbody tr")).to_contain_text("ada")


def _agent_command() -> list[str]:
    exe = shutil.which("edge-agent")
    return [exe] if exe else [sys.executable, "-m", "agent.cli"]


def _sqlite_rows(path: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """Rows of ``sql`` on the SQLite file ``path``, read-only ([] while it does not exist)."""
    if not path.exists():
        return []
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        return list(conn.execute(sql, params))
    finally:
        conn.close()


#: Distinct intervals of one stream's aggregates, and those with a score (a point of the plot:
#: the series merges an interval's parts, max of their max_score, and draws non-null ones).
_INTERVALS = ("SELECT COUNT(DISTINCT interval_start), COUNT(DISTINCT CASE WHEN max_score IS "
              "NOT NULL THEN interval_start END), MIN(interval_start), MAX(interval_start) "
              "FROM aggregates WHERE device_id = ? AND stream = ?")


def test_console_shows_a_device_fed_by_a_real_agent(browser: Any, tmp_path: Path) -> None:
    """A real ``edge-agent run`` (a simulated pump with a fault, as fast as it goes, and a
    real-time second stream that keeps it running) enrolled with ``edge-fleet device add
    --token-file`` uploads aggregates, alerts and health reports to a real ``edge-fleet
    serve``; the viewer sees it online with the agent's version, its alerts, and a plot of as
    many points as the fleet holds scored intervals of the stream."""
    from agent import __version__  # noqa: PLC0415

    device = "gw7"
    with _serving(tmp_path) as served:
        token_file = tmp_path / "gw7.token"
        _cli("device", "add", device, "--tag", "line=2", "--token-file", token_file,
             "--db", served.db, "--state-dir", served.state)
        agent_state = tmp_path / "agent-state"
        config = tmp_path / "agent.toml"
        config.write_text(f"""
[agent]
device_id = "{device}"
state_dir = "{agent_state}"
console_alerts = false

[[streams]]
name = "pump1"
model = "builtin:skab-wstat"
[streams.source]
kind = "simulator"
speed = 0                 # 30 minutes of pump readings as fast as the agent scores them
duration_s = 1800
[[streams.source.faults]]
kind = "offset"
channel = "Volume Flow RateRMS"
start_s = 600.0
duration_s = 180.0
magnitude = -15.0

[[streams]]
name = "yard"             # real time: keeps the agent (and its health reports) running
model = "builtin:skab-wstat"
[streams.source]
kind = "simulator"
speed = 1

[fleet]
enabled = true
url = "{served.base}"
token_file = "{token_file}"
interval_s = 0.5
health_interval_s = 1
""")
        env = {k: v for k, v in ENV.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
        err = tmp_path / "agent.stderr"
        with err.open("wb") as fh:
            agent = subprocess.Popen([*_agent_command(), "run", "--config", str(config)],
                                     stdout=subprocess.DEVNULL, stderr=fh, env=env,
                                     cwd=tmp_path)
        fleet_db = tmp_path / "fleet.db"
        try:
            def listed() -> dict[str, Any]:
                got = requests.get(f"{served.base}/v1/devices?device={device}",
                                   headers=served.admin, timeout=10).json()["devices"]
                return dict(got[0])

            def everything_uploaded() -> bool:
                assert agent.poll() is None, err.read_text(errors="replace")[-3000:]
                d = listed()
                pump = [s for s in ((d["health"] or {}).get("streams") or [])
                        if s["stream"] == "pump1"]
                if d["state"] != "online" or not pump or "exhausted" not in (
                        pump[0]["reason"] or ""):
                    return False  # the pump's simulation has not ended yet
                mine = _sqlite_rows(agent_state / "agent.db",
                                    "SELECT COUNT(DISTINCT interval_start), "
                                    "SUM(uploaded_at IS NULL) FROM aggregates WHERE stream = ?",
                                    "pump1")
                if not mine or not mine[0][0] or mine[0][1]:
                    return False  # none yet, or some not acknowledged by the fleet
                held = _sqlite_rows(fleet_db, _INTERVALS, device, "pump1")
                return bool(held) and held[0][0] == mine[0][0]

            wait_for(everything_uploaded, "the agent's pump1 aggregates in the fleet", 240)
            intervals, scored, oldest, newest = _sqlite_rows(fleet_db, _INTERVALS, device,
                                                             "pump1")[0]
            # scored intervals only: the first ones, while the model calibrates, have no score
            assert 0 < scored < intervals, (scored, intervals)
            # all of them inside the plot's 24 h range (it ends at the newest score)
            span = (dt.datetime.fromisoformat(newest) - dt.datetime.fromisoformat(oldest))
            assert span < dt.timedelta(hours=23), (oldest, newest)
            alerts = wait_for(lambda: requests.get(
                f"{served.base}/v1/alerts?device={device}", headers=served.admin,
                timeout=10).json()["items"], "the agent's alerts in the fleet", 60)
            episodes = sorted({a["episode_id"] for a in alerts})
            assert {a["stream"] for a in alerts} == {"pump1"}
            assert "raised" in {a["event"] for a in alerts}
            health = listed()["health"]

            page = _login(browser, served, "vera")
            assert _device_ids(page) == [device]
            cells = page.locator("#devices tbody tr").first.locator("td").all_text_contents()
            assert "online" in cells[1], cells
            assert cells[2].startswith(health["status"]), (cells, health)
            assert cells[4] == __version__ and "line=2" in cells[7], cells
            page.screenshot(path=str(tmp_path / "agent-devices.png"), full_page=True)

            page.click(f"#devices a.device-link >> text={device}")
            page.wait_for_selector("#score-plot")
            assert page.get_attribute("#score-plot", "data-points") == str(scored)
            assert page.locator("#score-plot polyline.threshold").count() == 1
            # 30 simulated minutes from the agent's start: the newest score is ahead of now
            expect(page.locator("#plot-ahead")).to_contain_text("later than now")
            own = page.locator("#device-health tbody td").all_text_contents()
            assert "online" in own[0] and own[4] == __version__, own
            rows = page.locator("#alerts tbody tr")
            assert sorted({r.get_attribute("data-episode") for r in rows.all()}) == episodes
            assert rows.count() == len(alerts)
            assert "pump1" in (page.text_content("#alerts") or "")
            page.screenshot(path=str(tmp_path / "agent-device.png"), full_page=True)
            print(f"screenshots: {tmp_path}/agent-*.png")
            # the fleet still holds what the plot drew (the pump's input has ended)
            assert _sqlite_rows(fleet_db, _INTERVALS, device, "pump1")[0][1] == scored
            page.context.close()

            agent.send_signal(signal.SIGTERM)
            assert agent.wait(60) == 0, err.read_text(errors="replace")[-3000:]
        finally:
            if agent.poll() is None:
                agent.kill()
                agent.wait(10)
        log = err.read_text(errors="replace")
        assert "Traceback" not in log, log[-3000:]


def test_an_aborted_rollouts_page_follows_the_rollback(browser: Any, tmp_path: Path) -> None:
    """With ``--rollback-key``, aborting a rollout a device runs sends it back: the page says
    where it goes and, left open, refreshes until the device reports the rollback."""
    key, trusted = make_keys(tmp_path / "keys")
    _cli("keys", "generate", "--out", tmp_path / "rb", "--key-id", "fleet-rollback",
         "--role", "rollback")
    with _serving(tmp_path, "--trusted-keys", str(trusted),
                  "--rollback-key", str(tmp_path / "rb" / "fleet-rollback.key")) as served:
        r = requests.post(f"{served.base}/v1/devices", json={"device_id": "gw1"},
                          headers=served.admin, timeout=10)
        assert r.status_code == 201, r.text
        device = FleetClient(served.base, r.json()["token"])
        for version in (7, 8):
            r = requests.post(f"{served.base}/v1/models", data=archive(tmp_path, version, key),
                              headers={**served.admin, "Content-Type": "application/gzip"},
                              timeout=30)
            assert r.status_code == 201, r.text

        def report(version: int, state: str, rollout_id: int | None = None) -> None:
            device.report_status(ModelStatusReport(
                device_id="gw1", stream="pump1", name="skab-wstat", version=version,
                rollout_id=rollout_id, state=state, at=time.time()))  # type: ignore[arg-type]

        report(7, "active")
        r = requests.post(f"{served.base}/v1/rollouts", headers=served.admin, timeout=10,
                          json={"name": "skab-wstat", "version": 8, "devices": ["gw1"]})
        assert r.status_code == 201, r.text
        rollout = r.json()["id"]
        report(8, "active", rollout)

        op = _login(browser, served, "otto")
        op.goto(f"{served.base}/console/#/rollout/{rollout}")
        expect(op.locator("#rollout-devices")).to_contain_text("active (@8)")
        expect(op.locator("#rollout-refresh")).to_contain_text("final (completed")
        dialogs: list[str] = []

        def accept(dialog: Any) -> None:
            dialogs.append(dialog.message)
            dialog.accept()

        op.once("dialog", accept)
        op.click("#rollout-abort")
        expect(op.locator("#rollout-state")).to_have_text("aborted")
        assert "(gw1) are sent back" in dialogs[0], dialogs
        expect(op.locator("#flash")).to_contain_text("gw1 goes back to skab-wstat@7")
        expect(op.locator("#rollout-rolling-back")).to_contain_text(
            "gw1 to skab-wstat@7 (active (@8))")
        _shot(op, tmp_path, "rollout-rolling-back")
        # the device takes the signed rollback and reports it; the page left open follows
        assigned = device.assignment("pump1")
        assert assigned is not None and assigned.version == 7
        report(7, "shadow", rollout)
        expect(op.locator("#rollout-rolling-back")).to_contain_text("(shadow (@7))",
                                                                    timeout=30_000)
        report(7, "rolled_back", rollout)
        expect(op.locator("#rollout-devices")).to_contain_text("rolled_back (@7)",
                                                               timeout=30_000)
        expect(op.locator("#rollout-rolling-back")).to_have_count(0)
        # final: "this page refreshes until each device reports it" is gone with the refresh
        expect(op.locator("#rollout-refresh")).to_have_text("final (aborted): not refreshed")
        expect(op.locator("#flash")).to_be_hidden()
        device.close()
        # a newer rollout of gw1 supersedes it: the page links to it and offers no action
        r = requests.post(f"{served.base}/v1/rollouts", headers=served.admin, timeout=10,
                          json={"name": "skab-wstat", "version": 8, "devices": ["gw1"]})
        assert r.status_code == 201, r.text
        op.reload()
        expect(op.locator("#rollout-superseded")).to_contain_text(f"rollout {r.json()['id']}")
        expect(op.locator("#rollout-refresh")).to_contain_text("final (superseded by rollout")
        assert op.locator("#rollout-actions button").count() == 0
