"""Agent memory per stream kind: resident set size of ``edge-agent run`` with one sensor stream
and with N camera streams.

    python3 benchmarks/memory.py [--data ../shared/datasets] [--cameras 4] [--settle-s 10]
                                 [--max-wait-s 180] [--only sensor|cameras] [--workdir DIR]
                                 [--backend auto|onnxruntime|openvino|litert]

A benchmark, not a test: it prints figures and never asserts them. For each configuration it
starts the real agent as a subprocess (``python -m agent.cli run``, this tree's packages, MQTT
and fleet off, /metrics on a free loopback port), waits until every stream is scoring
(``edge_agent_windows_total`` / ``edge_agent_camera_frames_scored_total`` above 0 on /metrics),
then samples ``VmRSS`` of ``/proc/<pid>/status`` once a second until it is steady (the last
``--settle-s`` samples within 1 MB of each other, at most ``--max-wait-s``), and reads
``VmRSS`` and ``VmHWM`` (the peak, which includes model loading and backend auto-selection).
The agent is then stopped with SIGTERM; its exit status is printed.

Each configuration is started twice on one state directory: the **first start** times every
installed runtime to choose the backend (:mod:`agent.inference.select`), so every runtime's
libraries end up mapped in the process; the **restart** opens only the candidates the first
start ranked first (:mod:`agent.inference.choice_memory`), which is how a gateway runs after
its first start with a model.

Configurations (every installed runtime is a candidate of the auto-selection; ``--backend``
pins one runtime for every stream instead):

* ``sensor``: one stream, the shipped ``skab-wstat`` model, SKAB ``valve1/0.csv`` replayed in a
  loop at 50x (``<data>/skab``);
* ``cameras<N>``: N camera streams, the shipped ``mtd-patchcore`` model, each an image folder
  played like a camera at 30 fps in a loop (the ``*.jpg`` only): N - 1 of good tiles
  (``<data>/mtd/MT_Free/Imgs``) and one of tiles with blowholes (``<data>/mtd/MT_Blowhole/Imgs``),
  which raises alerts, so the agent also holds the heatmap model and the snapshots
  (:mod:`agent.services.snapshots`); its resident size is read after the first snapshot is stored
  (``edge_agent_snapshots_total`` above 0).

The last line is ``sensor_rss_mb=<x> sensor_hwm_mb=<y> sensor_first_rss_mb=<a>
sensor_first_hwm_mb=<b> cameras4_rss_mb=... cameras4_first_hwm_mb=... load=<l>`` (without
``first``: the restart; MB = 2^20 bytes; load = the 1-minute load average at the end).
Targets: at most 120 MB for one sensor stream, 250 MB with 4 cameras (VmRSS, steady).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from workspace import free_port, workspace  # noqa: E402

#: /metrics counters that show a stream is scoring, by stream kind.
SCORED = {"sensor": "edge_agent_windows_total", "camera": "edge_agent_camera_frames_scored_total"}


@dataclass(frozen=True)
class Memory:
    """What one configuration measured."""

    name: str
    rss_mb: float
    hwm_mb: float
    steady: bool
    seconds: float
    exit_code: int | None


def sensor_streams(data: Path, backend: str = "auto") -> str:
    csv = data / "skab" / "valve1" / "0.csv"
    if not csv.is_file():
        raise SystemExit(f"SKAB file not found: {csv} (pass --data, the dataset root)")
    return f"""
[[streams]]
name = "pump"
model = "builtin:skab-wstat"
backend = "{backend}"
[streams.source]
kind = "replay"
path = "{csv}"
speed = 50
loop = true
"""


def camera_streams(data: Path, n: int, backend: str = "auto") -> str:
    good = data / "mtd" / "MT_Free" / "Imgs"
    flawed = data / "mtd" / "MT_Blowhole" / "Imgs"
    for folder in (good, flawed):
        if not folder.is_dir():
            raise SystemExit(f"MTD folder not found: {folder} (pass --data, the dataset root)")
    return "".join(f"""
