"""SKAB through the closed model loop: device calibration → fleet retraining → device update.

    python benchmarks/skab_loop.py --data ../shared/datasets/skab [--limit N] [--keep DIR]
        [--port N] [--workdir DIR]

``--keep``/``--workdir`` (the same) keep the fleet's and agents' state there; without them it is
a temporary folder removed at the end, also after an error.

What runs (all real code, real processes where the product has them):

1. A real ``edge-fleet serve --auto-retrain`` subprocess, which enqueues retraining jobs, and a
   real ``edge-fleet worker`` that runs them (SQLite file in a temp dir; a signing key and the
   trusted-keys directory generated here with :func:`cloud_sync.package.generate_keypair`).
2. For each labelled SKAB file: ``edge-fleet device add`` enrolls a device; a real
   :class:`agent.app.Agent` (fleet upload, ``[samples]`` and ``[updater]`` enabled, pinned to the
   generated public key) replays the file as that device through :class:`agent.sources.replay.
   ReplaySource` at speed 0. Its first 400 rows are the stream's calibration; the agent uploads
   them as ``kind="calibration"`` samples (``POST /v1/samples``); the fleet retrains that
   device's INT8 model (quantized on those rows, calibration fitted in the cloud), gates, signs,
   publishes and rolls it out to that device; the agent's updater polls, downloads, verifies
   (signature, hashes, anti-rollback), accepts (golden vectors, latency), shadows and swaps.
   The replay is held after row 400 until the fleet reports the device in ``shadow``, then
   trickles rows (so the pipeline thread, which swaps between blocks, sees blocks) until the
   device reports ``active`` (or a refusal), then runs free to the end of the file.
3. Scoring, exactly like ``benchmarks/skab.py``: every row after 400, scored by the window ending
   at that row, with the package the agent ended up running on that stream and its calibration
   (the cloud-fitted one the package carries; a device the gate refused keeps the shipped model
   and calibrates on its first 400 rows, as the agent does). Rows the agent scored during the
   shadow period (old model) are scored with the activated model here, so each file's figures
   are those of the model the loop delivered. All files pooled: F1 = TP/(TP+(FP+FN)/2),
   FAR % = FP/(FP+TN)·100, MAR % = FN/(FN+TP)·100 (Katser & Kozitsin, SKAB, 2020).

Before the figures it prints the fleet's gate verdict per device: ``published``, or ``gated``
with the retrained and the base model's false-alarm rates on that device's held-out windows
(the calibration tail: the last 25 % of its 400 rows, held out of quantization and threshold
fitting; :func:`fleet.training.train.train_wstat`, step 5).

The last line is ``F1=<0..1> FAR=<percent> MAR=<percent>``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "models" / "recipes"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from skab import confusion, rates, read_file  # noqa: E402
from skab_data import labelled_files  # noqa: E402
from workspace import add_arguments, pick_port, workspace  # noqa: E402

from agent.app import Agent  # noqa: E402
from agent.config.loader import parse_config  # noqa: E402
from agent.inference.package import load_package, open_backend  # noqa: E402
from agent.metrics import Metrics  # noqa: E402
from agent.pipeline.detector import FeatureDeviationDetector  # noqa: E402
from agent.pipeline.rules import RuleParams  # noqa: E402
from agent.pipeline.stream import StreamPipeline  # noqa: E402
from agent.records import Reading  # noqa: E402
from agent.sources.replay import ReplayConfig, ReplaySource  # noqa: E402
from agent.systemd import Notifier  # noqa: E402
from cloud_sync.package import generate_keypair  # noqa: E402

SHIPPED = ROOT / "models" / "skab-wstat"
CAL_ROWS = 400
STREAM = "pump"
FLEET = [sys.executable, "-m", "fleet.cli"]
FINAL = ("active", "rejected", "rolled_back")


class GatedReplay:
    """ReplaySource that holds after ``hold_after`` rows until told to trickle or run free."""

    def __init__(self, path: Path, hold_after: int) -> None:
        self._inner = ReplaySource(ReplayConfig(path=str(path), speed=0.0), stream=STREAM)
        self.stream, self.channels = STREAM, self._inner.channels
        self.hold_after = hold_after
        self.mode = "hold"  # hold | trickle | free
        self.emitted = 0

    def run(self, emit: Any, reject: Any, stop: threading.Event) -> None:
        def gated(reading: Reading) -> None:
            if self.emitted >= self.hold_after:
                while self.mode == "hold" and not stop.is_set():
                    time.sleep(0.01)
                if self.mode == "trickle":
                    time.sleep(0.02)
            emit(reading)
            self.emitted += 1

        self._inner.run(gated, reject, stop)


def _device_state(url: str, admin: str, device: str) -> tuple[int | None, str | None]:
    """(version, last reported state) of the newest rollout targeting ``device``."""
    h = {"Authorization": f"Bearer {admin}"}
    ros = requests.get(f"{url}/v1/rollouts", headers=h, timeout=10).json()["rollouts"]
    mine = [r for r in ros if device in r["target_devices"]]
    if not mine:
        return None, None
    ro = requests.get(f"{url}/v1/rollouts/{mine[-1]['id']}", headers=h, timeout=10).json()
    states = [d["state"] for d in ro["devices"] if d["device_id"] == device]
    return int(ro["version"]), (states[0] if states else None)


def _agent_config(tmp: Path, device: str, url: str, token_file: Path, keys: Path) -> str:
    return "\n".join([
        "[agent]", f'device_id = "{device}"', f'state_dir = "{tmp / device}"',
        "console_alerts = false", 'log_level = "WARNING"',
        "[[streams]]", f'name = "{STREAM}"', f'model = "{SHIPPED}"',
        "[streams.source]", 'kind = "replay"', 'path = "unused.csv"', "speed = 0",
        "[fleet]", "enabled = true", f'url = "{url}"', f'token_file = "{token_file}"',
        "interval_s = 1.0",
        "[updater]", "enabled = true", "poll_interval_s = 0.3", f'trusted_keys_dir = "{keys}"',
        "shadow_windows = 30",
        "[samples]", "enabled = true", "reservoir_size = 200", "upload_interval_s = 3600",
    ]) + "\n"


def run_device(path: Path, tmp: Path, url: str, admin: str, keys: Path, i: int,
               timeout_s: float) -> tuple[Path, str]:
    """Replay ``path`` as a new device through the loop; returns (package in force, outcome)."""
    device = f"skab{i:02d}"
    token = subprocess.run([*FLEET, "device", "add", device, "--db", f"sqlite:///{tmp}/fleet.db"],
                           check=True, capture_output=True, text=True).stdout.strip()
    token_file = tmp / f"{device}.token"
    token_file.write_text(token + "\n")
    config = parse_config(_agent_config(tmp, device, url, token_file, keys), env={})
    source = GatedReplay(path, CAL_ROWS)
    agent = Agent(config.resolved(tmp), Metrics(), console=None, notifier=Notifier(""),
                  sources={STREAM: source})
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    deadline, outcome = time.monotonic() + timeout_s, "no model published (gate or timeout)"
    while time.monotonic() < deadline and thread.is_alive():
        _, state = _device_state(url, admin, device)
        if state == "shadow" and source.mode == "hold":
            source.mode = "trickle"
        if state in FINAL:
            outcome = state
            break
        time.sleep(0.1)
    source.mode = "free"
    thread.join(600)
    _, state = _device_state(url, admin, device)  # the post-swap watch may roll back
    if state is not None:
        outcome = state
    return agent.streams[STREAM].package.path, outcome


def predict(readings: list[Reading], package_dir: Path) -> np.ndarray:
    """Row predictions after row 400 with ``package_dir`` (its preset calibration if any)."""
    package = load_package(package_dir)
    spec = package.detector_spec()
    pipe = StreamPipeline("bench", "bench", spec,
                          FeatureDeviationDetector(spec, open_backend(package, "int8"),
                                                   adaptation=package.adaptation()),
                          RuleParams(), calibration=package.preset_calibration())
    values = np.stack([r.values for r in readings])
    out = pipe.process_block(values, np.array([r.ts for r in readings]))
    pred = np.zeros(len(readings) - CAL_ROWS, dtype=np.int8)
    scored = out.end_index >= CAL_ROWS
    pred[out.end_index[scored] - CAL_ROWS] = (out.scores[scored] > out.threshold)
    return pred


_GATE = re.compile(r"retrain \S+: (?:published \S+@\d+|\S+@\d+ not published \(gated)")


def gate_lines(log: str) -> list[str]:
    """The fleet's retraining verdicts in its log, one per retraining: ``retrain <device>/
    <stream>: published <name>@<version> (...)`` or ``retrain <device>/<stream>:
    <name>@<version> not published (gated; held-out false-alarm rate retrained X %, base Y %
    (...)): <reasons>``."""
    return [ln[ln.find("retrain "):].strip() for ln in log.splitlines() if _GATE.search(ln)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="SKAB through the closed model loop")
    ap.add_argument("--data", type=Path, required=True, help="SKAB root directory")
    ap.add_argument("--limit", type=int, help="only the first N labelled files")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per device update")
    ap.add_argument("--keep", type=Path, help="keep the fleet/agent state here")
    add_arguments(ap, port_help="port of the edge-fleet serve peer (default: a free one)")
    args = ap.parse_args(argv)
    files = labelled_files(args.data)[: args.limit]
    if not files:
        raise SystemExit(f"no labelled SKAB files under {args.data}")
    with workspace(args.keep or args.workdir, "skab-loop-") as tmp:
        keys = tmp / "keys"
        signing, _ = generate_keypair(keys, "fleet")
        admin = "admin-" + os.urandom(16).hex()
        (tmp / "admin.token").write_text(admin + "\n")
        port = pick_port(args.port)
        url = f"http://127.0.0.1:{port}"
        log = (tmp / "fleet.log").open("w")
        fleet = subprocess.Popen(
            [*FLEET, "serve", "--db", f"sqlite:///{tmp}/fleet.db", "--port", str(port),
             "--state-dir", str(tmp / "fleet-state"), "--admin-token-file",
             str(tmp / "admin.token"), "--trusted-keys", str(keys), "--signing-key",
             str(signing), "--auto-retrain"],
            stdout=log, stderr=subprocess.STDOUT,
        )
        worker: subprocess.Popen[bytes] | None = None
        try:
            up_by = time.monotonic() + 120.0  # a loaded 2-core machine took over 20 s
            while True:
                with contextlib.suppress(requests.RequestException):
                    if requests.get(f"{url}/healthz", timeout=1).status_code == 200:
                        break
                if time.monotonic() > up_by or fleet.poll() is not None:
                    raise SystemExit(f"edge-fleet did not come up; see {tmp / 'fleet.log'}")
                time.sleep(0.1)
            # only now: serve has created the database, which the worker refuses to create
            worker = subprocess.Popen(
                [*FLEET, "worker", "--db", f"sqlite:///{tmp}/fleet.db", "--state-dir",
                 str(tmp / "fleet-state"), "--trusted-keys", str(keys), "--signing-key",
                 str(signing), "--base-model", str(SHIPPED), "--poll", "0.5"],
                stdout=log, stderr=subprocess.STDOUT,
            )
            t0 = time.perf_counter()
            totals = np.zeros(4, dtype=np.int64)
            delivered = 0
            print(f"{len(files)} files; fleet {url} (auto-retrain); calibration = first "
                  f"{CAL_ROWS} rows of each")
            print(f"{'file':<22}{'rows':>6}  {'model':<16}{'outcome':<40}{'F1':>6}{'FAR':>7}"
                  f"{'MAR':>7}")
            for i, path in enumerate(files):
                readings, _channels, labels = read_file(path)
                pkg_dir, outcome = run_device(path, tmp, url, admin, keys, i, args.timeout)
                pkg = load_package(pkg_dir)
                delivered += pkg.manifest.calibration is not None
                c = confusion(predict(readings, pkg_dir), labels[CAL_ROWS:])
                totals += c
                f1, far, mar = rates(*c)
                print(f"{path.relative_to(args.data)!s:<22}{len(readings):>6}  "
                      f"{pkg.label:<16}{outcome[:39]:<40}{f1:>6.3f}{far:>7.2f}{mar:>7.2f}",
                      flush=True)
        finally:
            if worker is not None:
                worker.terminate()
                worker.wait(30)
            fleet.terminate()
            fleet.wait(30)
            log.close()
        gate = gate_lines((tmp / "fleet.log").read_text())
        for line in gate:
            print(f"fleet: {line}")
        gated = sum("gated" in line for line in gate)
        f1, far, mar = rates(*(int(v) for v in totals))
        print(f"\n{delivered} of {len(files)} devices run a model retrained for them; gate: "
              f"{len(gate) - gated} published, {gated} gated (a retrained model is published "
              f"only if not worse than the base on the device's held-out windows); "
              f"{time.perf_counter() - t0:.1f} s")
        print(f"{'pooled':<26}{'F1':>6}{'FAR %':>8}{'MAR %':>8}")
        print(f"{'closed loop, INT8':<26}{f1:>6.3f}{far:>8.2f}{mar:>8.2f}")
        print(f"F1={f1:.3f} FAR={far:.2f} MAR={mar:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
