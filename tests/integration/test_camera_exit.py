"""The agent never ends with the C++ runtime's abort (SIGABRT, exit 134).

A frame grabber left inside OpenCV's ``VideoCapture.read()`` when the interpreter exits is
ended by CPython with ``pthread_exit()`` as it takes the GIL back, and the C++ runtime aborts
(``terminate called without an active exception`` or ``FATAL: exception not rethrown``). These
tests run real captures on generated inputs: large MJPG frames (tens of ms to decode, so a
grabber is inside ``read()`` most of the time) and an image folder.

* the camera path as benchmarks/camera.py uses it, in a subprocess that exits right after the
  source stops: without the grabber join every run aborted;
* the same in this process: no grabber thread outlives :meth:`CameraSource.run`;
* ``edge-agent run`` with two camera streams on the shipped image model (real runtime,
  auto-selected backend), stopped by SIGTERM, and ending by itself at the end of its inputs:
  exit status 0, nothing of the abort on stderr.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from agent.sources.camera import CameraConfig, CameraSource
from tests.integration.fleet_peer import free_port

cv2 = pytest.importorskip("cv2")

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
#: What the C++ runtime prints when it aborts under a forced unwind.
ABORT_LINES = ("terminate called", "exception not rethrown")
#: Model load and backend auto-selection on a loaded 2-core machine.
START_S = 240.0


def make_video(path: Path, size: int, frames: int) -> Path:
    """An MJPG ``.avi`` of ``frames`` noisy ``size`` x ``size`` frames (slow to decode)."""
    rng = np.random.default_rng(7)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 30.0, (size, size))
    base = rng.integers(0, 255, (size, size, 3), np.uint8)
    for i in range(frames):
        img = base.copy()
        cv2.putText(img, str(i), (10, size // 2), cv2.FONT_HERSHEY_SIMPLEX, 2, (255, 255, 255), 3)
        writer.write(img)
    writer.release()
    return path


@pytest.fixture(scope="module")
def big_video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_video(tmp_path_factory.mktemp("video") / "big.avi", 1600, 12)


def env_for_tree() -> dict[str, str]:
    """The environment of a subprocess that imports this tree's packages."""
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def assert_clean_exit(code: int, stderr: str) -> None:
    aborts = [line for line in stderr.splitlines() if any(a in line for a in ABORT_LINES)]
    assert code == 0 and not aborts, f"exit status {code}, abort lines {aborts}\n{stderr[-3000:]}"


EXIT_RIGHT_AFTER_STOP = """
import sys, threading, time
from agent.sources.camera import CameraConfig, CameraSource
src = CameraSource(CameraConfig(path=sys.argv[1], loop=True), "cam", image_size=(64, 64))
stop = threading.Event()
run = threading.Thread(target=src.run, args=(lambda f: None, lambda e: None, stop))
run.start()
deadline = time.monotonic() + 60
while src.emitted < 3 and time.monotonic() < deadline:
    time.sleep(0.01)
stop.set()
run.join()
print("emitted", src.emitted, flush=True)
"""


def test_process_exiting_right_after_the_camera_stops_does_not_abort(big_video: Path) -> None:
    for _ in range(3):  # without the join: every run aborted (exit 134)
        done = subprocess.run([sys.executable, "-c", EXIT_RIGHT_AFTER_STOP, str(big_video)],
                              check=False, capture_output=True, text=True,
                              env=env_for_tree(), timeout=120, cwd=REPO)
        assert_clean_exit(done.returncode, done.stderr)
        assert done.stdout.startswith("emitted ")


def test_no_grabber_outlives_run(big_video: Path) -> None:
    before = set(threading.enumerate())
    src = CameraSource(CameraConfig(path=str(big_video), loop=True), "cam", image_size=(64, 64))
    stop = threading.Event()
    run = threading.Thread(target=src.run, args=(lambda f: None, lambda e: None, stop))
    run.start()
    deadline = time.monotonic() + 60
    while src.emitted < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    run.join(30)
    left = [t.name for t in set(threading.enumerate()) - before if t.is_alive()]
    assert not left, f"threads still running after run() returned: {left}"
    assert src.close(0.0)  # nothing left to join


def agent_config(tmp_path: Path, inputs: list[str], port: int) -> Path:
    streams = "".join(f"""
[[streams]]
name = "cam{i}"
model = "builtin:mtd-patchcore"
[streams.source]
kind = "camera"
{line}
""" for i, line in enumerate(inputs))
    config = tmp_path / "agent.toml"
    config.write_text(f"""
[agent]
device_id = "gw1"
state_dir = "{tmp_path / 'state'}"
console_alerts = false
metrics_port = {port}
[mqtt]
enabled = false
{streams}""")
    return config


def scored(port: int) -> dict[str, float]:
    """``edge_agent_camera_frames_scored_total`` per stream from /metrics (empty if down)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    pattern = r'^edge_agent_camera_frames_scored_total\{stream="([^"]+)"\} ([0-9.e+]+)$'
    return {m[1]: float(m[2]) for m in re.finditer(pattern, text, re.M)}


def run_agent(tmp_path: Path, config: Path) -> subprocess.Popen[bytes]:
    err = (tmp_path / "agent.stderr").open("wb")
    try:
        return subprocess.Popen([sys.executable, "-m", "agent.cli", "run", "--config",
                                 str(config)], stdout=subprocess.DEVNULL, stderr=err,
                                env=env_for_tree(), cwd=REPO)
    finally:
        err.close()


def test_agent_stopped_by_sigterm_while_grabbers_read_exits_0(tmp_path: Path,
                                                                big_video: Path) -> None:
    folder = tmp_path / "frames"
    folder.mkdir()
    for i in range(3):
        cv2.imwrite(str(folder / f"{i}.png"), np.full((480, 640), 90 + i, np.uint8))
    port = free_port()
    config = agent_config(tmp_path, [f'path = "{big_video}"\nloop = true',
                                     f'folder = "{folder}"\nloop = true\nfps = 20'], port)
    proc = run_agent(tmp_path, config)
    try:
        deadline = time.monotonic() + START_S
        while not (len(s := scored(port)) == 2 and all(v >= 3 for v in s.values())):
            assert proc.poll() is None, (tmp_path / "agent.stderr").read_text()[-3000:]
            assert time.monotonic() < deadline, "no frames scored on both cameras"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    log = (tmp_path / "agent.stderr").read_text(errors="replace")
    assert_clean_exit(code, log)
    assert "still running at shutdown" not in log


def test_agent_at_end_of_its_camera_inputs_exits_0(tmp_path: Path) -> None:
    video = make_video(tmp_path / "short.avi", 1600, 6)
    folder = tmp_path / "frames"
    folder.mkdir()
    for i in range(4):
        cv2.imwrite(str(folder / f"{i}.png"), np.full((480, 640), 90 + i, np.uint8))
    config = agent_config(tmp_path, [f'path = "{video}"', f'folder = "{folder}"'], free_port())
    proc = run_agent(tmp_path, config)
    try:
        code = proc.wait(START_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    log = (tmp_path / "agent.stderr").read_text(errors="replace")
    assert_clean_exit(code, log)
    assert "input ended after 6 frames" in log and "input ended after 4 frames" in log