[[streams]]
name = "cam{i}"
model = "builtin:mtd-patchcore"
backend = "{backend}"
[streams.source]
kind = "camera"
folder = "{flawed if i == n - 1 else good}"
include = ["*.jpg"]
fps = 30
loop = true
""" for i in range(n))


def proc_status(pid: int) -> dict[str, float]:
    """``VmRSS`` and ``VmHWM`` of ``pid`` in MB (empty when the process is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    return {m[1]: int(m[2]) / 1024.0 for m in re.finditer(r"^(VmRSS|VmHWM):\s+(\d+) kB", text,
                                                           re.M)}


def metrics_text(port: int) -> str:
    """The agent's /metrics page ("" while it is not up)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            return str(resp.read().decode())
    except OSError:
        return ""


def scoring_streams(port: int, counter: str) -> dict[str, float]:
    """``counter`` per stream label from /metrics (empty while it is not up)."""
    text = metrics_text(port)
    found: dict[str, float] = {}
    for m in re.finditer(rf'^{counter}\{{([^}}]*)\}} ([0-9.e+]+)$', text, re.M):
        stream = re.search(r'stream="([^"]+)"', m[1])
        if stream:
            found[stream[1]] = found.get(stream[1], 0.0) + float(m[2])
    return found


def stream_backends(port: int) -> dict[str, str]:
    """The backend each stream scores with (``edge_agent_model_info`` on /metrics)."""
    text = metrics_text(port)
    found: dict[str, str] = {}
    for m in re.finditer(r'^edge_agent_model_info\{([^}]*)\} ', text, re.M):
        stream = re.search(r'stream="([^"]+)"', m[1])
        backend = re.search(r'backend="([^"]+)"', m[1])
        if stream and backend:
            found[stream[1]] = backend[1]
    return found


def measure(name: str, streams: str, kind: str, n: int, work: Path, settle_s: int,
            max_wait_s: float, run: str) -> Memory:
    """Run the agent with ``streams`` (in ``work/name``, its state kept) and measure it."""
    port = free_port()
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "agent.toml"
    config.write_text(f"""
[agent]
device_id = "bench-memory"
state_dir = "{folder / 'state'}"
console_alerts = false
metrics_port = {port}
[mqtt]
enabled = false
{streams}""")
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    log = folder / f"agent-{run.replace(' ', '-')}.stderr"
    with log.open("wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "agent.cli", "run", "--config",
                                 str(config)], stdout=subprocess.DEVNULL, stderr=err, env=env,
                                cwd=ROOT)
    t0 = time.monotonic()
    samples: list[float] = []
    steady = False
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"{name}: the agent exited ({proc.returncode}) before it was "
                                 f"steady; its log: {log}\n{log.read_text()[-2000:]}")
            scored = scoring_streams(port, SCORED[kind])
            snapshots = sum(scoring_streams(port, "edge_agent_snapshots_total").values())
            if (len(scored) >= n and all(v > 0 for v in scored.values())
                    and (kind != "camera" or snapshots > 0)):
                break
            if time.monotonic() - t0 > max_wait_s:
                raise SystemExit(f"{name}: no stream scoring (cameras: and no snapshot) after "
                                 f"{max_wait_s:g} s; log {log}")
            time.sleep(0.5)
        ready_s = time.monotonic() - t0
        while time.monotonic() - t0 < max_wait_s:
            time.sleep(1.0)
            samples.append(proc_status(proc.pid).get("VmRSS", 0.0))
            last = samples[-settle_s:]
            if len(last) == settle_s and max(last) - min(last) < 1.0:
                steady = True
                break
        mem = proc_status(proc.pid)
        seconds = time.monotonic() - t0
        backends = sorted(set(stream_backends(port).values()))
        print(f"{name}, {run}: scoring after {ready_s:.1f} s; VmRSS {mem.get('VmRSS', 0):.1f} MB, "
              f"VmHWM {mem.get('VmHWM', 0):.1f} MB ({'steady' if steady else 'not steady'} "
              f"after {seconds:.0f} s; backend {'/'.join(backends) or '?'})", flush=True)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
    print(f"{name}, {run}: agent stopped, exit status {proc.returncode}", flush=True)
    return Memory(name, mem.get("VmRSS", 0.0), mem.get("VmHWM", 0.0), steady, seconds,
                  proc.returncode)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "datasets",
                    help="the dataset root (skab/, mtd/)")
    ap.add_argument("--cameras", type=int, default=4, help="camera streams (4)")
    ap.add_argument("--settle-s", type=int, default=10,
                    help="samples (1 a second) within 1 MB that count as steady (10)")
    ap.add_argument("--max-wait-s", type=float, default=180.0,
                    help="longest wait per configuration, start-up included (180)")
    ap.add_argument("--only", choices=["sensor", "cameras"], help="measure one configuration")
    ap.add_argument("--backend", default="auto",
                    help="the streams' backend setting (auto: every installed runtime is timed)")
    ap.add_argument("--workdir", type=Path, help="keep configs, stores and logs here")
    args = ap.parse_args(argv)
    cams = f"cameras{args.cameras}"
    configs = [("sensor", sensor_streams(args.data, args.backend), "sensor", 1),
               (cams, camera_streams(args.data, args.cameras, args.backend), "camera",
                args.cameras)]
    if args.only is not None:
        configs = [c for c in configs if c[2] == args.only.rstrip("s")]
    results: list[Memory] = []
    figures: list[str] = []
    with workspace(args.workdir, "bench-memory-") as work:
        for name, streams, kind, n in configs:
            first = measure(name, streams, kind, n, work, args.settle_s, args.max_wait_s,
                            "first start")
            again = measure(name, streams, kind, n, work, args.settle_s, args.max_wait_s,
                            "restart")
            results += [first, again]
            figures += [f"{name}_rss_mb={again.rss_mb:.1f}", f"{name}_hwm_mb={again.hwm_mb:.1f}",
                        f"{name}_first_rss_mb={first.rss_mb:.1f}",
                        f"{name}_first_hwm_mb={first.hwm_mb:.1f}"]
    print(" ".join(figures) + f" load={os.getloadavg()[0]:.2f}")
    return 0 if all(m.exit_code == 0 for m in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
