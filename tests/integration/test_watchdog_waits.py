"""The systemd watchdog and sources that wait by design, against the real ``edge-agent`` process.

A replay paced in real time waits out a gap in its recording; that silence is no stall, so the
WATCHDOG=1 pings go on (a withheld watchdog would make systemd kill a healthy agent and restart
it into the same gap). Likewise a Modbus source polled every 40 s and an MQTT-in topic on which
nothing is published (a real pymodbus server and a real mosquitto): live sources that are quiet
by design. A reader that is really stuck still stops them:
``tests/integration/test_ops.py::test_no_watchdog_while_a_reader_is_stuck``.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from agent.sources.modbus_sim import SimServer, serve_csv
from tests.conftest import MosquittoBroker, _free_port
from tests.integration.test_agent_e2e import skab_dir
from tests.integration.test_ops import NotifySocket, notify  # noqa: F401 - the fixture

pytestmark = pytest.mark.integration

#: Rows before and after the gap, the gap (recorded seconds) and the replay speed: the gap takes
#: 10 s of wall time, three times the stall limit below.
BEFORE, AFTER, GAP_S, SPEED, STALL_S = 40, 20, 40, 4.0, 3.0


def gap_recording(path: Path) -> Path:
    """SKAB valve1/0.csv's first rows with a GAP_S hole in their timestamps."""
    lines = (skab_dir() / "valve1" / "0.csv").read_text().splitlines()
    header, rows = lines[0], lines[1 : 1 + BEFORE + AFTER]
    out = [header]
    for i, row in enumerate(rows):
        t = 1_600_000_000 + i + (GAP_S if i >= BEFORE else 0)
        out.append(";".join([f"{t}", *row.split(";")[1:]]))
    path.write_text("\n".join(out) + "\n")
    return path


def test_replay_waiting_on_a_gap_keeps_the_watchdog_fed(
    tmp_path: Path, notify: NotifySocket  # noqa: F811 - the fixture
) -> None:
    data = gap_recording(tmp_path / "gap.csv")
    cfg = tmp_path / "agent.toml"
    cfg.write_text(
        f'[agent]\nstate_dir = "{tmp_path / "state"}"\nconsole_alerts = false\n'
        f'[[streams]]\nname = "s1"\nstall_after_s = {STALL_S}\n'
        f'[streams.source]\nkind = "replay"\npath = "{data}"\nspeed = {SPEED}\n'
        'time_format = "epoch_s"\n'
    )
    env = dict(os.environ, NOTIFY_SOCKET=str(notify.path), WATCHDOG_USEC="2000000")
    env.pop("WATCHDOG_PID", None)
    with (tmp_path / "stderr.log").open("w") as err:
        proc = subprocess.run(
            [sys.executable, "-m", "agent.cli", "run", "--config", str(cfg)],
            env=env, stdout=subprocess.DEVNULL, stderr=err, timeout=120, check=False,
        )
    log = (tmp_path / "stderr.log").read_text()
    assert proc.returncode == 0, log[-3000:]
    assert "every source is exhausted" in log
    statuses = [f["STATUS"] for _, f in notify.messages if "STATUS" in f]
    assert not [s for s in statuses if "watchdog withheld" in s], statuses
    assert "watchdog withheld" not in log
    ready = notify.wait_for("READY")
    stopping = notify.wait_for("STOPPING")
    pings = [ready, *notify.times("WATCHDOG", after=ready), stopping]
    gaps = [b - a for a, b in itertools.pairwise(pings)]
    # one ping a second (WATCHDOG_USEC / 2); the gap lasts 10 s, the stall limit is 3 s
    assert max(gaps) < GAP_S / SPEED / 2, gaps


#: The shipped model's channels (SKAB), in order.
CHANNELS = ["Accelerometer1RMS", "Accelerometer2RMS", "Current", "Pressure", "Temperature",
            "Thermocouple", "Voltage", "Volume Flow RateRMS"]
#: Modbus poll interval and how long the watchdog is watched after READY: both past the 30 s a
#: paced source may be silent before it counts as stuck (agent.health.MIN_STALL_S).
POLL_S, WATCH_S = 40.0, 36.0


def test_a_slow_modbus_poll_and_a_quiet_mqtt_topic_keep_the_watchdog_fed(
    tmp_path: Path, notify: NotifySocket, mosquitto: MosquittoBroker,  # noqa: F811
) -> None:
    port = _free_port()
    server = SimServer(port).start()
    stop = threading.Event()
    feeder = threading.Thread(
        target=serve_csv, args=(server, str(skab_dir() / "valve1" / "0.csv")),
        kwargs={"speed": 1.0, "loop": True, "stop": stop}, daemon=True)
    feeder.start()
    registers = ", ".join(f'{{ name = "{c}", address = {2 * i}, type = "float32" }}'
                          for i, c in enumerate(CHANNELS))
    fields = "\n".join(f'"{c}" = "f{i}"' for i, c in enumerate(CHANNELS))
    cfg = tmp_path / "agent.toml"
    cfg.write_text(
        f'[agent]\nstate_dir = "{tmp_path / "state"}"\nconsole_alerts = false\n'
        '[mqtt]\nenabled = false\n'
        '[[streams]]\nname = "plc"\n'
        f'[streams.source]\nkind = "modbus"\ntransport = "tcp"\nhost = "127.0.0.1"\n'
        f'port = {port}\npoll_interval_s = {POLL_S}\nchannels = [{registers}]\n'
        '[[streams]]\nname = "topic"\n'
        f'[streams.source]\nkind = "mqtt"\nhost = "127.0.0.1"\nport = {mosquitto.port}\n'
        'format = "json"\nclean_session = true\ntopics = ["plant/quiet/telemetry"]\n'
        f'[streams.source.fields]\n{fields}\n'
    )
    env = dict(os.environ, NOTIFY_SOCKET=str(notify.path), WATCHDOG_USEC="2000000")
    env.pop("WATCHDOG_PID", None)
    try:
        with (tmp_path / "stderr.log").open("w") as err:
            proc = subprocess.Popen([sys.executable, "-m", "agent.cli", "run", "--config",
                                     str(cfg)], env=env, stdout=subprocess.DEVNULL, stderr=err)
        try:
            ready = notify.wait_for("READY", timeout=60)
            time.sleep(WATCH_S)
            assert proc.poll() is None, (tmp_path / "stderr.log").read_text()[-3000:]
            watched = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    finally:
        stop.set()
        feeder.join(10.0)
        server.stop()
    log = (tmp_path / "stderr.log").read_text()
    assert "stream plc: source modbus" in log and "stream topic: source mqtt" in log, log[-3000:]
    statuses = [f["STATUS"] for _, f in notify.messages if "STATUS" in f]
    assert not [s for s in statuses if "watchdog withheld" in s], statuses
    assert "watchdog withheld" not in log
    pings = [ready, *notify.times("WATCHDOG", after=ready)]
    pings = [t for t in pings if t <= watched] + [watched]
    gaps = [b - a for a, b in itertools.pairwise(pings)]
    # one ping a second (WATCHDOG_USEC / 2) for the whole watch, past the 30 s of silence
    assert max(gaps) < 5.0, gaps
