"""Operations against real peers: sd_notify over a real unix datagram socket, /metrics and
/healthz over HTTP, the dashboard's and rules' metric names against a live agent, promtool,
``edge-agent status``, SIGHUP reload and SIGTERM on the real CLI process."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.app import Agent
from agent.config.loader import parse_config
from agent.config.schema import AgentConfig
from agent.httpd import OpsServer
from agent.inference import rank_child
from agent.metrics import Metrics
from agent.systemd import Notifier

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "ops" / "grafana" / "edge-agent.json"
RULES = REPO / "ops" / "prometheus" / "edge-agent-rules.yml"
CHANNELS = [
    "Accelerometer1RMS", "Accelerometer2RMS", "Current", "Pressure", "Temperature",
    "Thermocouple", "Voltage", "Volume Flow RateRMS",
]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class NotifySocket:
    """A bound AF_UNIX datagram socket collecting sd_notify messages with their arrival time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.1)
        self.messages: list[tuple[float, dict[str, str]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            fields = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
            self.messages.append((time.monotonic(), fields))

    def times(self, key: str, after: float = 0.0) -> list[float]:
        return [t for t, f in list(self.messages) if key in f and t >= after]

    def first(self, key: str) -> float | None:
        found = self.times(key)
        return found[0] if found else None

    def wait_for(self, key: str, timeout: float = 30.0) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            t = self.first(key)
            if t is not None:
                return t
            time.sleep(0.02)
        raise AssertionError(f"no {key} within {timeout} s; got {self.messages}")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2.0)
        self.sock.close()


@pytest.fixture
def notify(tmp_path: Path) -> Iterator[NotifySocket]:
    ns = NotifySocket(tmp_path / "notify.sock")
    yield ns
    ns.close()


def _config(tmp_path: Path, *, metrics_port: int | None = None, stall: float | None = None,
            speed: float = 50.0) -> AgentConfig:
    lines = [
        "[agent]", f'state_dir = "{tmp_path / "state"}"', "console_alerts = false",
    ]
    if metrics_port is not None:
        lines.append(f"metrics_port = {metrics_port}")
    lines += ["[[streams]]", 'name = "demo"']
    if stall is not None:
        lines.append(f"stall_after_s = {stall}")
    lines += ["[streams.source]", 'kind = "simulator"', f"speed = {speed}"]
    return parse_config("\n".join(lines) + "\n", env={})


class BlockingSource:
    """A live source whose reader hangs forever (until the test releases it)."""

    def __init__(self, stream: str, release: threading.Event) -> None:
        self.stream = stream
        self.channels = tuple(CHANNELS)
        self.release = release

    def run(self, emit: object, reject: object, stop: threading.Event) -> None:
        self.release.wait()  # ignores stop: a wedged read


def _http(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _run_in_thread(agent: Agent) -> threading.Thread:
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    return thread


# -- sd_notify: the protocol an in-process agent speaks ------------------------------------------


def test_ready_then_watchdog_at_half_watchdog_usec(
    tmp_path: Path, notify: NotifySocket, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "1000000")  # systemd's WatchdogSec=1 -> ping every 0.5 s
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    config = _config(tmp_path).resolved(tmp_path)
    agent = Agent(config, Metrics(), console=None, notifier=Notifier(str(notify.path)))
    thread = _run_in_thread(agent)
    try:
        ready = notify.wait_for("READY")
        time.sleep(3.0)
    finally:
        agent.request_stop()
        thread.join(20)
    assert not thread.is_alive()
    extend = notify.first("EXTEND_TIMEOUT_USEC")
    assert extend is not None and extend < ready  # start-up steps asked for time before READY
    pings = notify.times("WATCHDOG", after=ready)
    assert len(pings) >= 4, pings
    gaps = [b - a for a, b in itertools.pairwise(pings)]
    assert max(gaps) < 1.0, gaps  # never as long as WATCHDOG_USEC
    assert any("STATUS" in f for _, f in notify.messages)
    stopping = notify.wait_for("STOPPING", timeout=5)
    assert stopping > ready


def test_the_start_is_extended_while_a_child_ranks_the_runtimes(
    tmp_path: Path, notify: NotifySocket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first start times the runtimes in a child process: the agent keeps asking systemd for
    start-up time while it runs, so the child's own timeout ends a hung child, not systemd's
    (one start step of 120 s). This child waits for the agent's first request."""
    monkeypatch.setattr(rank_child, "PROGRESS_S", 0.2)
    site, go = tmp_path / "site", tmp_path / "go"
    site.mkdir()
    (site / "sitecustomize.py").write_text(  # gives up (exit 3) after 30 s without a request
        "import os, sys, time\nend = time.monotonic() + 30\n"
        f"while not os.path.exists({str(go)!r}):\n"
        "    if time.monotonic() > end:\n        sys.exit(3)\n    time.sleep(0.05)\n")
    monkeypatch.setenv("PYTHONPATH", str(site))
    status = "ranking the runtimes of stream demo"

    def release() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if any(f.get("STATUS") == status and "EXTEND_TIMEOUT_USEC" in f
                   for _, f in list(notify.messages)):
                go.touch()
                return
            time.sleep(0.05)

    releaser = threading.Thread(target=release, daemon=True)
    releaser.start()
    config = _config(tmp_path).resolved(tmp_path)
    agent = Agent(config, Metrics(), console=None, notifier=Notifier(str(notify.path)))
    thread = _run_in_thread(agent)
    try:
        notify.wait_for("READY", timeout=60)
    finally:
        agent.request_stop()
        thread.join(20)
    assert go.exists(), "the agent never reported progress while the child ran"
    assert (tmp_path / "state" / "backend-choices.json").exists()  # the child's ranking


def test_no_watchdog_while_a_reader_is_stuck(
    tmp_path: Path, notify: NotifySocket, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "1000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    release = threading.Event()
    config = _config(tmp_path, stall=1.0).resolved(tmp_path)
    metrics = Metrics()
    agent = Agent(
        config, metrics, console=None, notifier=Notifier(str(notify.path)),
        sources={"demo": BlockingSource("demo", release)},
    )
    server = OpsServer(metrics.registry, agent.monitor.report).start()
    thread = _run_in_thread(agent)
    try:
        ready = notify.wait_for("READY")
        time.sleep(4.0)
        late = notify.times("WATCHDOG", after=ready + 1.6)  # stall limit 1 s + one tick
        code, body = _http(f"http://127.0.0.1:{server.port}/healthz")
        metrics_text = _http(f"http://127.0.0.1:{server.port}/metrics")[1].decode()
    finally:
        release.set()
        agent.request_stop()
        thread.join(20)
        server.stop()
    assert late == [], "WATCHDOG=1 sent while the reader was stuck"
    report = json.loads(body)
    assert code == 503
    assert report["status"] == "red"
    src = report["components"]["source:demo"]
    assert src["state"] == "red" and "stalled" in src["reason"]
    assert 'edge_agent_stage_stalled{stage="source:demo"} 1.0' in metrics_text
    assert any("watchdog withheld" in f.get("STATUS", "") for _, f in notify.messages)


# -- /metrics: every name the dashboard and the rules use exists in a live agent ---------------

_NAME = re.compile(r"\b((?:edge_agent|process)_[a-z0-9_]+)")
_SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created", "_info")


def _names_used() -> dict[str, set[str]]:
    """Metric names in the dashboard's PromQL and anywhere in the rules (expressions and the
    metrics their descriptions point to)."""
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    return {
        "dashboard": {n for e in exprs for n in _NAME.findall(e)},
        "rules": set(_NAME.findall(RULES.read_text())),
    }


def _exposed(text: str) -> set[str]:
    """Sample names and metric family names (``# TYPE``) of a /metrics page."""
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            names.add(line.split()[2])
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def _exists(name: str, exposed: set[str]) -> bool:
    if name in exposed:
        return True
    for suffix in _SUFFIXES:
        if name.endswith(suffix) and name.removesuffix(suffix) in exposed:
            return True
    return False


def test_every_dashboard_and_rule_metric_exists_in_a_live_agent(tmp_path: Path) -> None:
    config = _config(tmp_path).resolved(tmp_path)
    metrics = Metrics()
    agent = Agent(config, metrics, console=None, notifier=Notifier(""))
    server = OpsServer(metrics.registry, agent.monitor.report).start()
    thread = _run_in_thread(agent)
    try:
        time.sleep(2.0)
        code, body = _http(f"http://127.0.0.1:{server.port}/metrics")
        hcode, hbody = _http(f"http://127.0.0.1:{server.port}/healthz")
    finally:
        agent.request_stop()
        thread.join(20)
        server.stop()
    assert code == 200
    exposed = _exposed(body.decode())
    used = _names_used()
    assert used["dashboard"] and used["rules"]
    for where, names in used.items():
        missing = sorted(n for n in names if not _exists(n, exposed))
        assert not missing, f"{where} uses metrics the agent does not export: {missing}"
    for required in ("edge_agent_watchdog_last_ok_timestamp_seconds",
                     "edge_agent_stage_progress_age_seconds", "process_resident_memory_bytes",
                     "edge_agent_outbox_depth", "edge_agent_model_info"):
        assert required in exposed
    assert hcode == 200  # calibrating = yellow, still 200
    assert json.loads(hbody)["status"] in {"green", "yellow"}


def test_promtool_accepts_the_rules() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("CI"):
            pytest.fail("promtool missing in CI (.ci/run installs the prometheus package)")
        pytest.skip("promtool not installed (apt-get install prometheus)")
    out = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True,
                         text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


# -- the real CLI process: READY, /healthz, status, SIGHUP, SIGTERM ----------------------------


def _write_config(path: Path, state: Path, port: int, *, broken: bool = False) -> None:
    text = (
        f'[agent]\nstate_dir = "{state}"\nconsole_alerts = false\nmetrics_port = {port}\n'
        '[[streams]]\nname = "demo"\n[streams.source]\nkind = "simulator"\nspeed = 50.0\n'
    )
    if broken:
        text += "[mqtt]\nhots = 1\n"
    path.write_text(text)


def test_cli_ready_status_reload_and_sigterm(tmp_path: Path, notify: NotifySocket) -> None:
    port = _free_port()
    cfg = tmp_path / "agent.toml"
    _write_config(cfg, tmp_path / "state", port)
    env = dict(os.environ, NOTIFY_SOCKET=str(notify.path), WATCHDOG_USEC="2000000")
    env.pop("WATCHDOG_PID", None)
    err = (tmp_path / "stderr.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent.cli", "run", "--config", str(cfg)],
        env=env, stdout=subprocess.DEVNULL, stderr=err,
    )
    status_cmd = [sys.executable, "-m", "agent.cli", "status", "--config", str(cfg)]
    try:
        notify.wait_for("READY", timeout=60)
        out = subprocess.run(status_cmd, capture_output=True, text=True, timeout=30, check=False)
        assert out.returncode in (0, 1), out.stdout + out.stderr  # green or calibrating
        assert f"edge-agent at http://127.0.0.1:{port}" in out.stdout
        assert "source:demo" in out.stdout

        # an invalid config on SIGHUP: refused, keeps running, no RELOADING
        _write_config(cfg, tmp_path / "state", port, broken=True)
        proc.send_signal(signal.SIGHUP)
        time.sleep(1.5)
        assert proc.poll() is None
        assert notify.first("RELOADING") is None
        # a valid one: RELOADING=1, then READY=1 again, same process
        _write_config(cfg, tmp_path / "state", port)
        proc.send_signal(signal.SIGHUP)
        reloading = notify.wait_for("RELOADING", timeout=30)
        deadline = time.monotonic() + 30
        while not notify.times("READY", after=reloading) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert notify.times("READY", after=reloading)
        assert proc.poll() is None

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        err.close()
    log = (tmp_path / "stderr.log").read_text()
    assert "reload refused" in log and "mqtt.hots" in log
    assert notify.first("STOPPING") is not None
    assert notify.times("WATCHDOG")
    gone = subprocess.run(status_cmd, capture_output=True, text=True, timeout=30, check=False)
    assert gone.returncode == 3  # unreachable once stopped
