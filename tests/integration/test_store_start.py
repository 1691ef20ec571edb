"""Starting the real CLI on a store in trouble: a full disk (a real 2 MiB tmpfs) and a corrupt
file, with a real mosquitto.

Full disk: whatever the state of the store (cleanly closed with its reserve file, absent, or
corrupt), starting on a full disk exited 1 every time, so under systemd the agent restart-looped
into a failed state and sent no alert although the broker was up. Now it starts, alerts go over
MQTT from memory, and the store opens once space returns. Corrupt store: quarantined, and
``/healthz`` shows the store yellow (it stayed green).
"""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
from pathlib import Path

import pytest

from tests.conftest import MosquittoBroker, _free_port
from tests.integration.test_agent_e2e import (
    ALERTS,
    AgentProcess,
    Subscriber,
    wait_until,
)
from tests.integration.test_store_pressure import (  # noqa: F401 - tiny_state: a fixture
    healthz,
    tiny_state,
    write_config,
)

pytestmark = pytest.mark.integration


def fill(path: Path) -> None:
    """Fill the file system holding ``path`` (one file of zeros up to ENOSPC)."""
    subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=4096"], check=False,
                   capture_output=True)
    st = os.statvfs(path.parent)
    assert st.f_bavail * st.f_frsize < 64 * 1024, "the file system is not full"


def stored_alerts(db: Path) -> int:
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=2)
        try:
            return int(conn.execute("SELECT COUNT(*) FROM alerts").fetchone()[0])
        finally:
            conn.close()
    except sqlite3.Error:
        return 0


def raised(agent: AgentProcess) -> int:
    return len(re.findall(r"^ALERT \S+ ", agent.stdout(), flags=re.M))


@pytest.mark.parametrize("store_state", ["closed", "absent", "corrupt"])
def test_start_on_a_full_disk_alerts_from_memory_and_recovers(
    tmp_path: Path, tiny_state: Path, mosquitto: MosquittoBroker,  # noqa: F811
    store_state: str,
) -> None:
    sub = Subscriber(mosquitto, [ALERTS])
    config = write_config(tmp_path, mosquitto.port, _free_port(), speed=500)
    db = tiny_state / "agent.db"
    if store_state != "absent":  # a clean run first: the store, its reserve and id ledger
        (tmp_path / "first").mkdir()
        first = AgentProcess(["run", "--config", str(config)], tmp_path / "first")
        try:
            wait_until(lambda: len(sub.alert_ids()) >= 2, 60, "alerts of the first run",
                       first.stderr)
            first.terminate()
            assert first.wait(30) == 0, first.stderr()[-3000:]
        finally:
            first.kill()
        assert (tiny_state / "agent.db-reserve").exists()
        if store_state == "corrupt":
            db.write_bytes(b"not a database " * 1000)
            for suffix in ("-wal", "-shm"):
                Path(f"{db}{suffix}").unlink(missing_ok=True)
    before = set(sub.alert_ids())
    ballast = tiny_state / "ballast"
    fill(ballast)
    agent = AgentProcess(["run", "--config", str(config)], tmp_path)
    try:
        wait_until(lambda: len(set(sub.alert_ids()) - before) >= 2 or agent.proc.poll() is not None,
                   90, "alerts on a full disk", agent.stderr)
        assert agent.proc.poll() is None, agent.stderr()[-3000:]
        ballast.unlink()
        seen = raised(agent)
        wait_until(lambda: stored_alerts(db) > 0 and raised(agent) > seen, 90,
                   "alerts stored once space returned", agent.stderr)
        wait_until(lambda: set(sub.alert_ids()) >= set(re.findall(
            r"^ALERT (\S+) ", agent.stdout(), flags=re.M)), 30, "every raised alert delivered",
            agent.stderr)
        assert agent.proc.poll() is None, agent.stderr()[-3000:]
        agent.terminate()
        assert agent.wait(30) == 0, agent.stderr()[-3000:]
    finally:
        agent.kill()
        ballast.unlink(missing_ok=True)
    ids = sub.alert_ids()
    payload_ids = [a["alert_id"] for a in sub.alerts()]
    assert len(set(payload_ids)) == len(set(ids))
    # every alert id names one alert only: no id was issued twice for different alerts
    by_id: dict[str, set[str]] = {}
    for a in sub.alerts():
        by_id.setdefault(a["alert_id"], set()).add(a["raised_at"])
    assert all(len(v) == 1 for v in by_id.values()), {k: v for k, v in by_id.items() if len(v) > 1}


def test_quarantined_store_turns_healthz_yellow(tmp_path: Path) -> None:
    port = _free_port()
    config = tmp_path / "agent.toml"
    config.write_text(
        f'[agent]\ndevice_id = "gw-test"\nstate_dir = "state"\nmetrics_port = {port}\n\n'
        f'[[streams]]\nname = "s1"\nmodel = "builtin:skab-wstat"\n\n'
        f'[streams.source]\nkind = "simulator"\nspeed = 50\nduration_s = 400000\n'
    )
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "agent.db").write_bytes(b"not a database " * 1000)
    agent = AgentProcess(["run", "--config", str(config)], tmp_path)
    try:
        def store_component() -> dict[str, object]:
            comps = healthz(port).get("components") or {}
            assert isinstance(comps, dict)
            comp = comps.get("store") or {}
            assert isinstance(comp, dict)
            return comp

        wait_until(lambda: bool(store_component()), 60, "/healthz", agent.stderr)
        wait_until(lambda: store_component().get("state") == "yellow", 10,
                   "the store yellow", lambda: f"{store_component()}\n{agent.stderr()[-2000:]}")
        assert "corrupt" in str(store_component().get("reason"))
    finally:
        agent.kill()


def test_stop_while_the_store_is_still_unopened(
    tmp_path: Path, tiny_state: Path, mosquitto: MosquittoBroker,  # noqa: F811
) -> None:
    """SIGTERM while the disk is still full and the store was never opened: a clean stop
    (exit 0) whose last line says what was delivered from memory."""
    sub = Subscriber(mosquitto, [ALERTS])
    config = write_config(tmp_path, mosquitto.port, _free_port(), speed=500)
    fill(tiny_state / "ballast")
    agent = AgentProcess(["run", "--config", str(config)], tmp_path)
    try:
        wait_until(lambda: len(sub.alert_ids()) >= 2 or agent.proc.poll() is not None, 90,
                   "alerts on a full disk", agent.stderr)
        assert agent.proc.poll() is None, agent.stderr()[-3000:]
        agent.terminate()
        assert agent.wait(30) == 0, agent.stderr()[-3000:]
    finally:
        agent.kill()
    last = [line for line in agent.stderr().splitlines() if "stopped:" in line]
    m = re.search(r"\((\d+) not stored: (\d+) delivered over MQTT from memory, (\d+) lost\)",
                  last[-1] if last else "")
    assert m is not None, agent.stderr()[-3000:]
    assert int(m[2]) >= 2 and int(m[2]) + int(m[3]) == int(m[1]), last[-1]
    assert "Traceback" not in agent.stderr(), agent.stderr()[-3000:]
